"""Decode steps through ``native_decode.DecodePlan`` (``kernels.decode_layers``): a run of decoder layers in one
native call gives every step's logits bit for bit as the layers' own forwards do, across the families and config
variants it covers (QK-norm, attention biases, sliding windows, partial rotary tables, routed experts between the
runs, chunked prefills beside decodes); it steps aside where it must (hooks, hidden states, the compiled path,
layers it does not cover) and follows new caches and weights."""

from __future__ import annotations

import ctypes

import pytest
import torch

from agents.runtime import kernels
from agents.runtime.engine import LLMEngine, SamplingParams
from agents.runtime.kernels import library
from agents.runtime.layers import linear
from agents.runtime.models import native_decode
from agents.runtime.testing.make_model import cached_model
from tests.runtime.variants import save_variant

pytestmark = pytest.mark.skipif(not kernels.available(), reason="no native kernels")

PARAMS = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
BASE = dict(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6)


@pytest.fixture
def packs_small(monkeypatch):
    """The test models' weights are below the size worth packing: pack them all, as panels."""
    monkeypatch.setattr(linear, "ONEDNN_MIN_WEIGHT", 0)
    monkeypatch.delenv("DAY0_PACK_LAYOUT", raising=False)


@pytest.fixture
def native_calls(monkeypatch):
    """Every ``kernels.decode_layers`` call: the number of layers it ran."""
    calls: list[int] = []
    real = kernels.decode_layers

    def counted(*args, **kwargs):
        calls.append(len(args[4]))
        return real(*args, **kwargs)

    monkeypatch.setattr(kernels, "decode_layers", counted)
    return calls


def _run(engine: LLMEngine, prompts: list[list[int]], native: bool) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Greedy outputs and every step's logits with the native decode on or off."""
    engine.model.native_decode = native
    logits: list[torch.Tensor] = []
    execute = engine.runner.execute

    def recording(inputs):
        out, prompt = execute(inputs)
        if out is not None:
            logits.append(out.clone())
        return out, prompt

    engine.runner.execute = recording
    try:
        tokens = [o.output_token_ids for o in engine.generate(prompts, PARAMS)]
    finally:
        del engine.runner.execute
    return tokens, logits


def _same_with_and_without(engine: LLMEngine, prompts: list[list[int]], native_calls: list[int]) -> None:
    want_tokens, want_logits = _run(engine, prompts, native=False)
    assert not native_calls
    tokens, logits = _run(engine, prompts, native=True)
    assert native_calls, "the native decode never ran"
    assert tokens == want_tokens
    assert len(logits) == len(want_logits)
    for got, want in zip(logits, want_logits, strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen3-moe", "mixtral"])
def test_every_step_gives_the_same_logits_bit_for_bit(packs_small, native_calls, arch):
    """Chunked prefills (budget 24) beside decodes, then decode-only steps of 3-4 sequences."""
    engine = LLMEngine(cached_model(arch), num_blocks=96, block_size=8, max_num_batched_tokens=24, pack_weights=True)
    prompts = [list(range(5, 45)), [7, 3, 9], list(range(60, 78)), [11] * 13]
    _same_with_and_without(engine, prompts, native_calls)
    plan = engine.model.decode_plan()
    layers = len(engine.model.stage_layers)
    moe = arch in ("qwen3-moe", "mixtral")
    # dense: every layer in one call; routed experts: one call per layer, the experts between them
    assert [len(run.layers) for run in plan.runs] == ([1] * layers if moe else [layers])
    assert set(native_calls) == ({1} if moe else {layers})


def _variant(name: str):
    from transformers import MistralConfig, Qwen3Config, Qwen3MoeConfig

    if name == "sliding-window":
        return MistralConfig(**BASE, sliding_window=5)
    if name == "biases-tied":
        return Qwen3Config(**BASE, head_dim=16, attention_bias=True, tie_word_embeddings=True)
    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
    return Qwen3MoeConfig(**BASE, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                          mlp_only_layers=[1], rope_parameters=rope)


@pytest.mark.parametrize("variant", ["sliding-window", "biases-tied", "partial-rotary-moe"])
def test_config_variants_give_the_same_logits(packs_small, native_calls, tmp_path, variant):
    engine = LLMEngine(save_variant(tmp_path, _variant(variant), scale=0.05, tokenizer=True), num_blocks=64, block_size=4, max_num_batched_tokens=16,
                       pack_weights=True)
    assert engine.model.decode_plan() is not None
    _same_with_and_without(engine, [list(range(3, 24)), [5, 6, 7], list(range(40, 52))], native_calls)
    if variant == "partial-rotary-moe":  # a dense layer between MoE ones joins the next run
        assert [len(run.layers) for run in engine.model.decode_plan().runs] == [1, 2]


def test_it_steps_aside_for_hooks(packs_small, native_calls):
    """A forward hook on any layer (an alignment capture, a probe) sees that layer run on every step, with its
    whole output (the last layer's too: the prefill's rows are then not pruned)."""
    engine = LLMEngine(cached_model("llama"), num_blocks=64, pack_weights=True)
    model = engine.model
    for layer in (model.stage_layers[0], model.stage_layers[-1]):
        seen: list[int] = []
        handle = layer.register_forward_hook(lambda _m, _i, out, seen=seen: seen.append(out.shape[0]))
        try:
            engine.generate([[5, 6, 7, 8]], PARAMS)
        finally:
            handle.remove()
        assert not native_calls and seen == [4] + [1] * (PARAMS.max_tokens - 1)  # the prefill, every decode step
    engine.generate([[5, 6, 7, 8]], PARAMS)
    assert len(native_calls) == PARAMS.max_tokens - 1  # every decode step


def test_layers_it_does_not_cover_run_their_own_forward(monkeypatch, native_calls, caplog):
    """Unpacked weights (the tiny models stay plain) and MLA attention: no plan, the reason logged once, the
    layers' own forwards."""
    monkeypatch.delenv("DAY0_PACK_LAYOUT", raising=False)
    plain = LLMEngine(cached_model("llama"), num_blocks=64, pack_weights=True)
    with caplog.at_level("INFO", logger="agents.runtime.models.decoder"):
        plain.generate([[5, 6, 7]], PARAMS)
    assert plain.model.decode_plan() is None and "not packed as fp32 panels" in plain.model.decode_plan_reason
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("native decode")]
    assert said == ["native decode: not used: layer 0: projections not packed as fp32 panels (--pack-weights)"]
    monkeypatch.setattr(linear, "ONEDNN_MIN_WEIGHT", 0)
    engine = LLMEngine(cached_model("deepseek-v3"), num_blocks=64, pack_weights=True)
    assert engine.model.decode_plan() is None and "not the paged SelfAttention" in engine.model.decode_plan_reason
    engine.generate([[5, 6, 7]], PARAMS)
    assert not native_calls


