"""Penalties, ``min_p``, ``logit_bias`` and ``min_tokens`` with vLLM's semantics, and response_format through the
grammar engine, on the tiny random model: checked against the formulas on hand-made logits, and through the
engine and server (greedy without them bit-identical to the plain sampler)."""

from __future__ import annotations

import json

import httpx
import pytest
import torch

from agents.runtime.engine import LLMEngine, SamplingParams
from agents.runtime.engine.grammar import GrammarError, grammar_from_json_schema
from agents.runtime.engine.logits_processors import apply_penalties
from agents.runtime.engine.sampler import sample
from agents.runtime.engine.sequence import Sequence
from agents.runtime.server import create_app
from agents.runtime.server.launcher import ServerThread
from agents.runtime.testing.make_model import cached_model


def _seq(prompt, output, **params):
    seq = Sequence("r", prompt, SamplingParams(max_tokens=16, **params))
    for t in output:
        seq.append_token(t)
    return seq


def test_penalties_follow_vllm_formulas():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -2.0, 1.0]])
    seq = _seq([0, 1], [3, 3, 4], presence_penalty=0.5, frequency_penalty=0.25, repetition_penalty=2.0)
    out = apply_penalties(logits, [seq], eos_ids={5})[0]
    # repetition over prompt and output (divide positive, multiply negative), then presence/frequency over output
    expect = torch.tensor([1.0, -2.0, 0.5, 1.5 - 0.5 - 0.5, -4.0 - 0.5 - 0.25, 1.0])
    assert torch.allclose(out, expect)
    assert torch.equal(logits, torch.tensor([[2.0, -1.0, 0.5, 3.0, -2.0, 1.0]]))  # input untouched


def test_logit_bias_min_tokens_and_min_p():
    logits = torch.tensor([[0.0, 0.0, 5.0, 1.0], [0.0, 0.0, 5.0, 1.0]])
    biased = _seq([1], [], logit_bias={0: 100.0})
    waiting = _seq([1], [2], min_tokens=3, stop_token_ids=[3])
    out = apply_penalties(logits, [biased, waiting], eos_ids={2})
    assert out[0, 0] == 100.0 and out[0, 2] == 5.0
    assert out[1, 2] == float("-inf") and out[1, 3] == float("-inf") and out[1, 0] == 0.0
    done = _seq([1], [2, 2, 2], min_tokens=3)
    assert apply_penalties(logits[:1], [done], eos_ids={2})[0, 2] == 5.0  # reached: EOS allowed again
    minp = _seq([1], [], min_p=0.1, temperature=1.0)
    kept = apply_penalties(logits[:1], [minp], eos_ids=set())[0]
    probs = logits[0].softmax(-1)
    assert torch.equal(kept.isinf(), probs < 0.1 * probs.max())


def test_rows_without_processing_keep_their_logits_bit_for_bit():
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    plain = [_seq([1, 2], [3], temperature=0.0) for _ in range(3)]
    assert apply_penalties(logits, plain, eos_ids={0}) is logits
    mixed = [plain[0], _seq([1], [4], temperature=0.0, presence_penalty=1.0), plain[2]]
    out = apply_penalties(logits, mixed, eos_ids={0})
    assert torch.equal(out[0], logits[0]) and torch.equal(out[2], logits[2])
    assert sample(out, mixed)[0] == sample(logits, plain)[0]


def test_validation_names_the_field():
    for kwargs, name in [({"presence_penalty": 3}, "presence_penalty"),
                         ({"repetition_penalty": 0}, "repetition_penalty"), ({"min_p": -0.1}, "min_p"), ({"min_tokens": 99}, "min_tokens"),
                         ({"logit_bias": {1: 200}}, "logit_bias")]:
        with pytest.raises(ValueError, match=name):
            SamplingParams(max_tokens=4, **kwargs)
    with pytest.raises(GrammarError, match="schema"):
        grammar_from_json_schema({"type": "object", "properties": {"a": {"type": "nonsense"}}})


@pytest.fixture(scope="module")
def engine():
    return LLMEngine(cached_model("llama"), num_blocks=256)


def test_greedy_without_parameters_is_unchanged_and_penalties_change_repeats(engine):
    prompt = "one two three one two three"
    base = engine.generate([prompt], SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))[0]
    again = engine.generate([prompt], SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True,
                                                     presence_penalty=0.0, repetition_penalty=1.0))[0]
    assert again.output_token_ids == base.output_token_ids
    rep = engine.generate([prompt], SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True,
                                                   frequency_penalty=2.0, presence_penalty=2.0))[0]
    ids = rep.output_token_ids
    assert len(set(ids)) > len(set(base.output_token_ids)) or len(set(ids)) == len(ids)
    forced = engine.generate([prompt], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True,
                                                      logit_bias={7: 100.0}))[0]
    assert forced.output_token_ids == [7, 7, 7, 7]


SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


