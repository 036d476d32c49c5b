"""The engine: requests in, tokens out, one ``step()`` at a time. ``add_request`` and ``abort`` are safe to
call from another thread; ``step()`` runs in one thread (the server's engine loop)."""

from __future__ import annotations

import itertools
import logging
import threading
from pathlib import Path
from typing import Any

import torch

from agents.runtime.engine.block_manager import BlockManager
from agents.runtime.engine.config import EngineConfig
from agents.runtime.engine.expert_load import ExpertLoad
from agents.runtime.engine.grammar import GrammarEngine, GrammarError
from agents.runtime.engine.logits_processors import apply_penalties
from agents.runtime.engine.logprobs import token_logprobs
from agents.runtime.engine.model_runner import ModelRunner, size_kv_pool
from agents.runtime.engine.multimodal import ImageInputs
from agents.runtime.engine.outputs import QueueFullError, RequestError, RequestOutput, TokenLogprob
from agents.runtime.engine.sampler import sample
from agents.runtime.engine.sampling_params import SamplingParams
from agents.runtime.engine.scheduler import Scheduler, SchedulerConfig
from agents.runtime.engine.sequence import Sequence
from agents.runtime.engine.stopping import check_stop, emit_text
from agents.runtime.engine.tokenizer import Tokenizer
from agents.runtime.interface import RuntimeModel
from agents.runtime.layers.linear import pack_layout

log = logging.getLogger(__name__)
WARMUP_TEXT = "The quick brown fox jumps over the lazy dog, and the day goes on."
MAX_FAILURES = 3  # forward-pass failures a request may be part of before it is ended with an error


