"""The native decode of tensor-parallel ranks (``native_decode.DecodePlan`` under ``--tp 2``): each rank runs its shard
of the layers in one native call, the O and down projections' partial sums all-reduced inside the call through the
shared-memory segment. Its greedy tokens equal one process's; every step's logits equal the ranks' torch path
(the layers' own forwards, a Python all-reduce per projection) bit for bit, chunked prefills beside decodes
included, and sums cut in pieces larger than a slot; one rank may take either path on a step; MoE layers between the runs sum through the Python all-reduce
on the same sequence; a group without the segment keeps the torch path with the reason; a peer that is gone or
abandoned its step ends the wait with an error, not a hang."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist

from agents.runtime import distributed, kernels
from agents.runtime.distributed import ShmAllReduce, launch, shm_allreduce
from agents.runtime.engine import LLMEngine, SamplingParams
from agents.runtime.testing.make_model import cached_model

pytestmark = pytest.mark.skipif(not kernels.available(), reason="no native kernels")

PARAMS = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
PROMPTS = [list(range(5, 45)), [7, 3, 9], list(range(60, 78)), [11] * 13]
ARCHES = ("llama", "qwen3-moe", "qwen3-biases")  # the last: QK-norm, attention biases (O's added after the sum)
SMALL_SLOT = 40  # floats: below one row of the tiny models' hidden size


@pytest.fixture(autouse=True)
def panels(monkeypatch):
    """Weights packed as panels (the layout the native decode reads), in this process and the ranks it starts."""
    monkeypatch.delenv("DAY0_PACK_LAYOUT", raising=False)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    """Each arch's model directory, built here (not raced by the ranks)."""
    from transformers import Qwen3Config

    from tests.runtime.variants import save_variant

    config = Qwen3Config(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                         attention_bias=True)
    biased = save_variant(tmp_path_factory.mktemp("qwen3-biases"), config, scale=0.05, tokenizer=True)
    return {"llama": str(cached_model("llama")), "qwen3-moe": str(cached_model("qwen3-moe")),
            "qwen3-biases": str(biased)}


def _engine(model_dir: str) -> LLMEngine:
    """The test models' weights are below the size worth packing: a rank packs them all (its own process)."""
    from agents.runtime.layers import linear

    linear.ONEDNN_MIN_WEIGHT = 0
    return LLMEngine(model_dir, num_blocks=96, block_size=8, max_num_batched_tokens=24, pack_weights=True)


def _generate(engine: LLMEngine, native: bool) -> tuple[list[list[int]], list[torch.Tensor], int]:
    """Greedy outputs, every step's logits, and the native calls made, with the native decode on or off."""
    engine.model.native_decode = native
    logits: list[torch.Tensor] = []
    calls = [0]
    execute, real = engine.runner.execute, kernels.decode_layers

    def recording(inputs):
        out, prompt = execute(inputs)
        if out is not None:
            logits.append(out.clone())
        return out, prompt

    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    engine.runner.execute, kernels.decode_layers = recording, counted
    try:
        tokens = [o.output_token_ids for o in engine.generate(PROMPTS, PARAMS)]
    finally:
        del engine.runner.execute
        kernels.decode_layers = real
    return tokens, logits, calls[0]


def tp_paths(models: dict[str, str], arches: tuple[str, ...], pieces: bool) -> dict:
    """Per arch, on this rank: the torch path's and the native run's tokens and logits, and a run where only rank
    0 takes the native decode; with ``pieces``, llama again over a segment of small slots."""
    rank = dist.get_rank()
    out: dict = {"shm": shm_allreduce.active() is not None}
    for arch in arches:
        engine = _engine(models[arch])
        plan = engine.model.decode_plan()
        want = _generate(engine, native=False)
        got = _generate(engine, native=True)
        mixed = _generate(engine, native=rank == 0)
        out[arch] = {"plan": None if plan is None else [len(run.layers) for run in plan.runs],
                     "reason": engine.model.decode_plan_reason, "torch": want, "native": got, "mixed": mixed,
                     "layers": len(engine.model.stage_layers)}
    if pieces:  # a segment of small slots: each step's [B, hidden] sums go in pieces, cut alike on both paths
        shm_allreduce.stop()
        ShmAllReduce.SLOT = SMALL_SLOT
        shm_allreduce.start(rank, dist.get_world_size(), "gloo", 60.0, None)
        engine = _engine(models["llama"])
        out["pieces"] = {"hidden": engine.model.hidden, "torch": _generate(engine, native=False),
                         "native": _generate(engine, native=True)}
    return out


@pytest.fixture(scope="module")
def single(models) -> Callable[[str], list[list[int]]]:
    """One process: the tokens ``--tp 2`` must give, per arch (each made once)."""
    from agents.runtime.layers import linear

    made: dict[str, list[list[int]]] = {}

    def tokens(arch: str) -> list[list[int]]:
        if arch not in made:
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(linear, "ONEDNN_MIN_WEIGHT", 0)
                mp.delenv("DAY0_PACK_LAYOUT", raising=False)
                made[arch] = _generate(_engine(models[arch]), native=True)[0]
        return made[arch]

    return tokens


