"""Tensor-parallel serving on one host: rank 0 runs the engine (scheduler, sampler, HTTP server); every rank
holds its shard of the weights and of the KV cache, and runs the same forward pass. Rank 0 broadcasts each
step's inputs (plain lists) and ``None`` to stop."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
import torch.multiprocessing as mp

if TYPE_CHECKING:
    from agents.runtime.nodes import NodeSpec

log = logging.getLogger(__name__)


def broadcast_from_rank0(obj: Any) -> Any:
    """Send ``obj`` from rank 0 to every rank; return what rank 0 sent."""
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


STATS_PREFIX = "day0/stats"
STATS_TIMEOUT_S = 10.0
_STORE_AT: list[tuple[str, int]] = []  # where the rendezvous store of this server's ranks listens (rank 0 holds it)


def _store_client(timeout: float = 30.0) -> Any:
    addr, port = _STORE_AT[0]
    return dist.TCPStore(addr, port, None, False, timeout=timedelta(seconds=timeout))


class RankStats:
    """Rank 0 asks every other rank for its counters through the rendezvous store, beside the steps: no
    collective (the engine thread owns those) and no device synchronisation on the serving path. Each worker
    answers from a thread (``serve_stats``): its collective timer's totals and its stage's expert counts."""

    def __init__(self, world: int, timeout: float = STATS_TIMEOUT_S) -> None:
        self.world, self.timeout = world, timeout
        self.store = _store_client()
        self.asked = 0
        self._lock = threading.Lock()

    def ask(self, command: str) -> dict[int, dict[str, Any]]:
        """Every other rank's answer to ``command`` ("enable", "disable", "snapshot", "experts"), by rank;
        RuntimeError naming the ranks that did not answer within the timeout."""
        with self._lock:
            self.asked += 1
            n = self.asked
            self.store.set(f"{STATS_PREFIX}/req/{n}", command)
            keys = {r: f"{STATS_PREFIX}/resp/{n}/{r}" for r in range(1, self.world)}
            try:
                self.store.wait(list(keys.values()), timedelta(seconds=self.timeout))
            except RuntimeError:
                missing = [r for r, k in keys.items() if not self.store.check([k])]
                raise RuntimeError(f"ranks {missing} did not report their counters within {self.timeout:g} s") \
                    from None
            out = {r: json.loads(self.store.get(k)) for r, k in keys.items()}
            for key in (*keys.values(), f"{STATS_PREFIX}/req/{n}"):
                self.store.delete_key(key)
            return out


def serve_stats(rank: int, expert_load: Any, stop: threading.Event) -> None:
    """A worker's answers to rank 0's ``RankStats`` (a thread; it ends when ``stop`` is set or rank 0's store
    is gone). It waits a second at a time so the worker can join it before the process ends (a thread left in
    the store's wait aborts the exit)."""
    from agents.runtime.distributed import COMM_TIMER, get_parallel_state

    store = _store_client()
    state = get_parallel_state()
    n = 1
    while not stop.is_set():
        key = f"{STATS_PREFIX}/req/{n}"
        try:
            store.wait([key], timedelta(seconds=1))
            command = store.get(key).decode()
        except RuntimeError:  # nothing asked this second, or rank 0 and its store are gone
            try:
                store.check([key])
            except RuntimeError:
                return
            continue
        answer: dict[str, Any] = COMM_TIMER.local_snapshot()
        if command == "enable":
            COMM_TIMER.enable(True)
        elif command == "disable":
            COMM_TIMER.enable(False)
        elif command == "experts":
            answer = {"pp_rank": state.pp_rank, "stage_rank": state.stage_rank,
                      "counts": expert_load.counts() if expert_load is not None and expert_load.active else []}
        store.set(f"{STATS_PREFIX}/resp/{n}/{rank}", json.dumps(answer))
        n += 1


def _all_stage_counts(engine: Any, stats: RankStats) -> Any:
    """Rank 0's ``expert_load.counts`` over every pipeline stage: stage 0's layers (its own), then each later
    stage's from that stage's first rank (the ranks of a stage route the same tokens)."""
    own = engine.expert_load.counts

    def counts() -> list[list[int]]:
        stages = {0: own()}
        for answer in stats.ask("experts").values():
            if answer["stage_rank"] == 0 and answer["pp_rank"] > 0:
                stages[answer["pp_rank"]] = answer["counts"]
        return [row for p in sorted(stages) for row in stages[p]]

    return counts


def attach(engine: Any) -> None:
    """Rank 0: tell the workers the pool size, then send them every step; collect their counters on ask."""
    from agents.runtime.distributed import COMM_TIMER, get_pp_world_size
    from agents.runtime.engine.rank_failure import StepGuard

    broadcast_from_rank0((engine.blocks.num_blocks, engine.blocks.block_size))
    engine.runner.broadcast = broadcast_from_rank0
    engine.runner.execute = StepGuard(engine.runner, engine.runner.execute)  # a failed step stops every rank
    if _STORE_AT:
        stats = RankStats(dist.get_world_size())
        stats.store.set(f"{STATS_PREFIX}/alive", "1")
        COMM_TIMER.peers = stats.ask  # the overhead ratio on every rank (``/stats/comm``)
        if get_pp_world_size() > 1 and engine.expert_load.active:  # every stage's MoE layers (``/stats/experts``)
            engine.expert_load.counts = _all_stage_counts(engine, stats)


def worker(model_dir: str, dtype: str, device: str, bind_threads: bool | None = False,
           pack_weights: bool = False, quant_mode: str = "auto") -> None:
    """Ranks > 0: load this rank's shard, size the cache as rank 0 says, run every step rank 0 sends (this
    thread's compute threads pinned first, as ``bind_threads`` says, on a CPU; its weights packed as rank 0's
    engine packs its own when ``pack_weights``: a rank on the unpacked path made every step wait for it)."""
    from agents.runtime.engine.model_runner import ModelRunner
    from agents.runtime.engine.rank_failure import fail_worker, inject_fault
    from agents.runtime.loader import load_model

    if bind_threads is not False and str(device).startswith("cpu"):
        from agents.runtime.threads import bind_engine_threads

        bind_engine_threads(bind_threads)  # this thread runs every step
    result = load_model(model_dir, dtype=dtype, device=device, quant_mode=quant_mode, pack_weights=pack_weights)
    model = result.model
    if pack_weights:  # packed by the load, before the KV pool takes the memory, as rank 0
        log.info("packed %d weights", result.report["packed_weights"])
    num_blocks, block_size = broadcast_from_rank0(None)
    runner = ModelRunner(model, device, block_size, num_blocks)
    rank, step = dist.get_rank(), 0
    stop, stats = threading.Event(), None
    if _STORE_AT:
        from agents.runtime.engine.expert_load import ExpertLoad

        stats = threading.Thread(target=serve_stats, args=(rank, ExpertLoad(model), stop), name="rank-stats",
                                 daemon=True)
        stats.start()
    try:
        while (inputs := broadcast_from_rank0(None)) is not None:
            step += 1
            inject_fault(rank, step)
            runner.execute(inputs)
    except Exception as exc:  # never leave rank 0 waiting in a collective: exit, it sees the connection close
        fail_worker(rank, exc)
    stop.set()
    if stats is not None:
        stats.join(timeout=5)


def _rank_main(rank: int, world: int, port: int, model_dir: str, serve_kwargs: dict[str, Any],
               layout: tuple[int, int, int] | None = None, node: NodeSpec | None = None) -> None:
    from agents.runtime.distributed import destroy_distributed, init_distributed

    if node is None:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))
    _STORE_AT.append((node.master_addr, node.master_port) if node is not None else ("127.0.0.1", port))
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s")
    # the backend follows the serving device, not whether a GPU exists: a CPU run on a GPU host stays on gloo
    device = str(serve_kwargs.get("device", "cpu"))
    backend = "nccl" if device.startswith("cuda") else "gloo"
    tp, ep, pp = layout or (world, 1, 1)
    if device.startswith("cpu"):  # the host's CPUs split between its ranks
        from agents.runtime.threads import setup_rank_threads

        local = list(node.global_ranks(world)) if node is not None else list(range(world))
        serve_kwargs = {**serve_kwargs, "bind_threads": setup_rank_threads(
            serve_kwargs.get("bind_threads"), len(local), local.index(rank))}
    try:
        init_distributed(rank, world, tp_size=tp, ep_size=ep, pp_size=pp, backend=backend,
                         timeout=float(os.environ.get("DAY0_TP_TIMEOUT_S", 300)), node=node)
    except RuntimeError as exc:  # a rendezvous that timed out names the missing node: say it, exit non-zero
        from agents.runtime.engine.rank_failure import fail_worker

        fail_worker(rank, exc)
    if node is not None:  # another host's failing rank is named on rank 0 through the rendezvous store
        from agents.runtime.engine.rank_failure import share_errors

        share_errors(_store_client(), world)
    try:
        if rank == 0:
            from agents.runtime.engine.rank_failure import failure
            from agents.runtime.server.launcher import serve

            code = serve(model_dir, on_engine=attach, **serve_kwargs)  # the other ranks follow every step
            sys.exit(1 if failure() else code)
        worker(model_dir, serve_kwargs.get("dtype", "float32"), device, serve_kwargs.get("bind_threads", False),
               bool(serve_kwargs.get("pack_weights")), serve_kwargs.get("quant_mode", "auto"))
    finally:
        destroy_distributed()