def test_grammar_constrains_a_batch_greedy_and_sampled(engine):
    grammar = grammar_from_json_schema(SCHEMA, strict=True)
    params = [SamplingParams(max_tokens=80, temperature=0.0, grammar=grammar),
              SamplingParams(max_tokens=80, temperature=1.0, seed=1, grammar=grammar),
              SamplingParams(max_tokens=8, temperature=0.0),  # an unconstrained row in the same batch
              SamplingParams(max_tokens=80, temperature=0.8, seed=2, grammar=grammar_from_json_schema(
                  {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                   "additionalProperties": False}))]
    before = engine.grammar.mask_rows
    outs = engine.generate(["Person:", "Person:", "Free text", "Object:"], params)
    for out in (outs[0], outs[1]):
        assert out.finish_reason == "stop", out.text
        value = json.loads(out.text)
        assert set(value) == {"name", "age"} and isinstance(value["age"], int) and len(value["name"]) <= 12
    assert outs[3].finish_reason == "stop" and isinstance(json.loads(outs[3].text)["ok"], bool)
    assert engine.grammar.mask_rows > before and engine.stats()["grammar_mask_seconds"] > 0


def test_server_json_object_and_schema_errors(engine):
    with ServerThread(create_app(engine, "tiny")) as url:
        msgs = [{"role": "user", "content": "Give me JSON"}]
        for extra in ({"temperature": 0}, {"temperature": 1.0, "seed": 3, "n": 2}):
            r = httpx.post(f"{url}/v1/chat/completions", json={"messages": msgs, "max_tokens": 60,
                           "response_format": {"type": "json_object"}, **extra}, timeout=120)
            assert r.status_code == 200, r.text
            for choice in r.json()["choices"]:
                assert isinstance(json.loads(choice["message"]["content"]), dict)
        bad = {"type": "json_schema", "json_schema": {"name": "broken", "schema": {"type": 5}}}
        r = httpx.post(f"{url}/v1/chat/completions", json={"messages": msgs, "response_format": bad}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"
        assert "broken" in r.json()["error"]["message"]
        # /v1/completions takes response_format too (as vLLM does), each prompt of a batch constrained
        fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
        r = httpx.post(f"{url}/v1/completions", json={"prompt": ["Person:", "Someone:"], "max_tokens": 80,
                                                      "temperature": 0, "response_format": fmt}, timeout=120)
        assert r.status_code == 200, r.text
        for choice in r.json()["choices"]:
            value = json.loads(choice["text"])
            assert choice["finish_reason"] == "stop" and set(value) == {"name", "age"}
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "response_format": bad}, timeout=30)
        assert r.status_code == 400 and "broken" in r.json()["error"]["message"]
        metrics = httpx.get(f"{url}/metrics").text
        line = next(x for x in metrics.splitlines() if x.startswith("day0:grammar_mask_seconds_total{"))
        assert float(line.rsplit(" ", 1)[1]) > 0


def test_fallback_path_is_constrained_and_penalised_like_the_native(engine):
    """The generic fallback (transformers' modelling over the runtime's cache) samples through the same engine
    step: the same grammar and penalties give the same greedy tokens as the native model."""
    from safetensors.torch import load_file

    from agents.runtime.models.fallback import FallbackModel

    model_dir = cached_model("llama")
    config = json.loads((model_dir / "config.json").read_text())
    model = FallbackModel(config)
    weights = {}
    for shard in sorted(model_dir.glob("*.safetensors")):
        weights.update(load_file(shard))
    model.load_weights(weights.items())
    model.eval()
    fb = LLMEngine(model_dir, model=model, config=config, max_num_seqs=4)
    grammar = grammar_from_json_schema(SCHEMA, strict=True)
    params = [SamplingParams(max_tokens=60, temperature=0.0, grammar=grammar),
              SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, frequency_penalty=1.5,
                             repetition_penalty=1.3, logit_bias={9: 3.0})]
    got = fb.generate(["Person:", "one two one two"], params)
    want = engine.generate(["Person:", "one two one two"], params)
    assert set(json.loads(got[0].text)) == {"name", "age"}
    assert [o.output_token_ids for o in got] == [o.output_token_ids for o in want]
    assert fb.grammar.mask_rows > 0


def test_chat_template_flag_refuses_a_missing_or_broken_file(tmp_path):
    import subprocess
    from pathlib import Path

    from agents.runtime.commands.serve import serve_command

    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m['content'] }")
    for path, said in ((tmp_path / "absent.jinja", "cannot read"), (broken, "does not parse")):
        argv = serve_command(cached_model("llama"), dtype="float32", device="cpu",
                             args=["--allocator", "system", "--chat-template", path])
        run = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                             cwd=Path(__file__).resolve().parents[2])
        assert run.returncode == 2 and said in run.stdout, run.stdout + run.stderr


def test_a_served_template_takes_request_kwargs_but_not_its_reserved_names():
    from agents.runtime.engine.tokenizer import Tokenizer

    tok = Tokenizer(cached_model("llama"))
    tok.use_chat_template("{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
                          "{% if enable_thinking is defined and not enable_thinking %}/no_think{% endif %}")
    msgs = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(msgs) == "[hi]"
    assert tok.apply_chat_template(msgs, template_kwargs={"enable_thinking": False}) == "[hi]/no_think"
    assert tok.apply_chat_template(msgs, template_kwargs={"messages": []}) == "[hi]"
    with pytest.raises(ValueError, match="does not parse"):
        tok.use_chat_template("{% if %}")
