"""Pipeline parallelism (and TP inside each stage, EP independent of TP) over gloo processes reproduces the
single-process logits (fp32, 1e-5) and paged greedy tokens; each rank holds only its stage's tensors."""

from __future__ import annotations

import shutil

import pytest
import torch

from agents.runtime.context import ForwardContext
from agents.runtime.distributed import ParallelState, get_parallel_state, launch, set_parallel_state
from agents.runtime.engine import LLMEngine, SamplingParams
from agents.runtime.loader import load_model
from agents.runtime.models.decoder import StageSkip, stage_layers
from agents.runtime.testing.make_model import cached_model

LENGTHS = [5, 9, 2]
FAMILIES = ["llama", "qwen3", "mixtral", "qwen3-moe", "deepseek-v3"]


def run_model(paths: dict[str, str]) -> dict[str, tuple]:
    """Per model: full-vocab logits of a prompt batch; greedy tokens through the engine (paged KV cache,
    continuous batching; every rank runs the same steps); the layers and parameter count this rank holds."""
    out = {}
    for name, path in paths.items():
        loaded = load_model(path)
        model = loaded.model
        gen = torch.Generator().manual_seed(1)
        prompts = [torch.randint(0, model.config["vocab_size"], (n,), generator=gen) for n in LENGTHS]
        positions = torch.cat([torch.arange(len(p)) for p in prompts])
        hidden = model.forward(torch.cat(prompts), positions, ForwardContext.for_prompts(LENGTHS)).hidden
        logits = model.compute_logits(hidden)
        engine = LLMEngine(path, model=model, config=loaded.config, num_blocks=32, block_size=4)
        greedy = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
        tokens = [o.output_token_ids for o in engine.generate([p.tolist() for p in prompts], greedy)]
        held = [i for i, layer in enumerate(model.model.layers) if not isinstance(layer, StageSkip)]
        out[name] = (logits, tokens, held, model.lm_head is not None, sum(p.numel() for p in model.parameters()))
    return out


def run_layouts(layouts: dict[tuple[int, int, int], list[str]], paths: dict[str, str]) -> dict:
    """Every (tp, ep, pp) layout in the same processes: each adopts the layout, then loads and runs."""
    rank = torch.distributed.get_rank()
    out = {}
    for (tp, ep, pp), names in layouts.items():
        set_parallel_state(tp, ep, rank, pp)
        out[(tp, ep, pp)] = (get_parallel_state(), run_model({n: paths[n] for n in names}))
    return out


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> dict[str, str]:
    """The tiny native families, and a 3-layer Llama with tied embeddings (an uneven 2-stage split, the head on
    the last stage reading the embedding's tensor)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         tie_word_embeddings=True)
    tied = tmp_path_factory.mktemp("tied-llama")
    LlamaForCausalLM(config).save_pretrained(tied, max_shard_size="20KB")
    for name in ("tokenizer.json", "tokenizer_config.json"):  # the engine detokenizes (ids < 97 only here)
        shutil.copy(cached_model("llama") / name, tied / name)
    return {**{name: str(cached_model(name)) for name in FAMILIES}, "tied-llama": str(tied)}


@pytest.fixture(scope="module")
def single(paths) -> dict[str, tuple]:
    return run_model(paths)  # every model, in this process (world size 1)


def _check(per_rank: list[dict], single: dict, layout: tuple[int, int, int], world: int) -> None:
    tp, ep, pp = layout
    for rank, rank_out in enumerate(per_rank):
        state, results = rank_out[layout]
        assert state == ParallelState.of(rank, world, tp, ep, pp)
        for name, (logits, tokens, held, has_head, params) in results.items():
            torch.testing.assert_close(logits, single[name][0], atol=1e-5, rtol=0,
                                       msg=lambda m, n=name, r=rank: f"{n} rank {r} {layout}: {m}")
            assert tokens == single[name][1], (name, rank, layout)
            first, end = stage_layers(len(single[name][2]), pp, state.pp_rank)
            assert held == list(range(first, end)) and has_head == (state.pp_rank == pp - 1)
            if pp > 1 or tp > 1:
                assert params < single[name][4]  # a stage's share (and TP slices) only


TWO_RANKS = {(1, 1, 2): ["deepseek-v3", "tied-llama"]}  # MLA, shared and routed experts; tied head, 3 layers


def test_two_pipeline_stages_match_a_single_process(paths, single) -> None:
    per_rank = launch(run_layouts, 2, TWO_RANKS, paths, timeout=600)
    _check(per_rank, single, (1, 1, 2), 2)


@pytest.mark.slow
def test_two_pipeline_stages_of_every_family_match_a_single_process(paths, single) -> None:
    per_rank = launch(run_layouts, 2, {(1, 1, 2): FAMILIES}, paths, timeout=600)
    _check(per_rank, single, (1, 1, 2), 2)


FOUR_RANKS = {
    (2, 1, 2): FAMILIES + ["tied-llama"],  # TP inside each of two stages
    (2, 2, 1): ["mixtral", "qwen3-moe", "deepseek-v3"],  # EP independent of TP: 2 x 2 over one stage of 4
    (1, 2, 2): ["mixtral", "qwen3-moe"],
    (2, 2, 2): ["qwen3-moe", "deepseek-v3"],
}


@pytest.mark.slow  # four gloo ranks on a 2-core host: about a minute
def test_tp_pp_ep_layouts_over_four_ranks_match_a_single_process(paths, single) -> None:
    per_rank = launch(run_layouts, 4, FOUR_RANKS, paths, timeout=900)
    for layout in FOUR_RANKS:
        _check(per_rank, single, layout, 4)


def test_layouts_that_do_not_fit_the_world_are_refused() -> None:
    with pytest.raises(ValueError, match="pp=3 must divide the world size 4"):
        ParallelState.of(0, 4, 1, 1, 3)
    with pytest.raises(ValueError, match="ep=4 must divide the 2 ranks of a pipeline stage"):
        ParallelState.of(0, 4, 2, 4, 2)
    state = ParallelState.of(3, 4, 2, 2, 1)  # tp=2, ep=2 on 4 ranks: rank 3 is TP rank 1 of replica 1
    assert (state.tp_rank, state.attention_replica, state.ep_rank, state.expert_tp_rank) == (1, 1, 1, 1)
    assert state.group_ranks("tp") == [[0, 1], [2, 3]] and state.group_ranks("stage") == [[0, 1, 2, 3]]
    assert stage_layers(5, 2, 0) == (0, 3) and stage_layers(5, 2, 1) == (3, 5)


@pytest.mark.slow  # two server processes load the model: ~20 s on a busy host
def test_day0_serve_with_two_pipeline_stages_answers_as_one_process(tmp_path) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    import httpx

    from agents.runtime.server.launcher import free_port
    from tests.runtime.served import wait_until_ready

    model_dir = cached_model("qwen3-moe")
    prompts = ["Hello world, this is a test of", "The quick brown fox"]
    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    alone = [o.text for o in LLMEngine(model_dir, num_blocks=64).generate(prompts, greedy)]
    port, log_path = free_port(), tmp_path / "serve.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "day0cli", "serve", str(model_dir), "--pp", "2",
                                 "--port", str(port), "--num-blocks", "64"], stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
                                cwd=Path(__file__).resolve().parents[2])
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until_ready(url, proc, log_path, timeout=180)
            for prompt, expected in zip(prompts, alone, strict=True):
                r = httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 8, "temperature": 0,
                                                              "ignore_eos": True}, timeout=60)
                assert r.status_code == 200 and r.json()["choices"][0]["text"] == expected, r.text
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) == 0, log_path.read_text()[-3000:]