def serve_tp(model_dir: str | Path, tp: int, pp: int = 1, ep: int = 1, node: NodeSpec | None = None,
             **serve_kwargs: Any) -> int:
    """``day0 serve --tp N [--pp P --ep E]``: ``pp × max(tp, ep)`` processes (the planner's device count), rank
    0 serving HTTP; returns rank 0's exit code.

    ``node`` (``--nnodes/--node-rank/--master-addr/--master-port``): those ranks split over the nodes, this host
    running its share (``node.global_ranks``). Node 0 holds rank 0 and serves HTTP; every other node runs worker
    ranks only and returns when they end (after rank 0 stops them, or fails)."""
    from agents.runtime.distributed import free_port
    from agents.runtime.engine.rank_failure import ERROR_DIR_ENV, watch_ranks

    world = pp * max(tp, ep)
    ranks = list(node.global_ranks(world)) if node is not None else list(range(world))
    ctx = mp.get_context("spawn")
    port = node.master_port if node is not None else free_port()
    errors = Path(tempfile.mkdtemp(prefix="day0-tp-"))
    os.environ[ERROR_DIR_ENV] = str(errors)  # the ranks inherit it
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, str(model_dir), serve_kwargs, (tp, ep, pp), node))
             for r in ranks]
    for p in procs:
        p.start()
    if ranks[0] != 0:
        return _follow_ranks(procs, ranks, errors)

    stopping = []

    def stop(signum: int, frame: Any) -> None:
        stopping.append(signum)
        os.kill(procs[0].pid, signal.SIGTERM)  # rank 0 shuts down and releases the workers

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    failed = watch_ranks(procs, errors, stopping)
    for p in procs[1:]:
        p.join(timeout=10)
        if p.is_alive():
            p.terminate()
    shutil.rmtree(errors, ignore_errors=True)
    if failed:
        log.error("tensor-parallel server failed: %s", failed)
        print(f"day0 serve: {failed}", file=sys.stderr, flush=True)
        return 1
    code = procs[0].exitcode or 0
    # uvicorn re-raises the SIGTERM it handled gracefully; that is a clean stop we asked for
    return 0 if stopping and code == -signal.SIGTERM else (code if code >= 0 else 128 - code)


def _follow_ranks(procs: list[Any], ranks: list[int], errors: Path) -> int:
    """A node without rank 0: wait for its worker ranks (rank 0 stops them when it ends); 0 when every one
    ended cleanly, else 1 with the first error a rank recorded. SIGTERM ends them here (rank 0 then sees its
    peers gone and stops too)."""
    from agents.runtime.engine.rank_failure import read_errors

    def stop(signum: int, frame: Any) -> None:
        for p in procs:
            if p.is_alive():
                p.terminate()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for p in procs:
        p.join()
    found = read_errors(folder=errors)
    shutil.rmtree(errors, ignore_errors=True)
    codes = {r: p.exitcode for r, p in zip(ranks, procs, strict=True) if p.exitcode}
    if not codes:
        return 0
    first = next(iter(found.values()), None) or ", ".join(f"rank {r} exited with code {c}" for r, c in codes.items())
    print(f"day0 serve: worker ranks {ranks[0]}-{ranks[-1]} ended: {first}", file=sys.stderr, flush=True)
    return 1
