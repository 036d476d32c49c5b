"""The eval stage's task suites, read from lm-eval task files (``contract/suites/*.yaml`` + JSONL) and scored the way
the harness scores them, so that ``lm_eval --include_path contract/suites`` runs the same suite:

* ``multiple_choice``: the context ``doc_to_text``, each choice after ``target_delimiter``; the prediction is the
  choice of highest summed log-likelihood (``acc``);
* ``generate_until``: greedy generation up to ``until`` / ``max_gen_toks`` after ``description`` +
  ``doc_to_text``, the ``remove_whitespace`` filter, ``exact_match`` with its ``ignore_case``,
  ``ignore_punctuation`` and ``regexes_to_ignore`` options;
* ``loglikelihood_rolling``: the document's log-likelihood in disjoint windows after a prefix token,
  ``word_perplexity`` = exp(−Σ log-likelihood / Σ words) over the task.

Tokenization follows the harness's context/continuation split: ``continuation = encode(context + cont)``
minus the context's tokens, trailing spaces of the context moved to the continuation."""

from __future__ import annotations

import json
import math
import re
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUITES_DIR = Path(__file__).resolve().parent
TASK_FILES: dict[str, str] = {"day0_mc": "day0_mc.yaml", "day0_qa": "day0_qa.yaml", "day0_ppl": "day0_ppl.yaml"}
OUTPUT_TYPES = ("multiple_choice", "generate_until", "loglikelihood_rolling")


class TaskError(ValueError):
    """A task file or its data is malformed (the message names the file and the field)."""


@dataclass
class Task:
    """One task: its lm-eval config and its documents."""

    name: str
    config: dict[str, Any]
    docs: list[dict[str, Any]]
    path: Path

    @property
    def output_type(self) -> str:
        return str(self.config["output_type"])

    @property
    def metric(self) -> str:
        return str(self.config["metric_list"][0]["metric"])

    @property
    def metric_options(self) -> dict[str, Any]:
        return dict(self.config["metric_list"][0])

    @property
    def higher_is_better(self) -> bool:
        return bool(self.metric_options.get("higher_is_better", True))

    @property
    def chance(self) -> float | None:
        value = (self.config.get("metadata") or {}).get("chance")
        return None if value is None else float(value)


def _jinja() -> Any:
    import jinja2

    return jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)


def field_of(template: Any, doc: dict[str, Any]) -> Any:
    """A ``doc_to_*`` value: a column name gives the column, anything else is a Jinja template of the doc."""
    if isinstance(template, str) and template in doc:
        return doc[template]
    if isinstance(template, int | list):
        return template
    return _jinja().from_string(str(template)).render(**doc)


def load_task(name: str, suites_dir: Path = SUITES_DIR) -> Task:
    """The task ``name`` (a key of TASK_FILES) with all its documents."""
    if name not in TASK_FILES:
        raise TaskError(f"unknown eval task {name!r}; known: {', '.join(TASK_FILES)}")
    import yaml  # the harness's task format; imported here so that importing the contract needs no third party

    path = suites_dir / TASK_FILES[name]
    config = yaml.safe_load(path.read_text())
    if config.get("output_type") not in OUTPUT_TYPES:
        raise TaskError(f"{path.name}: output_type {config.get('output_type')!r} is not one of {OUTPUT_TYPES}")
    if not config.get("metric_list"):
        raise TaskError(f"{path.name}: metric_list is empty")
    data = Path(config["dataset_kwargs"]["data_files"][config.get("test_split", "test")])
    data = data if data.is_absolute() else suites_dir / data.name
    docs = [json.loads(line) for line in data.read_text().splitlines() if line.strip()]
    if not docs:
        raise TaskError(f"{data.name}: no documents")
    return Task(name=name, config=config, docs=docs, path=path)


# --- tokenization ---------------------------------------------------------------------------------------------

Encode = Callable[[str], list[int]]


