"""Packed weights (``EngineConfig.pack_weights``), in either layout (the native kernels' panels, oneDNN's blocks):
the same greedy tokens as the plain layout, the packed tensors in place of the originals (never a second copy; a
tied LM head's panels serve the embedding table too), and a packed model refuses a reload."""

from __future__ import annotations

import pytest
import torch

from agents.runtime import kernels
from agents.runtime.engine import LLMEngine, SamplingParams
from agents.runtime.engine.config import EngineConfig
from agents.runtime.kernels import library
from agents.runtime.layers import linear
from agents.runtime.testing.make_model import cached_model

PROMPTS = [[5, 9, 11], list(range(20, 57)), [7] * 12]
PARAMS = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


LAYOUTS = [pytest.param("panels", marks=pytest.mark.skipif(not kernels.available(), reason="no native kernels")),
           pytest.param("onednn", marks=pytest.mark.skipif(not linear._ONEDNN, reason="torch without oneDNN"))]


@pytest.fixture(params=LAYOUTS)
def layout(request, monkeypatch):
    """Each layout in turn; the tiny models' weights are below the size worth packing, so all are packed here."""
    monkeypatch.setenv("DAY0_PACK_LAYOUT", request.param)
    monkeypatch.setattr(linear, "ONEDNN_MIN_WEIGHT", 0)
    return request.param


def _packed_as(param: torch.Tensor, layout: str) -> bool:
    return param.is_mkldnn if layout == "onednn" else getattr(param, "panel_rows", 0) > 0


@pytest.mark.parametrize("arch", ["llama", "qwen3-moe"])
def test_packed_weights_give_the_same_greedy_tokens(layout, arch):
    path = cached_model(arch)
    plain = LLMEngine(path, num_blocks=64)
    packed = LLMEngine(path, num_blocks=64, pack_weights=True)
    names = [n for n, _ in plain.model.named_parameters()]
    assert [n for n, _ in packed.model.named_parameters()] == names  # the same parameters, no extra copy
    done = {n for n, p in packed.model.named_parameters() if linear.is_packed(p)}
    assert done and all(_packed_as(p, layout) for n, p in packed.model.named_parameters() if n in done)
    experts = {n for n in names if n.endswith(("experts.w13", "experts.w2"))}
    assert all(n.startswith("model.layers.") and n.endswith("_proj.weight") or n == "lm_head.weight"
               or n in experts for n in done)
    assert "lm_head.weight" in done  # untied: the LM head is packed too
    # routed experts: panels with the native kernels, their stacked layout otherwise
    assert (experts <= done) if layout == "panels" else not (experts & done)
    want = [o.output_token_ids for o in plain.generate(PROMPTS, PARAMS)]
    assert [o.output_token_ids for o in packed.generate(PROMPTS, PARAMS)] == want


