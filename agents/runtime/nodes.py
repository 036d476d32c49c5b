"""Ranks across hosts, the torchrun convention: ``nnodes`` nodes each run ``local`` ranks (global rank
``node_rank × local + local_rank``); they meet at the master's address and port, where global rank 0 (on node 0)
holds the rendezvous store.

The rendezvous is bounded and says who is missing: every rank writes its key into the store, rank 0 waits for
all of them until ``timeout`` and then names the nodes (and their ranks) that never came; the ranks that did come
read the same sentence from the store instead of waiting for ever. A node that cannot reach the master at all is
told so, naming the address. The process group is then formed on that store (gloo on CPU, NCCL on CUDA)."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from contract.nodes import MAX_NODES

KEY_PREFIX = "day0/rendezvous"
POLL_S = 0.05


class RendezvousTimeout(RuntimeError):
    """The ranks did not all meet in time; the message names the missing nodes or the unreachable master."""


@dataclass(frozen=True)
class NodeSpec:
    """This host's place among ``nnodes``: its ``node_rank`` and where the ranks meet."""

    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    timeout: float = 300.0  # seconds for every node to arrive

    def __post_init__(self) -> None:
        if isinstance(self.nnodes, bool) or not isinstance(self.nnodes, int) or not 1 <= self.nnodes <= MAX_NODES:
            raise ValueError(f"nnodes must be an integer in [1, {MAX_NODES}], got {self.nnodes!r}")
        if isinstance(self.node_rank, bool) or not isinstance(self.node_rank, int) \
                or not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node rank {self.node_rank!r} is outside the {self.nnodes} node(s) (0 to {self.nnodes - 1})")
        if not isinstance(self.master_addr, str) or not self.master_addr.strip() or len(self.master_addr) > 253 \
                or any(c.isspace() for c in self.master_addr):
            raise ValueError(f"master address {self.master_addr!r} must be a host name or IP address")
        if isinstance(self.master_port, bool) or not isinstance(self.master_port, int) \
                or not 1 <= self.master_port <= 65535:
            raise ValueError(f"master port must be in [1, 65535], got {self.master_port!r}")
        if not 0 < float(self.timeout) <= 86400:
            raise ValueError(f"rendezvous timeout must be in (0, 86400] seconds, got {self.timeout!r}")

    @property
    def multi(self) -> bool:
        return self.nnodes > 1

    def local_world(self, world: int) -> int:
        """Ranks each node runs; ValueError when ``world`` does not split into whole nodes."""
        if world < 1 or world % self.nnodes:
            raise ValueError(f"{world} rank(s) do not split over {self.nnodes} nodes: each node runs the same "
                             "number of ranks (whole nodes)")
        return world // self.nnodes

    def global_ranks(self, world: int) -> range:
        """The global ranks this node runs."""
        local = self.local_world(world)
        return range(self.node_rank * local, (self.node_rank + 1) * local)

    def node_of(self, rank: int, world: int) -> int:
        return rank // self.local_world(world)

    def with_port(self, offset: int) -> NodeSpec:
        """The same nodes meeting at ``master_port + offset`` (one rendezvous per group of processes)."""
        port = self.master_port + offset
        if not 1 <= port <= 65535:
            raise ValueError(f"master port {self.master_port} + {offset} is outside [1, 65535]")
        return NodeSpec(self.nnodes, self.node_rank, self.master_addr, port, self.timeout)

    def as_args(self) -> list[str]:
        """The command-line flags that say the same (``day0 serve``, ``day0 adapt``)."""
        return ["--nnodes", str(self.nnodes), "--node-rank", str(self.node_rank), "--master-addr", self.master_addr,
                "--master-port", str(self.master_port), "--rendezvous-timeout", f"{float(self.timeout):g}"]


def _missing(store: Any, world: int) -> list[int]:
    keys = [f"{KEY_PREFIX}/rank/{r}" for r in range(world)]
    return [r for r, key in enumerate(keys) if not store.check([key])]