class LLMEngine:
    """Continuous-batching engine over a model directory (or an already built ``model`` with its ``config``)."""

    def __init__(
        self,
        model_dir: str | Path | None,
        *,
        model: RuntimeModel | None = None,
        config: dict[str, Any] | None = None,
        tokenizer: Tokenizer | None = None,
        **settings: Any,
    ) -> None:
        self.config = EngineConfig(**settings)
        self.model_dir = Path(model_dir) if model_dir is not None else None
        self.load_report: dict[str, Any] | None = None
        if model is None:
            from agents.runtime.loader import load_model

            result = load_model(self.model_dir, dtype=self.config.dtype, device=self.config.device,
                                quant_mode=self.config.quant_mode, pack_weights=self.config.pack_weights)
            model, config, self.load_report = result.model, result.config, result.report
            if self.config.pack_weights:  # packed by the load (experts straight into their panels)
                log.info("packed %d weights (layout: %s)", result.report["packed_weights"], pack_layout())
        elif self.config.pack_weights and hasattr(model, "pack_weights"):
            packed = model.pack_weights()  # before the KV pool takes the memory
            log.info("packed %d weights (layout: %s)", packed, pack_layout())
        if config is None:
            raise ValueError("LLMEngine needs the model's config when given a built model")
        self.model = model
        self.model_config = config
        self.tokenizer = tokenizer or Tokenizer(self.model_dir)
        if self.config.chat_template is not None:  # ``--chat-template``: served instead of the model's own
            self.tokenizer.use_chat_template(self.config.chat_template)
        self.device = torch.device(self.config.device)
        text = config.get("text_config") or config  # a vision-language model: its decoder's
        context = int(text.get("max_position_embeddings") or 2048)
        max_len = min(self.config.max_model_len or context, context)
        spec = model.kv_cache_spec()
        bs = self.config.block_size
        if self.config.num_blocks is not None:
            num_blocks = self.config.num_blocks
        elif spec is not None:
            from agents.runtime.distributed import get_tp_world_size

            fraction = self.config.fraction_for(self.device.type)
            if self.device.type == "cpu":  # every rank of a TP group takes its pool from the same host memory
                fraction /= get_tp_world_size()
            need = self.config.max_num_seqs * (max_len + bs)
            num_blocks = size_kv_pool(spec, self.device, bs, memory_fraction=fraction, max_tokens=need)
        else:  # recompute path: blocks only bound admission
            num_blocks = self.config.max_num_seqs * (-(-max_len // bs))
        self.max_model_len = min(max_len, num_blocks * bs)
        self.runner = ModelRunner(model, self.device, bs, num_blocks)
        self.blocks = BlockManager(num_blocks, bs, enable_prefix_caching=self.config.enable_prefix_caching
                                   and self.runner.paged)
        self.expert_load = ExpertLoad(model)
        self.compiled = None  # the compiled path (``--compile``), installed after the expert-load hooks it keeps
        if self.config.compile:
            from agents.runtime.engine.compiled import CompiledModel

            self.compiled = CompiledModel(model, device=self.device, cache_dir=self.config.compile_cache_dir)
        paged = self.runner.paged
        self.scheduler = Scheduler(
            SchedulerConfig(
                max_num_seqs=self.config.max_num_seqs,
                max_num_batched_tokens=self.config.max_num_batched_tokens if paged else self.max_model_len,
                max_model_len=self.max_model_len,
                chunked_prefill=paged,
            ),
            self.blocks,
        )
        self.eos_token_ids = self.tokenizer.eos_token_ids
        self.vocab_size = int(text.get("vocab_size") or self.tokenizer.vocab_size)
        self.grammar = GrammarEngine(self.tokenizer, self.vocab_size, self.eos_token_ids)
        self._lock = threading.Lock()
        self._inbox: list[Sequence] = []
        self._aborts: list[str] = []
        self._live: dict[str, Sequence] = {}
        self._ids = itertools.count()
        self.num_steps = 0

    # ---- requests (any thread) ----

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        images: ImageInputs | None = None,
    ) -> str:
        """Queue a prompt (text or token ids); RequestError names a bad prompt, QueueFullError when full.
        ``images``: a vision-language prompt's pixel values and placeholder positions (``engine/multimodal.py``)."""
        params = params or SamplingParams()
        if isinstance(prompt, str) and not prompt.strip():
            raise RequestError("prompt is empty")
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise RequestError("prompt is empty")
        if not all(isinstance(t, int) and 0 <= t < self.vocab_size for t in ids):
            raise RequestError(f"prompt token ids must be integers in [0, {self.vocab_size})")
        if len(ids) >= self.max_model_len:
            raise RequestError(f"prompt is {len(ids)} tokens, the model's context is {self.max_model_len}")
        if len(ids) + params.max_tokens > self.max_model_len:
            raise RequestError(
                f"prompt ({len(ids)} tokens) plus max_tokens ({params.max_tokens}) exceeds the model's context "
                f"of {self.max_model_len} tokens"
            )
        image_token = getattr(self.model, "image_token_id", None)
        if images is None and image_token is not None and image_token in ids:
            raise RequestError(f"the prompt holds the image placeholder token {image_token} but no image")
        if images is not None:
            if not getattr(self.model, "takes_images", False):
                raise RequestError("this model does not take images (a text-only model)")
            if not images.positions or images.positions[-1] >= len(ids):
                raise RequestError("the prompt has no image placeholder tokens for its images")
        if any(t >= self.vocab_size for t in params.logit_bias):
            raise RequestError(f"logit_bias token ids must be in [0, {self.vocab_size})")
        matcher = None
        if params.grammar is not None:
            try:
                matcher = self.grammar.matcher(params.grammar)
            except GrammarError as exc:
                raise RequestError(str(exc)) from exc
        with self._lock:
            if len(self._live) >= self.config.max_pending:
                raise QueueFullError(f"engine queue is full ({self.config.max_pending} requests)")
            request_id = request_id or f"req-{next(self._ids)}"
            if request_id in self._live:
                raise RequestError(f"request id {request_id!r} is already in use")
            seq = Sequence(request_id, ids, params)
            seq.images = images
            seq.matcher = matcher
            self._live[request_id] = seq
            self._inbox.append(seq)
        return request_id

    def abort(self, request_id: str) -> None:
        """Stop a request; its blocks are freed at the start of the next step."""
        with self._lock:
            self._aborts.append(request_id)

    def has_unfinished(self) -> bool:
        with self._lock:
            return bool(self._live or self._aborts)

    # ---- the loop (engine thread) ----

    def step(self) -> list[RequestOutput]:
        """Admit, schedule, run one forward pass, sample; return what changed for each request."""
        outputs: list[RequestOutput] = []
        with self._lock:
            inbox, self._inbox = self._inbox, []
            aborts, self._aborts = self._aborts, []
        for seq in inbox:
            self.scheduler.add(seq)
        for request_id in aborts:
            seq = self.scheduler.abort(request_id)
            if seq is not None:
                outputs.append(self._output(seq, []))
        batch = self.scheduler.schedule()
        if batch.empty:
            return outputs
        self.num_steps += 1
        try:
            step = self.runner.run_step(batch)
            self.scheduler.on_step_done(batch)
            seqs = step.seqs
            tokens = self._sample(step.logits, seqs) if seqs else []
            logprobs = self._sampled_logprobs(step.logits, seqs, tokens)
        except Exception as exc:  # a failing batch never ends the engine, and ends only the request at fault
            error = f"{type(exc).__name__}: {exc}"
            log.exception("forward pass failed for %d sequence(s)", len(batch.seqs))
            self.blocks.forget(batch.registered)  # named for this step's tokens, whose K/V may not be written
            for seq in batch.seqs:
                if len(batch.seqs) == 1 or seq.num_failures >= MAX_FAILURES:
                    self.scheduler.finish(seq, "error")
                    outputs.append(self._output(seq, [], error=error))
                else:  # which one is at fault? each retries alone
                    self.scheduler.requeue_isolated(seq)
            return outputs
        for seq, scored in step.prompt_logprobs:
            seq.prompt_logprobs.extend(scored)
        for seq, token, lp in zip(seqs, tokens, logprobs, strict=True):
            seq.isolate = False
            if seq.params.max_tokens == 0:  # prefill only (prompt logprobs): no token is drawn
                self.scheduler.finish(seq, "length")
                outputs.append(self._output(seq, []))
                continue
            seq.append_token(token)
            reason = check_stop(seq, token, self.tokenizer, self.eos_token_ids, self.max_model_len)
            if reason is not None:
                self.scheduler.finish(seq, reason)
            outputs.append(self._output(seq, [token], None if lp is None else [lp]))
        return outputs

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        """Penalties, biases, min-tokens and min-p, then each constrained row's grammar mask, then the draw; the
        matchers advance with the drawn tokens. Logprobs stay those of the model's own distribution."""
        logits = apply_penalties(logits, seqs, self.eos_token_ids)
        logits = self.grammar.apply_masks(logits, seqs)
        tokens = sample(logits, seqs)
        self.grammar.advance(seqs, tokens)
        return tokens

    @staticmethod
    def _sampled_logprobs(
        logits: torch.Tensor | None, seqs: list[Sequence], tokens: list[int]
    ) -> list[TokenLogprob | None]:
        """The sampled token's logprob and top alternatives for the rows whose request asked for them."""
        out: list[TokenLogprob | None] = [None] * len(seqs)
        rows = [i for i, s in enumerate(seqs) if s.params.logprobs is not None and s.params.max_tokens > 0]
        if rows:
            index = torch.tensor(rows, dtype=torch.long, device=logits.device)
            scored = token_logprobs(
                logits.index_select(0, index), [tokens[i] for i in rows], [seqs[i].params.logprobs for i in rows]
            )
            for i, lp in zip(rows, scored, strict=True):
                out[i] = lp
        return out

    def _output(
        self,
        seq: Sequence,
        new_ids: list[int],
        new_logprobs: list[TokenLogprob] | None = None,
        error: str | None = None,
    ) -> RequestOutput:
        if seq.is_finished:
            with self._lock:
                self._live.pop(seq.request_id, None)
        prompt_logprobs = None
        # once the prompt is scored: with the first output after the prefill, and again with the final one
        scored = seq.prompt_logprobs is not None and len(seq.prompt_logprobs) == seq.num_prompt_tokens
        if scored and error is None and (not seq.prompt_logprobs_sent or seq.is_finished):
            seq.prompt_logprobs_sent = True
            prompt_logprobs = list(seq.prompt_logprobs)
        return RequestOutput(
            request_id=seq.request_id,
            new_token_ids=new_ids,
            new_text=emit_text(seq),
            finished=seq.is_finished,
            finish_reason=seq.finish_reason,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_output_tokens=seq.num_output_tokens,
            output_token_ids=seq.output_token_ids if seq.is_finished else None,
            text=seq.text if seq.is_finished else None,
            error=error,
            arrival_time=seq.arrival_time,
            first_scheduled_time=seq.first_scheduled_time,
            first_token_time=seq.first_token_time,
            finish_time=seq.finish_time,
            new_logprobs=new_logprobs,
            prompt_logprobs=prompt_logprobs,
        )

    # ---- conveniences ----

    def generate(
        self, prompts: list[str | list[int]], params: SamplingParams | list[SamplingParams] | None = None
    ) -> list[RequestOutput]:
        """Run prompts to completion (batched continuously); the final output of each, in order."""
        plist = params if isinstance(params, list) else [params] * len(prompts)
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, plist, strict=True)]
        final: dict[str, RequestOutput] = {}
        while len(final) < len(ids):
            for out in self.step():
                if out.finished:
                    final[out.request_id] = out
        return [final[i] for i in ids]

    def warmup(self) -> None:
        """One short generation through every path (prefill, decode, sampling), so the first request is fast. Its
        prompt is ordinary text of the model's own tokenizer (``warmup_prompt``): a fixed id can be any
        tokenizer's image, BOS or control token, which the engine would refuse or the model treat specially."""
        self.generate([self.warmup_prompt()], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
        if self.compiled is not None:  # both shape classes (several tokens, one) are compiled by now
            self.compiled.mark_warm()

    def warmup_prompt(self, length: int = 4) -> list[int]:
        """``length`` ids of plain English text as the model's tokenizer encodes it, none of them a special,
        added, image or other control token (``reserved_token_ids``); when the text yields too few such ids, the
        lowest ordinary ids of the vocabulary that decode to visible text."""
        reserved = self.reserved_token_ids()
        ids = [t for t in self.tokenizer.encode(WARMUP_TEXT, add_special_tokens=False)
               if t not in reserved and 0 <= t < self.vocab_size]
        candidate = 0
        while len(ids) < length and candidate < self.vocab_size:
            if candidate not in reserved and self.tokenizer.visible_len(candidate) > 0:
                ids.append(candidate)
            candidate += 1
        if not ids:
            raise RuntimeError("the tokenizer has no ordinary (non-special) token to warm the engine up with")
        return ids[:length]

    def reserved_token_ids(self) -> set[int]:
        """Ids a warm-up or probe prompt must not hold: the tokenizer's special and added tokens, the model's
        image placeholder, and every ``*_token_id`` / ``*_token_index`` the config names (image, video, audio,
        pad, BOS, EOS …, in the config and its ``text_config``)."""
        reserved = set(self.tokenizer.special_ids()) | set(self.eos_token_ids)
        image = getattr(self.model, "image_token_id", None)
        if image is not None:
            reserved.add(int(image))
        for cfg in (self.model_config, self.model_config.get("text_config") or {}):
            for key, value in cfg.items():
                if key.endswith(("_token_id", "_token_index", "_token_ids")):
                    values = value if isinstance(value, list) else [value]
                    reserved.update(v for v in values if isinstance(v, int) and not isinstance(v, bool))
        return reserved

    def fail_all(self, error: str) -> list[RequestOutput]:
        """End every request in flight with ``error`` and free its blocks (after an unexpected failure)."""
        with self._lock:
            inbox, self._inbox, self._aborts = self._inbox, [], []
        for seq in inbox:
            self.scheduler.add(seq)
        outputs = []
        for seq in [*self.scheduler.running, *self.scheduler.waiting]:
            self.scheduler.finish(seq, "error")
            outputs.append(self._output(seq, [], error=error))
        return outputs

    def close(self) -> None:
        """Release the other tensor-parallel ranks, if any (the engine is unusable afterwards)."""
        broadcast, self.runner.broadcast = self.runner.broadcast, None
        if broadcast is not None:
            broadcast(None)  # ``None`` stops the workers (see ``engine/tp.py``)

    def stats(self) -> dict[str, float]:
        return {
            "num_waiting": len(self.scheduler.waiting) + len(self._inbox),
            "num_running": len(self.scheduler.running),
            "kv_blocks_total": self.blocks.num_blocks,
            "kv_blocks_used": self.blocks.num_used_blocks,
            "kv_blocks_free": self.blocks.num_free_blocks,
            "kv_cache_bytes": self.runner.kv_cache_bytes,
            "num_preemptions": self.scheduler.num_preemptions,
            "num_steps": self.num_steps,
            "grammar_mask_seconds": self.grammar.mask_seconds,
            "grammar_mask_rows": self.grammar.mask_rows,
            "prefix_caching": int(self.blocks.enable_prefix_caching),
            "prefix_cache_queries": self.blocks.num_queries,
            "prefix_cache_hits": self.blocks.num_hits,
            "prefix_cache_blocks": self.blocks.num_cached_blocks,
            "prefix_cache_evictions": self.blocks.num_evictions,
        }
