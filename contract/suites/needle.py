"""Needle in a haystack, RULER's single-needle style with distractors: a filler text of an exact token length
hides "one of the special magic numbers for KEY is: VALUE." at a given depth (0 % = first sentence, 100 % =
last), and a few distractor needles of other keys elsewhere; the model is asked for KEY's number and answers
by greedy generation. An answer is right when its first seven-digit number is VALUE.

Items are deterministic for (tokenizer, length, depth, sample, seed). A caller may also give the needles
themselves (``needle=``: the key asked for, its value, the distractors' keys and values, as the portal's
challenges do with fresh ones); the filler and the distractors' places are then still drawn from the seed.
``write_lm_eval_task`` writes the items a run used as an lm-eval task (YAML + JSONL), so the standard harness can
rerun exactly that set."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

SUITES_DIR = Path(__file__).resolve().parent
HEADER = ("Some special magic numbers are hidden within the following text. Make sure to memorize them. "
          "I will quiz you about the numbers afterwards.\n")
NEEDLE = "One of the special magic numbers for {key} is: {value}."
QUESTION = ("\nWhat is the special magic number for {key} mentioned in the provided text? "
            "The special magic number for {key} mentioned in the provided text is")
ANSWER_PATTERN = re.compile(r"\d{7}")
MAX_TOKENS = 12  # the answer's budget: a needle prompt of length L needs L + MAX_TOKENS of context
TASK = "needle"


@dataclass(frozen=True)
class NeedleItem:
    """One prompt: its target length and depth, the key asked for and its value, the distractors' values."""

    id: str
    length: int  # the prompt's token budget; ``tokens`` is at most this
    depth: int  # percent of the haystack before the needle
    key: str
    value: str
    distractors: tuple[str, ...]
    prompt: str
    tokens: int


def haystack_data() -> tuple[list[str], list[str]]:
    """The filler sentences and the needle keys (``needle_haystack.json`` beside this module)."""
    data = json.loads((SUITES_DIR / "needle_haystack.json").read_text())
    return list(data["filler"]), list(data["keys"])


def _compose(filler: list[str], count: int, needles: list[tuple[int, str]]) -> str:
    """``count`` filler sentences with each (position, sentence) needle inserted before sentence ``position``."""
    body = list(filler[:count])
    for position, sentence in sorted(needles, key=lambda n: -n[0]):  # back to front: earlier indexes stay valid
        body.insert(position, sentence)
    return " ".join(body)


def build_item(count_tokens: Callable[[str], int], length: int, depth: int, sample: int = 0, *,
               distractors: int = 3, seed: int | str = 0,
               needle: tuple[str, str, Sequence[tuple[str, str]]] | None = None) -> NeedleItem:
    """The item of (length, depth, sample): the most filler sentences whose prompt fits in ``length`` tokens.
    ``needle``: (key, value, [(distractor key, value), ...]) instead of drawing them (``distractors`` is then
    their count)."""
    if not 0 <= depth <= 100:
        raise ValueError(f"needle depth {depth} is outside 0..100 (percent)")
    filler, keys = haystack_data()
    rng = random.Random(f"{seed}-{length}-{depth}-{sample}")
    if needle is not None:
        key, value, pairs = needle[0], needle[1], list(needle[2])
        others, values = [k for k, _ in pairs], [value, *(v for _, v in pairs)]
    else:
        if distractors + 1 > len(keys):
            raise ValueError(f"at most {len(keys) - 1} distractors (one key each), got {distractors}")
        chosen = rng.sample(keys, distractors + 1)
        key, others = chosen[0], chosen[1:]
        values = [str(v) for v in rng.sample(range(1_000_000, 10_000_000), distractors + 1)]
    # Enough filler for the longest context: the sentences repeat, each pass in its own shuffled order.
    rounds = max(1, length // 8 // max(1, len(filler)) + 2)
    stream = [s for _ in range(rounds) for s in rng.sample(filler, len(filler))]
    slots = [rng.random() for _ in others]  # distractors' relative positions, fixed before the length search
    question = QUESTION.format(key=key)

    def prompt(count: int) -> str:
        needles = [(round(depth / 100 * count), NEEDLE.format(key=key, value=values[0]))]
        needles += [(round(slot * count), NEEDLE.format(key=k, value=v))
                    for slot, k, v in zip(slots, others, values[1:], strict=True)]
        return HEADER + _compose(stream, count, needles) + question

    lo, hi = 0, len(stream)
    if count_tokens(prompt(0)) > length:
        raise ValueError(f"needle length {length} is too short for the question and the needles themselves")
    while count_tokens(prompt(hi)) <= length:  # more filler than the stream holds: extend it
        stream += rng.sample(filler, len(filler))
        lo, hi = hi, len(stream)
    while lo < hi:  # the largest count whose prompt fits
        mid = (lo + hi + 1) // 2
        if count_tokens(prompt(mid)) <= length:
            lo = mid
        else:
            hi = mid - 1
    text = prompt(lo)
    return NeedleItem(id=f"needle-{length}-{depth}-{sample}", length=length, depth=depth, key=key, value=values[0],
                      distractors=tuple(values[1:]), prompt=text, tokens=count_tokens(text))


def build_items(count_tokens: Callable[[str], int], lengths: Sequence[int], depths: Sequence[int], samples: int = 1,
                *, distractors: int = 3, seed: int = 0) -> list[NeedleItem]:
    """Every (length, depth, sample) item, length-major."""
    return [build_item(count_tokens, n, d, s, distractors=distractors, seed=seed)
            for n in lengths for d in depths for s in range(samples)]


def is_correct(item: NeedleItem, generated: str) -> bool:
    """Whether the first seven-digit number of the answer is the needle's value (a distractor's is wrong)."""
    match = ANSWER_PATTERN.search(generated)
    return match is not None and match.group(0) == item.value


def accuracy_grid(items: Sequence[NeedleItem], correct: Sequence[bool], lengths: Sequence[int],
                  depths: Sequence[int]) -> list[list[float]]:
    """Mean accuracy per [length][depth]."""
    cells: dict[tuple[int, int], list[bool]] = {}
    for item, ok in zip(items, correct, strict=True):
        cells.setdefault((item.length, item.depth), []).append(ok)
    return [[sum(cells[(n, d)]) / len(cells[(n, d)]) for d in depths] for n in lengths]


LM_EVAL_YAML = """\
# The needle items of one eval-stage run (exact token lengths for this model's tokenizer), for the standard
# harness: lm_eval --include_path {directory} --tasks day0_needle --model local-completions ...
task: day0_needle
dataset_path: json
dataset_kwargs:
  data_files:
    test: {jsonl}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: value
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: {max_tokens}
  do_sample: false
  temperature: 0.0
filter_list:
  - name: first_number
    filter:
      - function: regex
        regex_pattern: "(\\\\d{{7}})"
      - function: take_first
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


def write_lm_eval_task(items: Sequence[NeedleItem], directory: Path, max_tokens: int) -> Path:
    """``directory``/day0_needle.yaml and .jsonl holding ``items``; returns the YAML's path."""
    directory.mkdir(parents=True, exist_ok=True)
    jsonl = directory / "day0_needle.jsonl"
    with jsonl.open("w") as f:
        for item in items:
            f.write(json.dumps({**asdict(item), "distractors": list(item.distractors)}) + "\n")
    yaml_path = directory / "day0_needle.yaml"
    yaml_path.write_text(LM_EVAL_YAML.format(directory=directory, jsonl=jsonl.resolve(), max_tokens=max_tokens))
    return yaml_path
