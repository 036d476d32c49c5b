"""DeepSeek-V3 native family against transformers' DeepseekV3 on the same weights (fp32): logits and per-layer
hidden states, greedy decoding through the paged latent cache, TP=2 and EP=2, and the grouped router."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from agents.runtime.context import ForwardContext
from agents.runtime.interface import RuntimeModel

PROMPT_LENGTHS = [5, 13, 3]
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "mscale": 0.707,
        "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1, "rope_theta": 10000.0}


def _build(tmp: Path, variant: str):  # noqa: ANN202 - transformers model
    """A tiny random DeepSeek-V3 with YaRN (softmax mscale on), a non-zero score-correction bias, one dense
    layer then MoE layers. ``kimi-k2``: the same architecture name with Kimi-K2's choices (no q LoRA, a single
    expert group, its own model_type)."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(0)
    kimi = variant == "kimi-k2"
    cfg = DeepseekV3Config(
        vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
        n_group=1 if kimi else 4, topk_group=1 if kimi else 2, first_k_dense_replace=1,
        q_lora_rank=None if kimi else 32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12,
        max_position_embeddings=256, rope_parameters=dict(YARN), routed_scaling_factor=2.5,
        eos_token_id=None, bos_token_id=None, pad_token_id=None, num_nextn_predict_layers=0,
    )
    hf = DeepseekV3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, buf in hf.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.copy_(torch.rand_like(buf) * 0.5)  # steers selection: must not leak into the weights
    hf.save_pretrained(tmp)
    if kimi:
        config = json.loads((tmp / "config.json").read_text())
        config["model_type"] = "kimi_k2"
        (tmp / "config.json").write_text(json.dumps(config))
    return hf


@pytest.fixture(scope="module", params=["deepseek-v3", "kimi-k2"])
def pair(request, tmp_path_factory):  # noqa: ANN001, ANN201
    from agents.runtime.loader import load_model

    model_dir = tmp_path_factory.mktemp(request.param)
    hf = _build(model_dir, request.param)
    result = load_model(model_dir, dtype="float32")
    assert result.report["ok"] and result.report["path"] == "native"
    return hf, result.model, model_dir


def _prompts(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, vocab, (sum(PROMPT_LENGTHS),), generator=g)
    return ids, torch.cat([torch.arange(n) for n in PROMPT_LENGTHS])


def test_logits_and_layer_hidden_states_match_transformers(pair) -> None:  # noqa: ANN001
    hf, model, _ = pair
    assert isinstance(model, RuntimeModel) and model.path == "native"
    ids, positions = _prompts(hf.config.vocab_size)
    out = model(ids, positions, ForwardContext.for_prompts(PROMPT_LENGTHS), output_hidden_states=True)
    logits = model.compute_logits(out.hidden)
    assert len(out.layer_hidden) == hf.config.num_hidden_layers
    start = 0
    for n in PROMPT_LENGTHS:
        with torch.no_grad():
            ref = hf(ids[start : start + n][None], output_hidden_states=True)
        torch.testing.assert_close(logits[start : start + n], ref.logits[0], rtol=0, atol=1e-4)
        # transformers' hidden_states: embeddings, blocks 0..N-2, then the final *normed* state
        for mine, theirs in zip(out.layer_hidden[:-1], ref.hidden_states[1:-1], strict=True):
            torch.testing.assert_close(mine[start : start + n], theirs[0], rtol=0, atol=1e-4)
        torch.testing.assert_close(out.hidden[start : start + n], ref.hidden_states[-1][0], rtol=0, atol=1e-4)
        start += n