def test_it_can_be_turned_off_for_a_process(packs_small, native_calls, monkeypatch):
    monkeypatch.setenv("DAY0_NATIVE_DECODE", "off")
    engine = LLMEngine(cached_model("llama"), num_blocks=64, pack_weights=True)
    assert engine.model.native_decode is False
    engine.generate([[5, 6, 7]], PARAMS)
    assert not native_calls


def test_new_caches_and_weights_make_a_new_plan(packs_small, native_calls):
    """The plan holds addresses: after other caches are bound it is made again and reads those (a stale plan would
    attend over the old caches' keys), and loading weights drops it."""
    engine = LLMEngine(cached_model("llama"), num_blocks=64, block_size=8, pack_weights=True)
    model = engine.model
    engine.generate([[3, 4, 5, 6]], PARAMS)
    first = model.decode_plan()
    caches = [tuple(torch.zeros_like(t) for t in (attn.k_cache, attn.v_cache)) for attn in model.attention_layers()]
    model.bind_kv_cache(caches)
    plan = model.decode_plan()
    assert plan is not first and plan.runs[0].layers[0].k_cache == caches[0][0].data_ptr()
    prompt = [[9, 8, 7, 6, 5]]
    native_calls.clear()
    model.native_decode = False
    want = [o.output_token_ids for o in engine.generate(prompt, PARAMS)]
    model.native_decode = True
    assert [o.output_token_ids for o in engine.generate(prompt, PARAMS)] == want and native_calls
    model.load_weights([])
    assert model._decode_plan is False