def _names(ranks: list[int], local: int) -> str:
    nodes: dict[int, list[int]] = {}
    for r in ranks:
        nodes.setdefault(r // local, []).append(r)
    return ", ".join(f"node {n} (rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))})"
                     for n, rs in sorted(nodes.items()))


def rendezvous(rank: int, world: int, node: NodeSpec) -> Any:
    """Meet every rank of ``world`` at the master; returns the store the process group forms on.

    Rank 0 serves the store. RendezvousTimeout names the nodes that never came (every rank that came raises it),
    or, on a node that cannot reach the master, the master's address."""
    local = node.local_world(world)
    where = f"{node.master_addr}:{node.master_port}"
    bound = timedelta(seconds=float(node.timeout))
    started = time.monotonic()
    try:
        store = dist.TCPStore(node.master_addr, node.master_port, None, rank == 0, timeout=bound,
                              wait_for_workers=False)
    except (RuntimeError, OSError) as exc:  # DistNetworkError is a RuntimeError
        if rank == 0:
            raise RendezvousTimeout(f"node 0 cannot hold the rendezvous at {where}: {exc}") from None
        raise RendezvousTimeout(f"node {rank // local} (rank {rank}) could not reach the rendezvous master {where} "
                                f"(node 0) within {node.timeout:g} s: {type(exc).__name__}") from None
    store.set(f"{KEY_PREFIX}/rank/{rank}", socket.gethostname())
    verdict_key = f"{KEY_PREFIX}/verdict"
    if rank == 0:
        while missing := _missing(store, world):
            if time.monotonic() - started > node.timeout:
                message = (f"rendezvous at {where} timed out after {node.timeout:g} s: {_names(missing, local)} of "
                           f"{node.nnodes} node(s) never joined")
                store.set(verdict_key, message)
                time.sleep(0.5)  # the ranks that came read the verdict before the store goes away
                raise RendezvousTimeout(message)
            time.sleep(POLL_S)
        store.set(verdict_key, "ok")
        return store
    try:
        store.wait([verdict_key], bound + timedelta(seconds=5))
        verdict = store.get(verdict_key).decode()
    except (RuntimeError, OSError) as exc:
        raise RendezvousTimeout(f"rank {rank} (node {rank // local}) heard nothing from the rendezvous master "
                                f"{where} within {node.timeout:g} s: {type(exc).__name__}") from None
    if verdict != "ok":
        raise RendezvousTimeout(verdict)
    return store


def init_node_group(rank: int, world: int, node: NodeSpec, backend: str, timeout: float | None = None) -> None:
    """Rendezvous, then form the default process group on that store (``timeout`` bounds each collective)."""
    store = rendezvous(rank, world, node)
    bound = {} if timeout is None else {"timeout": timedelta(seconds=timeout)}
    dist.init_process_group(backend, store=dist.PrefixStore("day0/pg", store), rank=rank, world_size=world, **bound)


@dataclass(frozen=True)
class _Nodes:
    """The planner's view of these hosts: ``devices_per_node`` ranks each, separate memories."""

    devices_per_node: int
    shared_memory: bool = False


def node_layout_problem(config: dict[str, Any], tp: int, pp: int, ep: int, node: NodeSpec) -> str | None:
    """Why a TP × PP × EP layout cannot run over ``node.nnodes`` hosts, or None: a model the runtime runs on the
    transformers fallback (``models/native.config_runtime_path``, from the config alone) takes no degree above 1,
    on one host too; its ``pp × max(tp, ep)`` ranks split into whole nodes, and the planner's rules hold with a
    node of that many ranks (TP inside a node, PP spanning whole nodes). ValueError when the config names no
    architecture."""
    from contract.model.native import single_device_reason

    single = single_device_reason(config)
    if single:
        for name, value in (("tp", tp), ("pp", pp), ("ep", ep)):
            if value > 1:
                return f"{name}={value} cannot run: {single}"
    world = pp * max(tp, ep)
    try:
        local = node.local_world(world)
    except ValueError as exc:
        return f"tp={tp}, ep={ep}, pp={pp}: {exc}"
    if not node.multi:
        return None
    from contract.model.spec import parse_config
    from contract.planner.search import layout_problem

    problem = layout_problem(parse_config(config), _Nodes(local), tp, pp, ep, single_device=single)
    return None if problem is None else f"{problem} ({node.nnodes} nodes of {local} rank(s) each)"