class PagedRunner:
    """Drives a model through ``ForwardContext`` with a paged latent cache, as the engine does: chunked
    prefill (later chunks attend to the cached prefix), then batched decode steps."""

    def __init__(self, model, num_blocks: int = 32, block_size: int = 4) -> None:  # noqa: ANN001
        spec = model.kv_cache_spec()
        self.cache = [torch.zeros(num_blocks, block_size, spec.latent_dim) for _ in range(spec.num_layers)]
        model.bind_kv_cache([(c,) for c in self.cache])
        self.model, self.block_size = model, block_size
        self.free = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(3)).tolist()  # scattered
        self.tables: list[list[int]] = []

    def _slot(self, seq: int, pos: int) -> int:
        table = self.tables[seq]
        while len(table) <= pos // self.block_size:
            table.append(self.free.pop())
        return table[pos // self.block_size] * self.block_size + pos % self.block_size

    def step(self, chunks: list[tuple[int, list[int], int]]) -> torch.Tensor:
        """chunks: (sequence, new token ids, tokens already cached). Returns the last-token logits [B, vocab]."""
        while len(self.tables) <= max(c[0] for c in chunks):
            self.tables.append([])
        ids, positions, slots, q_lens, k_lens = [], [], [], [], []
        for seq, tokens, cached in chunks:
            ids += tokens
            positions += list(range(cached, cached + len(tokens)))
            slots += [self._slot(seq, p) for p in range(cached, cached + len(tokens))]
            q_lens.append(len(tokens))
            k_lens.append(cached + len(tokens))
        width = max(len(self.tables[c[0]]) for c in chunks)
        tables = torch.full((len(chunks), width), -1, dtype=torch.int32)
        for row, (seq, _, _) in enumerate(chunks):
            tables[row, : len(self.tables[seq])] = torch.tensor(self.tables[seq], dtype=torch.int32)
        cu = torch.zeros(len(chunks) + 1, dtype=torch.int32)
        cu[1:] = torch.cumsum(torch.tensor(q_lens), 0)
        ctx = ForwardContext(cu_seqlens_q=cu, seqlens_k=torch.tensor(k_lens, dtype=torch.int32),
                             max_seqlen_q=max(q_lens), max_seqlen_k=max(k_lens),
                             slot_mapping=torch.tensor(slots, dtype=torch.int64), block_tables=tables,
                             is_decode=all(n == 1 for n in q_lens))
        out = self.model(torch.tensor(ids), torch.tensor(positions), ctx)
        return self.model.compute_logits(out.hidden[cu[1:].long() - 1])


@pytest.mark.parametrize("pair", ["deepseek-v3", pytest.param("kimi-k2", marks=pytest.mark.slow)], indirect=True)
def test_greedy_decode_through_the_paged_latent_cache_equals_transformers(pair) -> None:  # noqa: ANN001
    hf, model, _ = pair
    spec = model.kv_cache_spec()
    assert spec.kind == "mla" and spec.latent_dim == 16 + 8 and spec.num_layers == 3
    prompts = [[3, 141, 59, 26, 5, 35, 89], [97, 9, 32], [38, 46, 26, 43, 38, 32, 79, 50, 28]]
    steps = 32
    runner = PagedRunner(model)
    # chunked prefill: prompt 0 and 2 arrive in two chunks, the second attending to the cached first
    runner.step([(0, prompts[0][:4], 0), (2, prompts[2][:5], 0)])
    logits = runner.step([(0, prompts[0][4:], 4), (1, prompts[1], 0), (2, prompts[2][5:], 5)])
    outputs = [[int(t)] for t in logits.argmax(-1)]
    for _ in range(steps - 1):
        logits = runner.step([(i, [outputs[i][-1]], len(p) + len(outputs[i]) - 1) for i, p in enumerate(prompts)])
        for i, t in enumerate(logits.argmax(-1).tolist()):
            outputs[i].append(t)
    for prompt, mine in zip(prompts, outputs, strict=True):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=steps, do_sample=False)
        assert mine == ref[0, len(prompt) :].tolist()
    # the cache holds the compressed latent of every token, not per-head K/V
    assert all(c.shape[-1] == spec.latent_dim for c in runner.cache)


def test_cache_binding_and_config_errors_name_the_problem(pair) -> None:  # noqa: ANN001
    from agents.runtime.models.registry import build_model

    _, model, model_dir = pair
    with pytest.raises(ValueError, match="layer 0: expected \\(latent_cache,\\)"):
        model.bind_kv_cache([(torch.zeros(4, 4, 7),)] * 3)
    with pytest.raises(ValueError, match="got 1 cache tuples for 3 layers"):
        model.bind_kv_cache([(torch.zeros(4, 4, 24),)])
    config = json.loads((model_dir / "config.json").read_text())
    del config["kv_lora_rank"]
    with pytest.raises(ValueError, match="'kv_lora_rank'"):
        build_model(config)


def test_multi_token_prediction_layers_in_the_checkpoint_are_ignored(pair) -> None:  # noqa: ANN001
    _, model, model_dir = pair
    config = json.loads((model_dir / "config.json").read_text())
    from agents.runtime.models.registry import build_model

    with_mtp = build_model({**config, "num_nextn_predict_layers": 1})
    assert with_mtp.is_ignored("model.layers.3.self_attn.kv_b_proj.weight")
    assert not with_mtp.is_ignored("model.layers.2.self_attn.kv_b_proj.weight")
    assert not model.is_ignored("model.layers.3.self_attn.kv_b_proj.weight")


def _rank_logits(model_dir: str, lengths: list[int], vocab: int) -> torch.Tensor:
    """One rank of a TP/EP run: load (each rank takes its slice), forward the prompts, return full logits."""
    from agents.runtime.loader import load_model

    model = load_model(model_dir, dtype="float32").model
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, vocab, (sum(lengths),), generator=g)
    positions = torch.cat([torch.arange(n) for n in lengths])
    out = model(ids, positions, ForwardContext.for_prompts(lengths))
    runner = PagedRunner(model)
    runner.step([(0, ids[: lengths[0]].tolist(), 0)])
    decode = runner.step([(0, [int(ids[0])], lengths[0])])
    return torch.cat([model.compute_logits(out.hidden), decode])