@pytest.mark.skipif(not kernels.available(), reason="no native kernels")
def test_panels_hold_the_weight_and_match_the_plain_product(monkeypatch):
    """Each panel-packed weight holds exactly the plain weight's values (zero rows past ``out``), a packed layer
    computes what the plain one does, bias included, and a packed weight is not packed again."""
    monkeypatch.setattr(linear, "ONEDNN_MIN_WEIGHT", 0)
    monkeypatch.delenv("DAY0_PACK_LAYOUT", raising=False)
    torch.manual_seed(0)
    for out, bias in ((40, True), (48, False), (1, True)):
        layer = linear.ColumnParallelLinear(24, [out], bias=bias)
        with torch.no_grad():
            layer.weight.normal_()
            if bias:
                layer.bias.normal_()
        plain_w = layer.weight.detach().clone()
        x = torch.randn(5, 24)
        want = torch.nn.functional.linear(x, plain_w, layer.bias)
        assert linear.pack_weight(layer)
        w = layer.weight
        assert w.panel_rows == out and w.shape == (-(-out // 16), 24, 16)
        assert torch.equal(w.permute(0, 2, 1).reshape(-1, 24)[:out], plain_w)
        assert not w.permute(0, 2, 1).reshape(-1, 24)[out:].any()
        assert torch.allclose(layer(x), want, atol=1e-5)
        assert not linear.pack_weight(layer)  # packed once


def test_an_unknown_pack_layout_is_refused(monkeypatch):
    monkeypatch.setenv("DAY0_PACK_LAYOUT", "blocked")
    with pytest.raises(ValueError, match="DAY0_PACK_LAYOUT='blocked'"):
        linear.pack_layout()


def test_a_tied_lm_head_stays_the_embedding_table(layout):
    """Tied: one parameter for the table and the head. As panels the head is packed and the table reads its rows
    from them (the same greedy tokens as the plain model, no second copy); oneDNN's blocks leave it plain."""
    path = cached_model("qwen3")  # tie_word_embeddings
    want = [o.output_token_ids for o in LLMEngine(path, num_blocks=64).generate(PROMPTS, PARAMS)]
    engine = LLMEngine(path, num_blocks=64, pack_weights=True)
    model = engine.model
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert _packed_as(model.lm_head.weight, layout) == (layout == "panels")
    assert layout == "onednn" or model.lm_head.weight.panel_rows == model.config["vocab_size"]
    assert any(_packed_as(p, layout) for p in model.parameters())
    assert [o.output_token_ids for o in engine.generate(PROMPTS, PARAMS)] == want


@pytest.mark.skipif(not kernels.available(), reason="no native kernels")
def test_embedding_rows_read_a_panel_packed_table_as_the_plain_one():
    """``embedding_rows`` over panels gives ``F.embedding``'s rows, the last partial panel included, and refuses
    an id past the table (the padding rows are not tokens) as ``F.embedding`` refuses it."""
    from agents.runtime.layers.embedding import embedding_rows

    torch.manual_seed(0)
    table = torch.randn(37, 24)  # 3 panels, the last one 5 of 16 rows
    panels = kernels.pack_panels(table)
    panels.panel_rows = 37
    ids = torch.tensor([0, 15, 16, 36, 5, 5, 32])
    assert torch.equal(embedding_rows(ids, panels), torch.nn.functional.embedding(ids, table))
    assert torch.equal(embedding_rows(ids, table), table[ids])
    assert embedding_rows(ids[:0], panels).shape == (0, 24)
    for bad in (37, 40, -1):
        with pytest.raises(IndexError, match=r"range \[0, 37\)"):
            embedding_rows(torch.tensor([3, bad]), panels)


def test_packed_model_refuses_a_reload(layout):
    engine = LLMEngine(cached_model("llama"), num_blocks=16, pack_weights=True)
    name, param = next((n, p) for n, p in engine.model.named_parameters() if linear.is_packed(p))
    checkpoint = engine.model.mapping.checkpoint_name(name, param.shards[0])
    with pytest.raises(RuntimeError, match="is packed"):
        engine.model.load_weights([(checkpoint, torch.zeros(param.checkpoint_shape(param.shards[0])))])


@pytest.mark.skipif(not kernels.available(), reason="no native kernels")
def test_packed_experts_refuse_a_reload_and_give_tracers_the_stacked_ops(monkeypatch):
    """Routed experts packed as panels: a reload of an expert's weight is refused, and under a dispatch mode (the
    operator inventory) the layer runs its grouped GEMMs over the stacks rebuilt from the panels, computing what
    the kernel does."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from agents.runtime.layers.moe import RoutedExperts

    monkeypatch.delenv("DAY0_PACK_LAYOUT", raising=False)
    engine = LLMEngine(cached_model("qwen3-moe"), num_blocks=16, pack_weights=True)
    experts = next(m for m in engine.model.modules() if isinstance(m, RoutedExperts))
    assert experts.panels and linear.is_packed(experts.w13) and linear.is_packed(experts.w2)
    name, param = next((n, p) for n, p in engine.model.named_parameters() if n.endswith("experts.w2"))
    checkpoint = engine.model.mapping.checkpoint_name(name, param.shards[0])
    with pytest.raises(RuntimeError, match="is packed"):
        engine.model.load_weights([(checkpoint, torch.zeros(param.checkpoint_shape(param.shards[0])))])

    seen: set[str] = set()

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.add(str(func))
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    x = torch.randn(7, experts.hidden)
    ids = torch.stack([torch.randperm(experts.num_experts)[:2] for _ in range(7)])
    weights = torch.softmax(torch.randn(7, 2), -1)
    fast = experts(x, weights, ids)
    with Record():
        traced = experts(x, weights, ids)
    assert any("grouped_mm" in op for op in seen)
    torch.testing.assert_close(traced, fast, rtol=1e-5, atol=1e-5)
    one = experts(x[:1], weights[:1], ids[:1])
    monkeypatch.setattr(library, "state", "unavailable")  # no kernel: one token takes its plain path
    torch.testing.assert_close(experts(x[:1], weights[:1], ids[:1]), one, rtol=1e-5, atol=1e-5)


def test_pack_weights_and_compile_exclude_each_other():
    with pytest.raises(ValueError, match="pack_weights and compile"):
        EngineConfig(pack_weights=True, compile=True)


def test_day0_serve_packs_fp32_cpu_weights_unless_told_or_compiled():
    import argparse

    from agents.runtime.commands.serve import packs_by_default, register

    assert packs_by_default("float32", "cpu", False)
    assert not packs_by_default("float32", "cpu", True)  # the compiled path traces plain weights
    assert not packs_by_default("bfloat16", "cpu", False)
    assert not packs_by_default("float32", "cuda:0", False)
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    assert parser.parse_args(["serve", "m"]).pack_weights is None  # auto
    assert parser.parse_args(["serve", "m", "--pack-weights"]).pack_weights is True
    assert parser.parse_args(["serve", "m", "--no-pack-weights"]).pack_weights is False
