"""Per-request sampling settings, checked once when the request arrives."""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_LOGPROBS = 20  # top alternatives per position, as OpenAI's API bounds them
SEED_RANGE = (-(2**63), 2**64)  # what torch.Generator.manual_seed accepts
TOKEN_ID_LIMIT = 2**31  # token ids beyond any vocabulary (and beyond int32) are refused up front
MAX_STOP_TOKEN_IDS = 64
MAX_LOGIT_BIAS = 300  # entries per request, as OpenAI bounds them


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class SamplingParams:
    """How to pick the next token and when to stop. ``temperature == 0`` is greedy; ``top_k <= 0`` and
    ``top_p == 1`` disable those filters; ``seed`` gives the request its own ``torch.Generator``.
    ``max_tokens == 0`` (allowed with ``prompt_logprobs``) only prefills the prompt. ``logprobs``: the sampled
    token's logprob plus that many top alternatives (0..20) per generated token; ``prompt_logprobs`` the same
    for every prompt token after the first; None: none."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    presence_penalty: float = 0.0  # over generated tokens, [-2, 2]
    frequency_penalty: float = 0.0  # over generated tokens, [-2, 2]
    repetition_penalty: float = 1.0  # over prompt and generated tokens, > 0
    min_p: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    min_tokens: int = 0
    grammar: str | None = None  # an llguidance grammar (``engine/grammar.py``) the output must follow

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not _is_int(self.max_tokens) or self.max_tokens < (0 if self.prompt_logprobs is not None else 1):
            raise ValueError(f"max_tokens must be a positive integer (0 only with prompt_logprobs), "
                             f"got {self.max_tokens!r}")
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, int | float) \
                or not 0.0 <= self.temperature <= 100.0:
            raise ValueError(f"temperature must be a number in [0, 100], got {self.temperature!r}")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, int | float) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not _is_int(self.top_k) or not -1 <= self.top_k < TOKEN_ID_LIMIT:
            raise ValueError(f"top_k must be an integer in [-1, {TOKEN_ID_LIMIT}) (0 or -1 disables it), "
                             f"got {self.top_k!r}")
        if self.seed is not None and (not _is_int(self.seed) or not SEED_RANGE[0] <= self.seed < SEED_RANGE[1]):
            raise ValueError(f"seed must be an integer in [-2**63, 2**64), got {self.seed!r}")
        if not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop must be a non-empty string or a list of them, got {self.stop!r}")
        if len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS or not all(
            _is_int(t) and 0 <= t < TOKEN_ID_LIMIT for t in self.stop_token_ids
        ):
            raise ValueError(f"stop_token_ids must be at most {MAX_STOP_TOKEN_IDS} integers in [0, {TOKEN_ID_LIMIT})")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or not 0 <= value <= MAX_LOGPROBS):
                raise ValueError(f"{name} must be an integer in [0, {MAX_LOGPROBS}], got {value!r}")

        self._check_processing()

    def _check_processing(self) -> None:
        for name, lo, hi in (("presence_penalty", -2.0, 2.0), ("frequency_penalty", -2.0, 2.0),
                             ("min_p", 0.0, 1.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
                raise ValueError(f"{name} must be a number in [{lo}, {hi}], got {value!r}")
        rep = self.repetition_penalty
        if isinstance(rep, bool) or not isinstance(rep, int | float) or not 0.0 < rep <= 100.0:
            raise ValueError(f"repetition_penalty must be a number in (0, 100], got {rep!r}")
        if not _is_int(self.min_tokens) or not 0 <= self.min_tokens <= max(self.max_tokens, 0):
            raise ValueError(f"min_tokens must be an integer in [0, max_tokens], got {self.min_tokens!r}")
        bias = self.logit_bias
        if not isinstance(bias, dict) or len(bias) > MAX_LOGIT_BIAS or not all(
            _is_int(t) and 0 <= t < TOKEN_ID_LIMIT and not isinstance(v, bool) and isinstance(v, int | float)
            and -100.0 <= v <= 100.0 for t, v in bias.items()
        ):
            raise ValueError(f"logit_bias must map at most {MAX_LOGIT_BIAS} token ids to numbers in [-100, 100]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