@pytest.mark.parametrize(
    "variant", ["deepseek-v3", pytest.param("kimi-k2", marks=pytest.mark.slow)]
)
@pytest.mark.parametrize("layout", [{"tp_size": 2, "ep_size": 1}, {"tp_size": 1, "ep_size": 2}],
                         ids=["tp2", "ep2"])
@pytest.mark.slow
def test_tensor_and_expert_parallel_match_a_single_process(variant, layout, tmp_path) -> None:  # noqa: ANN001
    """Two gloo processes: TP splits heads, dense and shared-expert intermediates and the vocab; EP splits the
    routed experts. Prefill logits and a paged decode step equal the single-process run."""
    from agents.runtime.distributed import launch

    hf = _build(tmp_path, variant)
    single = _rank_logits(str(tmp_path), PROMPT_LENGTHS, hf.config.vocab_size)
    ranks = launch(_rank_logits, 2, str(tmp_path), PROMPT_LENGTHS, hf.config.vocab_size, **layout)
    for logits in ranks:
        torch.testing.assert_close(logits, single, rtol=0, atol=1e-5)


def test_the_shared_tiny_test_model_matches_transformers() -> None:
    """The suite's cached tiny DeepSeek-V3 (make_model) loads natively and matches transformers."""
    from transformers import AutoModelForCausalLM

    from agents.runtime.loader import load_model
    from agents.runtime.testing.make_model import cached_model

    model_dir = cached_model("deepseek-v3")
    model = load_model(model_dir, dtype="float32").model
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids, positions = _prompts(hf.config.vocab_size)
    logits = model.compute_logits(model(ids, positions, ForwardContext.for_prompts(PROMPT_LENGTHS)).hidden)
    start = 0
    for n in PROMPT_LENGTHS:
        with torch.no_grad():
            ref = hf(ids[start : start + n][None]).logits[0]
        torch.testing.assert_close(logits[start : start + n], ref, rtol=0, atol=1e-4)
        start += n


@pytest.mark.parametrize("groups", [(4, 2), (1, 1), (8, 3)], ids=["4g-top2", "1g", "8g-top3"])
def test_grouped_router_picks_the_same_experts_and_weights_as_transformers(groups) -> None:  # noqa: ANN001
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    from agents.runtime.layers.grouped_router import GroupedTopKRouter

    n_group, topk_group = groups
    torch.manual_seed(0)
    cfg = DeepseekV3Config(hidden_size=32, n_routed_experts=16, num_experts_per_tok=4, n_group=n_group,
                           topk_group=topk_group, routed_scaling_factor=2.5, norm_topk_prob=True)
    ref = DeepseekV3TopkRouter(cfg)
    with torch.no_grad():
        ref.weight.normal_()
        ref.e_score_correction_bias.copy_(torch.rand(16))
    mine = GroupedTopKRouter(32, 16, 4, n_group=n_group, topk_group=topk_group, scaling_factor=2.5)
    mine.weight.weight_loader(mine.weight, ref.weight.detach())
    mine.e_score_correction_bias.weight_loader(mine.e_score_correction_bias, ref.e_score_correction_bias)
    x = torch.randn(64, 32)
    _, ref_w, ref_ids = ref(x)
    weights, ids = mine(x)
    order, ref_order = ids.argsort(-1), ref_ids.argsort(-1)  # both pick sets; compare them in expert order
    assert torch.equal(ids.gather(1, order), ref_ids.gather(1, ref_order))
    torch.testing.assert_close(weights.gather(1, order), ref_w.gather(1, ref_order), rtol=0, atol=1e-6)


def test_grouped_router_limits_groups_and_keeps_the_bias_out_of_the_weights() -> None:
    from agents.runtime.layers.grouped_router import grouped_topk

    # 4 experts in 2 groups. Expert 0 scores best alone, but group {2, 3} scores best as a pair.
    logits = torch.tensor([[3.0, -3.0, 2.0, 2.0]])
    weights, ids = grouped_topk(logits, top_k=2, n_group=2, topk_group=1, renormalize=False)
    assert sorted(ids[0].tolist()) == [2, 3]
    torch.testing.assert_close(weights[0], torch.sigmoid(torch.tensor([2.0, 2.0])))
    # a bias on expert 1 changes the choice (group {0, 1} now wins) but not the weights of what is chosen
    bias = torch.tensor([0.0, 5.0, 0.0, 0.0])
    weights, ids = grouped_topk(logits, 2, 2, 1, correction_bias=bias, renormalize=False, scaling_factor=2.0)
    chosen = ids[0].tolist()
    assert sorted(chosen) == [0, 1]
    torch.testing.assert_close(weights[0], 2.0 * torch.sigmoid(logits[0, chosen]))
    with pytest.raises(ValueError, match="n_group=3 must divide the number of experts 4"):
        grouped_topk(logits, 2, 3, 1)
