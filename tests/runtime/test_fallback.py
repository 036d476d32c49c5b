"""The generic fallback runs an architecture with no native implementation through its own transformers code
and matches transformers on the same weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from agents.runtime.context import ForwardContext
from agents.runtime.interface import RuntimeModel
from agents.runtime.models.fallback import FallbackError, FallbackModel

PROMPT_LENGTHS = [5, 9, 3]


def _tiny(arch: str):  # noqa: ANN202 - transformers model
    import transformers

    torch.manual_seed(0)
    if arch == "GPT2LMHeadModel":  # tied embeddings, learned positions
        cfg = transformers.GPT2Config(vocab_size=320, n_embd=32, n_layer=2, n_head=4, n_positions=128,
                                      bos_token_id=0, eos_token_id=None)
    else:  # GPTNeoXForCausalLM: partial rotary, parallel residual, untied head
        cfg = transformers.GPTNeoXConfig(vocab_size=320, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=64, max_position_embeddings=128, bos_token_id=0,
                                         eos_token_id=None, rotary_pct=0.5)
    return getattr(transformers, arch)(cfg).eval()


@pytest.fixture(scope="module", params=["GPT2LMHeadModel", "GPTNeoXForCausalLM"])
def saved(request, tmp_path_factory):  # noqa: ANN001, ANN201
    hf = _tiny(request.param)
    out = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(out)
    return hf, out


def _checkpoint(model_dir: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        return {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 - safe_open has no __iter__


def _fallback(model_dir: Path) -> FallbackModel:
    """Through the real loader: the registry has no native class for these architectures, so it builds the
    fallback, and the loader's strict checks run against the fallback's on-disk names."""
    from agents.runtime.loader import load_model

    result = load_model(model_dir, dtype="float32")
    assert result.report["path"] == "fallback" and result.report["ok"]
    assert isinstance(result.model, FallbackModel)
    return result.model


def _block_outputs(hf, ids: torch.Tensor) -> list[torch.Tensor]:  # noqa: ANN001
    """transformers' per-block outputs (before the final norm), captured with hooks like the fallback does."""
    from agents.runtime.models.fallback import _decoder_layers

    captured: list[torch.Tensor] = []
    layers = _decoder_layers(hf, hf.config.num_hidden_layers)
    hooks = [m.register_forward_hook(lambda _m, _i, o: captured.append(o[0] if isinstance(o, tuple) else o))
             for m in layers]
    try:
        with torch.no_grad():
            hf(ids[None])
    finally:
        for h in hooks:
            h.remove()
    return [c[0] for c in captured]


def test_fallback_matches_transformers_on_a_batch_of_prompts(saved) -> None:  # noqa: ANN001
    hf, model_dir = saved
    model = _fallback(model_dir)
    assert isinstance(model, RuntimeModel) and model.path == "fallback"
    assert model.kv_cache_spec() is not None and model.decode_path == "paged"  # whole prompts: still transformers'
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, hf.config.vocab_size, (sum(PROMPT_LENGTHS),), generator=g)
    positions = torch.cat([torch.arange(n) for n in PROMPT_LENGTHS])
    out = model(ids, positions, ForwardContext.for_prompts(PROMPT_LENGTHS), output_hidden_states=True)
    logits = model.compute_logits(out.hidden)
    assert logits.shape == (sum(PROMPT_LENGTHS), hf.config.vocab_size)
    start = 0
    for n in PROMPT_LENGTHS:
        seq = ids[start : start + n]
        with torch.no_grad():
            ref = hf(seq[None], output_hidden_states=True)
        # same modeling code, same weights, same shapes: the hidden states are bit-identical
        assert torch.equal(out.hidden[start : start + n], ref.hidden_states[-1][0])
        for mine, theirs in zip(out.layer_hidden, _block_outputs(hf, seq), strict=True):
            assert torch.equal(mine[start : start + n], theirs)
        # the head runs once over all prompts ([T, H] instead of [1, n, H]): matmul blocking may differ by an ulp
        torch.testing.assert_close(logits[start : start + n], ref.logits[0], rtol=0, atol=1e-6)
        assert torch.equal(logits[start : start + n].argmax(-1), ref.logits[0].argmax(-1))
        start += n


