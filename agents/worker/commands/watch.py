"""``day0 jobs watch``: follows a job live over its WebSocket (polling ``events/?after=`` when it cannot
connect), one progress line per stage, then the tier."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from agents.worker.commands.portal import TERMINAL_STATES, ask, portal_client

WAITING_POLL_SECONDS = 5.0  # how often `jobs watch` asks whether a dispatched job is stuck


class ProgressView:
    """One line per stage: a bar while it runs, its outcome when it ends; then the tier."""

    WIDTH = 30

    def __init__(self, out: Any = sys.stdout) -> None:
        self.out = out
        self.passed: dict[str, bool] = {}
        self.last_seq = 0
        self.node_seq: dict[int, int] = {}  # a multi-node job's other nodes: the last seq shown of each
        self._live = False
        self._waiting_shown = False

    def _line(self, text: str, final: bool) -> None:
        if self.out.isatty():
            self.out.write("\r\033[K" + text + ("\n" if final else ""))
        elif final:
            self.out.write(text + "\n")
        self.out.flush()
        self._live = not final

    def event(self, ev: dict[str, Any]) -> None:
        seq = int(ev.get("seq") or 0)
        if seq <= self.last_seq:
            return  # a replay overlapping what was shown
        self.last_seq = seq
        kind, stage, data = ev.get("kind"), ev.get("stage") or "-", ev.get("data") or {}
        if kind == "progress" and data.get("total"):
            done, total = int(data.get("done", 0)), int(data["total"])
            fill = int(self.WIDTH * done / max(total, 1))
            bar = "#" * fill + "." * (self.WIDTH - fill)
            self._line(f"{stage:<9} [{bar}] {done}/{total} {data.get('what', '')}", final=False)
        elif kind == "stage_started":
            self._line(f"{stage:<9} [{'.' * self.WIDTH}] started", final=False)
        elif kind == "stage_finished":
            ok = bool(data.get("passed"))
            self.passed[data.get("stage") or stage] = ok
            mark = "passed" if ok else f"FAILED: {data.get('error')}"
            self._line(f"{stage:<9} [{'#' * self.WIDTH if ok else '!' * self.WIDTH}] {mark} "
                       f"({data.get('seconds', 0)} s)", final=True)
        elif ev.get("level") in ("warning", "error"):
            lines = str(ev.get("message") or "").strip().splitlines()
            self._line(f"{stage:<9} {ev.get('level')}: {lines[-1] if lines else kind}", final=True)
            if kind == "stuck":
                self._waiting_shown = True

    def node_event(self, node: int, ev: dict[str, Any]) -> None:
        """An event of node ``node`` > 0 (its own sequence): its stage starts, ends, warnings and errors, on
        lines tagged with the node; its progress is left to node 0's bar, and its outcomes do not make the
        tier (node 0's report does)."""
        seq = int(ev.get("seq") or 0)
        if seq <= self.node_seq.get(node, 0):
            return
        self.node_seq[node] = seq
        kind, stage, data = ev.get("kind"), ev.get("stage") or "-", ev.get("data") or {}
        tag = f"node {node}"
        if kind == "stage_started":
            self._line(f"{tag} {stage:<9} started", final=True)
        elif kind == "stage_finished":
            ok = bool(data.get("passed", True)) and ev.get("level") != "error"
            self._line(f"{tag} {stage:<9} {'finished' if ok else 'FAILED'}: {ev.get('message') or kind}",
                       final=True)
        elif ev.get("level") in ("warning", "error"):
            lines = str(ev.get("message") or "").strip().splitlines()
            self._line(f"{tag} {stage:<9} {ev.get('level')}: {lines[-1] if lines else kind}", final=True)

    def waiting(self, reason: str | None) -> None:
        """Says once why a dispatched job is not claimed (the job's ``waiting_reason``), until it is."""
        if reason and not self._waiting_shown:
            self._line(f"waiting: {reason}", final=True)
        self._waiting_shown = bool(reason)

    def finish(self, job: dict[str, Any]) -> int:
        from contract.tiers import TIER_NAMES, compute_tier

        tier = job.get("tier")
        if tier is None:
            tier = compute_tier(self.passed)
        line = f"job {job.get('id')} {job.get('state')}: tier {tier} ({TIER_NAMES.get(int(tier), '?')})"
        if job.get("failed_stage"):
            line += f", failed at {job['failed_stage']}: {job.get('error')}"
        self._line(line, final=True)
        return 0 if job.get("state") == "succeeded" else 1


def _ws_url(portal: str, job_id: int, after: int, token: str | None,
            nodes_after: dict[int, int] | None = None) -> str:
    from urllib.parse import urlencode

    base = portal.rstrip("/").replace("https://", "wss://", 1).replace("http://", "ws://", 1)
    query: dict[str, Any] = {"after": after}
    if nodes_after:
        query["nodes_after"] = ",".join(f"{n}:{s}" for n, s in sorted(nodes_after.items()))
    query.update({"token": token} if token else {})
    return f"{base}/ws/jobs/{job_id}/?{urlencode(query)}"


def run_watch(args: argparse.Namespace) -> int:
    """Follows the job over its WebSocket; falls back to polling ``events/?after=`` when it cannot connect."""
    from agents.worker.client import PortalError

    view = ProgressView()
    view.last_seq = args.after
    with portal_client(args) as client:
        job = ask("watch", client.get_job, args.job_id)
        view.waiting(job.get("waiting_reason"))
        try:
            if job.get("state") not in TERMINAL_STATES:
                _watch_ws(args, view, client)
        except PortalError as exc:
            print(f"day0 jobs watch: {exc}", file=sys.stderr)
            return 1
        except Exception as exc:  # noqa: BLE001 — no WebSocket (proxy, old portal): poll instead
            print(f"(websocket unavailable: {exc}; polling)", file=sys.stderr)
        while True:
            _poll_events(client, args.job_id, view, int(job.get("nodes") or 1))
            job = client.get_job(args.job_id)
            view.waiting(job.get("waiting_reason"))
            if job.get("state") in TERMINAL_STATES:
                _poll_events(client, args.job_id, view, int(job.get("nodes") or 1))
                return view.finish(job)
            time.sleep(1.0)


def _poll_events(client: Any, job_id: int, view: ProgressView, nodes: int) -> None:
    """The stored events after those shown: the job's own, then each other node's sequence."""
    for ev in client.job_events(job_id, after=view.last_seq):
        view.event(ev)
    for node in range(1, min(max(nodes, 1), 1024)):
        for ev in client.job_events(job_id, after=view.node_seq.get(node, 0), node=node):
            view.node_event(node, ev)


def _watch_ws(args: argparse.Namespace, view: ProgressView, client: Any) -> None:
    """Follows the job's WebSocket until it ends; every ``WAITING_POLL_SECONDS`` of silence it asks the portal
    whether the job waits unclaimed (and says why) or ended."""
    from websockets.sync.client import connect

    # the portal checks Origin against its allowed hosts, as it does for browsers
    origin = args.portal.rstrip("/")
    with connect(_ws_url(args.portal, args.job_id, view.last_seq, args.token, view.node_seq), open_timeout=10,
                 origin=origin) as ws:
        while True:
            try:
                raw = ws.recv(timeout=WAITING_POLL_SECONDS)
            except TimeoutError:
                job = client.get_job(args.job_id)
                view.waiting(job.get("waiting_reason"))
                if job.get("state") in TERMINAL_STATES:
                    return
                continue
            message = json.loads(raw)
            if message.get("type") == "job.events":
                for ev in message.get("events", []):
                    view.event(ev)
            elif message.get("type") == "job.node_events":
                for ev in message.get("node_events", []):
                    view.node_event(int(message.get("node") or 0), ev)
            elif message.get("type") == "job.state" and message.get("state") in TERMINAL_STATES:
                if message["state"] != "lost" or client.get_job(args.job_id).get("state") == "lost":
                    return