def _check(per_rank: list[dict], arches: tuple[str, ...], single: Callable[[str], list[list[int]]]) -> None:
    for rank, result in enumerate(per_rank):
        assert result["shm"] is True
        for arch in arches:
            r = result[arch]
            moe = arch == "qwen3-moe"
            # dense: every layer in one call; routed experts: one call per layer, the experts between them
            assert r["plan"] == ([1] * r["layers"] if moe else [r["layers"]]), (arch, r["reason"])
            (t_tokens, t_logits, t_calls), (n_tokens, n_logits, n_calls) = r["torch"], r["native"]
            assert t_calls == 0 and n_calls > 0, arch
            assert n_tokens == t_tokens == single(arch), (arch, rank)
            assert len(n_logits) == len(t_logits)
            for got, want in zip(n_logits, t_logits, strict=True):  # the same collectives: the same bits
                assert torch.equal(got, want), arch
            m_tokens, m_logits, m_calls = r["mixed"]
            assert (m_calls > 0) == (rank == 0) and m_tokens == t_tokens
            assert all(torch.equal(g, w) for g, w in zip(m_logits, t_logits, strict=True))
        pieces = result.get("pieces")
        if pieces is not None:
            assert pieces["hidden"] > SMALL_SLOT and pieces["native"][2] > 0
            assert pieces["native"][0] == pieces["torch"][0] == single("llama")
            assert all(torch.equal(g, w) for g, w in zip(pieces["native"][1], pieces["torch"][1], strict=True))
    for arch in arches:  # every rank computed the same logits
        assert all(torch.equal(a, b) for a, b in zip(per_rank[0][arch]["native"][1], per_rank[1][arch]["native"][1],
                                                     strict=True))


def test_tp_ranks_decode_natively_with_the_all_reduce_inside(models, single):
    """The dense Llama: ~10 s on a busy 2-core host (two ranks start)."""
    _check(launch(tp_paths, 2, models, ("llama",), False, timeout=300), ("llama",), single)


@pytest.mark.slow  # three models in each rank, and a second segment: ~25 s on a busy 2-core host
def test_tp_native_decode_across_variants_mixed_paths_and_pieces(models, single):
    _check(launch(tp_paths, 2, models, ARCHES, True, timeout=300), ARCHES, single)


def without_segment() -> tuple[str | None, int, bool]:
    engine = _engine(str(cached_model("llama")))
    engine.generate([PROMPTS[1]], PARAMS)
    return engine.model.decode_plan_reason, engine.model.native_decode_steps, shm_allreduce.active() is None


@pytest.mark.slow  # two more ranks: ~10 s
def test_a_group_without_the_shared_memory_all_reduce_keeps_the_torch_path(monkeypatch):
    monkeypatch.setenv("DAY0_SHM_ALLREDUCE", "0")
    for reason, steps, no_shm in launch(without_segment, 2, timeout=180):
        assert no_shm and steps == 0
        assert reason == ("tensor-parallel projections (2 ranks) without the shared-memory all-reduce (ranks on "
                          "more than one host, DAY0_SHM_ALLREDUCE=0, or a segment that could not be made)")


def peer_fails(how: str) -> str:
    """Rank 1 leaves (its process ends) or abandons its step before a decode step rank 0 runs natively."""
    import time

    from agents.pipeline.support.models import paged_context

    model = _engine(str(cached_model("llama"))).model
    model.forward(torch.tensor([5, 6, 7, 8, 9]), torch.arange(5), paged_context(0, 5, 4, "cpu"))
    assert model.decode_plan() is not None, model.decode_plan_reason
    if dist.get_rank() == 1:
        if how == "abandon":
            distributed.abandon_collectives()
            dist.barrier()
        return how
    if how == "abandon":
        dist.barrier()
    started = time.monotonic()
    try:
        model.forward(torch.tensor([3]), torch.tensor([5]), paged_context(5, 1, 4, "cpu"))
    except RuntimeError as exc:
        return f"{type(exc).__name__}: {exc} after {time.monotonic() - started:.1f} s"
    return "no error"


@pytest.mark.slow  # two more ranks each: ~8-12 s
@pytest.mark.parametrize("how", ["leave", "abandon"])
def test_a_peer_gone_or_abandoned_mid_run_ends_the_wait_with_an_error(how):
    said = launch(peer_fails, 2, how, timeout=120)[0]
    if how == "leave":
        assert said.startswith("RuntimeError: all-reduce: rank 1 is gone (its process ended mid-step)"), said
        assert float(said.split(" after ")[1].split()[0]) < 10
    else:
        assert said.startswith("CollectiveAbandoned: all-reduce: another rank abandoned the step (it failed)"), said