def test_shapes_past_the_kernels_buffers_are_refused(packs_small, monkeypatch):
    """The plan leaves out a head dimension past the kernels' buffers; the kernel itself refuses one before it
    writes anything."""
    engine = LLMEngine(cached_model("llama"), num_blocks=64, block_size=8, pack_weights=True)
    model = engine.model
    layer = model.stage_layers[0]
    desc, _keep, _fused = native_decode._describe(layer, model.hidden)
    monkeypatch.setattr(kernels, "MAX_HEAD_DIM", layer.self_attn.head_dim - 1)
    assert "past the kernel's buffers" in native_decode._describe(layer, model.hidden)
    desc.head_dim = 1024
    layers = (kernels.DecodeLayer * 1)(desc)
    x = torch.randn(1, model.hidden)
    before = x.clone()
    one = torch.zeros(1, 1, 2, desc.rot // 2)
    delta, normed = torch.zeros_like(x), torch.empty_like(x)
    slots, tables, seqlens = (torch.zeros(1, dtype=torch.int64), torch.zeros(1, 1, dtype=torch.int32),
                              torch.ones(1, dtype=torch.int32))
    assert kernels.decode_scratch(layers, model.hidden, 1) == -1
    assert kernels.decode_layers(x, delta, False, normed, layers, one, one, slots, tables, seqlens, 8) == kernels.DECODE_REFUSED
    scratch = torch.empty(1 << 20)  # the C call itself, past the wrapper's scratch count: refused before writing
    rc = library.lib.day0_decode_layers(x.data_ptr(), delta.data_ptr(), 0, normed.data_ptr(), ctypes.addressof(layers),
                                         1, 1, model.hidden, one.data_ptr(), one.data_ptr(), slots.data_ptr(),
                                         tables.data_ptr(), seqlens.data_ptr(), 8, 1, scratch.data_ptr(), None)
    assert rc == -1 and torch.equal(x, before)


def test_hidden_states_are_asked_of_the_layers_themselves(packs_small, native_calls):
    """A decode step that asks for every layer's hidden states (alignment's paged check) runs the layers."""
    from agents.pipeline.support.models import paged_context

    engine = LLMEngine(cached_model("llama"), num_blocks=64, block_size=8, pack_weights=True)
    model = engine.model
    prompt = torch.tensor([5, 6, 7, 8, 9])
    model.forward(prompt, torch.arange(5), paged_context(0, 5, 4, "cpu"))
    out = model.forward(torch.tensor([3]), torch.tensor([5]), paged_context(5, 1, 4, "cpu"), output_hidden_states=True)
    assert not native_calls and len(out.layer_hidden) == len(model.stage_layers)
    again = model.forward(torch.tensor([3]), torch.tensor([5]), paged_context(5, 1, 4, "cpu"))
    assert native_calls and torch.equal(again.hidden, out.hidden)


def test_a_pipeline_stage_before_the_last_sends_the_whole_stream(packs_small, native_calls, monkeypatch):
    """A stage that is not the last sends its layers' output (the residual with the last MLP's output added), the
    same as the layers' own forwards send."""
    from agents.pipeline.support.models import paged_context
    from agents.runtime.models import decoder

    engine = LLMEngine(cached_model("qwen3"), num_blocks=64, block_size=8, pack_weights=True)
    model = engine.model
    model.forward(torch.tensor([5, 6, 7, 8, 9]), torch.arange(5), paged_context(0, 5, 4, "cpu"))
    sent: list[torch.Tensor] = []
    monkeypatch.setattr(decoder, "send", lambda t, _peer: sent.append(t.clone()))
    monkeypatch.setattr(model, "is_last", False)
    outs = []
    for native in (False, True):
        model.native_decode = native
        outs.append(model.forward(torch.tensor([3]), torch.tensor([5]), paged_context(5, 1, 4, "cpu")).hidden)
    assert native_calls and len(sent) == 2
    assert torch.equal(sent[0], sent[1]) and torch.equal(outs[0], outs[1]) and torch.equal(outs[1], sent[1])


def test_swapped_parameters_run_the_layers_own_forwards(packs_small, native_calls):
    """``torch.func.functional_call`` swaps parameters in for one call: the plan, which points at the model's own,
    steps aside, and the step computes with the swapped ones."""
    from torch.func import functional_call

    from agents.pipeline.support.models import paged_context

    engine = LLMEngine(cached_model("llama"), num_blocks=64, block_size=8, pack_weights=True)
    model = engine.model
    model.forward(torch.tensor([5, 6, 7, 8, 9]), torch.arange(5), paged_context(0, 5, 4, "cpu"))
    step = (torch.tensor([3]), torch.tensor([5]), paged_context(5, 1, 4, "cpu"))
    own = model.forward(*step).hidden
    assert len(native_calls) == 1
    name = "model.layers.0.post_attention_layernorm.weight"
    swapped = {name: dict(model.named_parameters())[name] * 2}
    out = functional_call(model, swapped, step).hidden
    assert len(native_calls) == 1 and not torch.equal(out, own)
    model.native_decode = False
    assert torch.equal(functional_call(model, swapped, step).hidden, out)
    assert torch.equal(model.forward(*step).hidden, own)
