"""Tensor and expert parallelism over 2 gloo processes reproduce the single-process logits (fp32, 1e-5)."""

from __future__ import annotations

import pytest
import torch

from agents.runtime.context import ForwardContext
from agents.runtime.distributed import get_ep_world_size, get_tp_world_size, launch, set_parallel_state
from agents.runtime.loader import load_model
from agents.runtime.models.simple_decode import greedy_decode
from agents.runtime.testing.make_model import cached_model

LENGTHS = [5, 9, 2]


def _prompts(vocab: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(0, vocab, (n,), generator=gen) for n in LENGTHS]


def run_model(arches: list[str]) -> dict[str, tuple]:
    """Per arch: full-vocab logits of a prompt batch, 8 paged greedy tokens, and the TP/EP layout seen."""
    out = {}
    for arch in arches:
        model = load_model(arch if "/" in arch else cached_model(arch)).model
        prompts = _prompts(model.config["vocab_size"])
        positions = torch.cat([torch.arange(len(p)) for p in prompts])
        hidden = model.forward(torch.cat(prompts), positions, ForwardContext.for_prompts(LENGTHS)).hidden
        tokens = greedy_decode(model, [p.tolist() for p in prompts], 8, block_size=4)
        out[arch] = (model.compute_logits(hidden), tokens, get_tp_world_size(), get_ep_world_size())
    return out


@pytest.fixture(scope="module")
def odd_llama(tmp_path_factory) -> str:
    """One KV head (replicated across TP ranks) and a vocabulary that does not split evenly."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=128)
    path = tmp_path_factory.mktemp("odd-llama")
    LlamaForCausalLM(config).save_pretrained(path, max_shard_size="30KB")
    return str(path)


@pytest.fixture(scope="module")
def single(odd_llama):
    for arch in ("llama", "qwen3", "mixtral", "qwen3-moe"):
        cached_model(arch)  # built once here, not raced by the ranks
    return run_model(["llama", "qwen3", "mixtral", "qwen3-moe", odd_llama])


LAYOUTS = {(2, 1): ["llama", "qwen3", "qwen3-moe"], (1, 2): ["mixtral", "qwen3-moe"], (2, 2): ["mixtral"]}


def run_layouts(odd_llama: str) -> dict:
    """All TP/EP layouts in one pair of processes: every collective runs over the same world group, so only
    the ranks' view of the layout changes between them."""
    rank = torch.distributed.get_rank()
    out = {}
    for (tp, ep), arches in LAYOUTS.items():
        set_parallel_state(tp, ep, rank)
        out[(tp, ep)] = run_model(arches + ([odd_llama] if (tp, ep) == (2, 1) else []))
    return out


@pytest.fixture(scope="module")
def parallel(single, odd_llama) -> list[dict]:
    return launch(run_layouts, 2, odd_llama)


def _check(results: list[dict], single: dict, tp: int, ep: int) -> None:
    for rank_out in results:
        for arch, (logits, tokens, tp_seen, ep_seen) in rank_out.items():
            assert (tp_seen, ep_seen) == (tp, ep)
            torch.testing.assert_close(logits, single[arch][0], atol=1e-5, rtol=0, msg=lambda m, a=arch: f"{a}: {m}")
            assert tokens == single[arch][1], arch


@pytest.mark.parametrize("tp,ep", list(LAYOUTS), ids=["tp2", "ep2", "tp2-ep2"])
def test_parallel_layout_matches_single_process(parallel, single, tp, ep):
    results = [rank_out[(tp, ep)] for rank_out in parallel]
    assert set(results[0]) >= set(LAYOUTS[(tp, ep)])
    _check(results, single, tp, ep)


def _fail() -> None:
    raise ValueError("boom on purpose")


def test_launch_reports_the_failing_rank():
    with pytest.raises(RuntimeError, match=r"rank \d of 2 failed.*: ValueError: boom on purpose"):
        launch(_fail, 2)


def _fail_on_rank_1() -> None:
    if torch.distributed.get_rank() == 1:
        raise ValueError("rank 1 gives up")
    torch.distributed.barrier()  # rank 0 would wait here forever for its dead peer


def test_launch_ends_ranks_blocked_on_a_failed_peer():
    cause = r"rank 1 of 2 failed \(ranks \[0\] failed after it\): ValueError: rank 1 gives up"
    with pytest.raises(RuntimeError, match=cause):
        launch(_fail_on_rank_1, 2)