def test_fallback_greedy_decode_equals_transformers_generate(saved) -> None:  # noqa: ANN001
    hf, model_dir = saved
    model = _fallback(model_dir)
    prompt = torch.tensor([5, 17, 42, 7, 99, 3])
    with torch.no_grad():
        ref = hf.generate(prompt[None], max_new_tokens=16, do_sample=False, pad_token_id=0)
    tokens = prompt.tolist()
    for _ in range(16):  # no cache: the whole sequence is recomputed every step, as the engine does
        ids = torch.tensor(tokens)
        out = model(ids, torch.arange(len(tokens)), ForwardContext.for_prompts([len(tokens)]))
        tokens.append(int(model.compute_logits(out.hidden[-1:]).argmax(-1)))
    assert tokens == ref[0].tolist()


def test_fallback_loading_is_strict_and_names_the_tensor(saved) -> None:  # noqa: ANN001
    _, model_dir = saved
    config = json.loads((model_dir / "config.json").read_text())
    weights = _checkpoint(model_dir)
    victim = sorted(weights)[-1]
    with pytest.raises(FallbackError, match=f"missing tensor '{victim}'"):
        FallbackModel(config).load_weights((k, v) for k, v in weights.items() if k != victim)
    with pytest.raises(FallbackError, match="unexpected tensor 'extra.weight'"):
        FallbackModel(config).load_weights([*weights.items(), ("extra.weight", torch.zeros(2))])
    bad = dict(weights, **{victim: torch.zeros(*weights[victim].shape, 2)})
    with pytest.raises(FallbackError, match=f"tensor '{victim}' has shape"):
        FallbackModel(config).load_weights(bad.items())


def test_loader_refuses_a_fallback_checkpoint_missing_a_tensor(saved, tmp_path) -> None:  # noqa: ANN001
    from safetensors.torch import save_file

    from agents.runtime.loader import LoadError, load_model

    _, model_dir = saved
    weights = _checkpoint(model_dir)
    victim = sorted(weights)[0]
    (tmp_path / "config.json").write_text((model_dir / "config.json").read_text())
    save_file({k: v.contiguous() for k, v in weights.items() if k != victim}, str(tmp_path / "model.safetensors"))
    with pytest.raises(LoadError, match=f"missing tensor '{victim}'"):
        load_model(tmp_path)
    save_file({**weights, "extra.weight": torch.zeros(3)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(LoadError, match="unexpected tensor 'extra.weight'"):
        load_model(tmp_path)


def test_registry_builds_the_fallback_only_for_architectures_without_a_native_family() -> None:
    from agents.runtime.models.registry import build_model, model_class_for

    config = {**_tiny("GPTNeoXForCausalLM").config.to_dict(), "architectures": ["GPTNeoXForCausalLM"]}
    assert model_class_for("GPTNeoXForCausalLM") is None
    assert build_model(config).path == "fallback"
    assert model_class_for("LlamaForCausalLM") is not None


def test_fallback_refuses_unknown_model_types() -> None:
    with pytest.raises(FallbackError, match="model_type 'no_such_model'"):
        FallbackModel({"model_type": "no_such_model", "architectures": ["NoSuchForCausalLM"]})
    with pytest.raises(FallbackError, match="no 'model_type'"):
        FallbackModel({"architectures": ["NoSuchForCausalLM"]})


def test_fallback_loads_per_expert_checkpoints_into_fused_experts(tmp_path) -> None:  # noqa: ANN001
    """transformers fuses MoE experts in memory but saves them per expert; the fallback maps them back."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.MixtralConfig(vocab_size=256, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, num_local_experts=3,
                                     num_experts_per_tok=2, eos_token_id=None)
    hf = transformers.MixtralForCausalLM(cfg).eval()
    hf.save_pretrained(tmp_path)
    model = FallbackModel(json.loads((tmp_path / "config.json").read_text()))  # Mixtral is native: build directly
    model.load_weights(_checkpoint(tmp_path).items())
    assert "model.layers.1.block_sparse_moe.experts.2.w1.weight" in model.expected_tensors()  # on-disk names, not fused ones
    ids = torch.tensor([3, 9, 27, 81, 243, 1])
    out = model(ids, torch.arange(6), ForwardContext.for_prompts([6]))
    with torch.no_grad():
        ref = hf(ids[None], output_hidden_states=True)
    assert torch.equal(out.hidden, ref.hidden_states[-1][0])