def encode_pair(encode: Encode, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """The harness's split: trailing spaces of the context go to the continuation; the continuation's tokens are
    those of context + continuation after the context's own."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = encode(context + continuation)
    context_ids = encode(context)
    return context_ids, whole[len(context_ids):]


# --- requests and scores --------------------------------------------------------------------------------------

@dataclass
class Requests:
    """What one task asks of a model: log-likelihood pairs or generation prompts, and how to score the answers."""

    task: Task
    docs: list[dict[str, Any]]
    loglikelihood: list[tuple[list[int], list[int]]] = field(default_factory=list)
    prompts: list[list[int]] = field(default_factory=list)
    owners: list[int] = field(default_factory=list)  # the doc index of each request
    until: list[str] = field(default_factory=list)
    max_tokens: int = 0
    words: list[int] = field(default_factory=list)  # per doc (perplexity)
    tokens: int = 0


def build_requests(task: Task, encode: Encode, *, limit: int | None = None, max_length: int = 2048,
                   prefix_token: int | None = None) -> Requests:
    """The requests of ``task``'s first ``limit`` documents (all when None)."""
    docs = task.docs[:limit] if limit else list(task.docs)
    cfg = task.config
    req = Requests(task=task, docs=docs)
    if task.output_type == "multiple_choice":
        delimiter = cfg.get("target_delimiter", " ")
        for i, doc in enumerate(docs):
            context = cfg.get("description", "") + field_of(cfg["doc_to_text"], doc)
            for choice in field_of(cfg["doc_to_choice"], doc):
                req.loglikelihood.append(encode_pair(encode, context, delimiter + str(choice)))
                req.owners.append(i)
    elif task.output_type == "generate_until":
        gen = cfg.get("generation_kwargs") or {}
        req.until = list(gen.get("until") or [])
        req.max_tokens = int(gen.get("max_gen_toks", 256))
        for i, doc in enumerate(docs):
            req.prompts.append(encode(cfg.get("description", "") + field_of(cfg["doc_to_text"], doc)))
            req.owners.append(i)
    else:  # loglikelihood_rolling: disjoint windows, each predicted after the token before it
        if prefix_token is None:
            raise TaskError(f"{task.name}: rolling log-likelihood needs a prefix token (the tokenizer has no BOS/EOS)")
        window = max_length - 1
        for i, doc in enumerate(docs):
            text = str(field_of(cfg["doc_to_target"], doc))
            ids = encode(text)
            req.words.append(len(re.split(r"\s+", text)))
            req.tokens += len(ids)
            for start in range(0, len(ids), window):
                before = prefix_token if start == 0 else ids[start - 1]
                req.loglikelihood.append(([before], ids[start : start + window]))
                req.owners.append(i)
    return req


def _normalise(text: str, options: dict[str, Any]) -> str:
    for pattern in options.get("regexes_to_ignore") or []:
        text = re.sub(pattern, "", text)
    if options.get("ignore_case"):
        text = text.lower()
    if options.get("ignore_punctuation"):
        text = text.translate(str.maketrans("", "", string.punctuation))
    return text


def cut_at_stop(text: str, until: Sequence[str]) -> str:
    """``text`` up to the first of the ``until`` strings (as the server's ``stop``)."""
    cut = len(text)
    for stop in until:
        at = text.find(stop)
        if at != -1:
            cut = min(cut, at)
    return text[:cut]


@dataclass
class Score:
    """One side's result on one task: the metric over the task, per-document correctness, the answers."""

    value: float
    correct: list[bool] | None  # per doc (accuracy metrics)
    answers: list[Any]


def score(req: Requests, loglikelihoods: Sequence[float] | None = None,
          generations: Sequence[str] | None = None) -> Score:
    """The task's metric from one side's answers."""
    task, docs = req.task, req.docs
    if task.output_type == "multiple_choice":
        assert loglikelihoods is not None
        per_doc: list[list[float]] = [[] for _ in docs]
        for owner, ll in zip(req.owners, loglikelihoods, strict=True):
            per_doc[owner].append(ll)
        picks = [max(range(len(lls)), key=lls.__getitem__) for lls in per_doc]
        targets = [int(field_of(task.config["doc_to_target"], doc)) for doc in docs]
        correct = [p == t for p, t in zip(picks, targets, strict=True)]
        return Score(sum(correct) / len(correct), correct, picks)
    if task.output_type == "generate_until":
        assert generations is not None
        options = task.metric_options
        answers = [cut_at_stop(g, req.until).lstrip() for g in generations]
        targets = [str(field_of(task.config["doc_to_target"], doc)) for doc in docs]
        correct = [_normalise(a, options) == _normalise(t, options) for a, t in zip(answers, targets, strict=True)]
        return Score(sum(correct) / len(correct), correct, answers)
    assert loglikelihoods is not None
    per_doc_ll = [0.0] * len(docs)
    for owner, ll in zip(req.owners, loglikelihoods, strict=True):
        per_doc_ll[owner] += ll
    return Score(math.exp(-sum(per_doc_ll) / sum(req.words)), None, per_doc_ll)


def token_perplexity(req: Requests, per_doc_ll: Sequence[float]) -> float:
    """exp(−Σ log-likelihood / Σ tokens) of a rolling task."""
    return math.exp(-sum(per_doc_ll) / req.tokens)


def wilson_low(successes: float, n: int, z: float = 1.959964) -> float:
    """The lower end of the Wilson score interval (95 % by default) of a proportion of ``n`` trials."""
    if n <= 0:
        return 0.0
    p = successes / n
    centre = p + z * z / (2 * n)
    margin = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, (centre - margin) / (1 + z * z / n))
