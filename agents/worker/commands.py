"""``day0 agent`` (a Celery worker for one hardware pool) and ``day0 jobs submit|watch|list|cancel`` (vendors'
terminal). Refusals print as sentences naming the field the portal objected to (``client.PortalError``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

# "lost" as the REST API shows it is final (the attempts ran out): a re-queued job is queued again in the same
# transaction. Over the WebSocket a "lost" is followed by "queued" when the job is re-queued.
TERMINAL_STATES = ("succeeded", "failed", "cancelled", "lost")
JOB_STATES = ("queued", "dispatched", "running", "succeeded", "failed", "cancelled", "lost")
WAITING_POLL_SECONDS = 5.0  # how often `jobs watch` asks whether a dispatched job is stuck


def register(subparsers: Any) -> None:
    agent = subparsers.add_parser("agent", help="run an adaptation agent for one hardware pool")
    agent.add_argument("--hardware", required=True, help="hardware slug; the agent consumes queue hw.<slug>")
    agent.add_argument("--portal", default=os.environ.get("DAY0_PORTAL_URL", "http://127.0.0.1:8000"))
    agent.add_argument("--token", default=os.environ.get("DAY0_AGENT_TOKEN"),
                       help="agent token bound to the hardware; prefer DAY0_AGENT_TOKEN or --token-file: a command "
                            "line is visible to every user in ps")
    agent.add_argument("--token-file", type=Path, default=None,
                       help="file holding the agent token (mode 0600: readable by its owner only)")
    agent.add_argument("--models-dir", default=os.environ.get("DAY0_AGENT_MODELS_DIR", ""),
                       help="folder holding <model-slug>/ with config.json and weights")
    agent.add_argument("--broker", default=None, help="broker URL (default: DAY0_AGENT_BROKER, else DAY0_REDIS_URL, else the filesystem broker)")
    agent.add_argument("--device", default=os.environ.get("DAY0_AGENT_DEVICE"), help="torch device (default: cuda if present)")
    agent.add_argument("--hostname", default=None, help="name of this agent (default: the host name)")
    agent.add_argument("--heartbeat", type=float, default=float(os.environ.get("DAY0_AGENT_HEARTBEAT", "5")))
    agent.add_argument("--address", default=os.environ.get("DAY0_AGENT_ADDRESS"),
                       help="address the other nodes of a multi-node job reach this host at, when it is node 0 "
                            "(default: the host name's address)")
    agent.add_argument("--rendezvous-port", type=int,
                       default=int(os.environ.get("DAY0_AGENT_RENDEZVOUS_PORT", "29500")),
                       help="first port of the range (3 per job) a multi-node job's ranks meet at on node 0")
    agent.set_defaults(handler=run_agent)

    jobs = subparsers.add_parser("jobs", help="submit, watch, list and cancel adaptation jobs")
    jobs_sub = jobs.add_subparsers(dest="jobs_command", metavar="ACTION")
    jobs.set_defaults(handler=lambda _args: (jobs.print_help(), 2)[1])
    submit = jobs_sub.add_parser("submit", help="submit a job")
    submit.add_argument("--model", required=True)
    submit.add_argument("--hardware", required=True)
    submit.add_argument("--stages", default=None, help="comma-separated stages (default: all)")
    submit.add_argument("--dtype", default=None,
                        help="target dtype, as `day0 estimate` takes it (float32, bf16, fp16, fp8, int8, mxfp4 …)")
    for degree, what in (("tp", "tensor-parallel degree"), ("pp", "pipeline stages"), ("ep", "expert-parallel degree")):
        submit.add_argument(f"--{degree}", type=_bounded_int(1, 4096), default=None,
                            help=f"pin the plan's {what} (the portal checks it against the planner's rules)")
    submit.add_argument("--watch", action="store_true", help="watch the job after submitting it")
    _portal_args(submit)
    submit.set_defaults(handler=run_submit)
    watch = jobs_sub.add_parser("watch", help="follow a job live: a progress bar per stage, then the tier")
    watch.add_argument("job_id", type=int)
    watch.add_argument("--after", type=int, default=0, help="replay events after this seq")
    _portal_args(watch)
    watch.set_defaults(handler=run_watch)
    lister = jobs_sub.add_parser("list", help="list jobs you may see, newest first")
    lister.add_argument("--state", choices=JOB_STATES)
    lister.add_argument("--model", default=None, help="model slug")
    lister.add_argument("--hardware", default=None, help="hardware slug")
    lister.add_argument("--limit", type=_bounded_int(1, 500), default=20, help="at most this many (1-500)")
    lister.add_argument("--json", action="store_true", help="the API's rows as JSON")
    _portal_args(lister)
    lister.set_defaults(handler=run_list)
    cancel = jobs_sub.add_parser("cancel", help="cancel a queued, dispatched or running job")
    cancel.add_argument("job_id", type=int)
    _portal_args(cancel)
    cancel.set_defaults(handler=run_cancel)


def _bounded_int(low: int, high: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is outside {low}-{high}")
        return value

    return parse


def job_dtype(name: str | None) -> str | None:
    """The portal's name of a dtype given as ``day0 estimate`` takes it (``fp8`` → ``float8_e4m3fn``)."""
    if name is None:
        return None
    from agents.runtime.planner.memory import ALIASES

    return ALIASES.get(name.strip().lower(), name.strip())


def _portal_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--portal", default=os.environ.get("DAY0_PORTAL_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--token", default=os.environ.get("DAY0_TOKEN"), help="API token (or DAY0_TOKEN)")


# ---------------------------------------------------------------- day0 agent


def _token_from_file(path: Path) -> str:
    """The token in ``path``, which only its owner may read (a 0600 file); SystemExit(2) naming what is wrong."""
    try:
        mode = path.stat().st_mode
        token = path.read_text().strip()
    except OSError as exc:
        raise SystemExit(f"day0 agent: --token-file {path} cannot be read: {exc.strerror}") from None
    if mode & 0o077:
        raise SystemExit(f"day0 agent: --token-file {path} is readable by others (mode {mode & 0o777:o}); "
                         f"chmod 600 it")
    if not token:
        raise SystemExit(f"day0 agent: --token-file {path} is empty")
    return token


def run_agent(args: argparse.Namespace) -> int:
    if args.token_file is not None:
        args.token = _token_from_file(args.token_file)
    elif args.token and any(a == "--token" or a.startswith("--token=") for a in sys.argv[1:]):
        print("day0 agent: warning: --token on the command line is visible to every user in ps; "
              "use DAY0_AGENT_TOKEN or --token-file", file=sys.stderr)
    if args.broker and "@" in args.broker and any(a == "--broker" or a.startswith("--broker=") for a in sys.argv[1:]):
        print("day0 agent: warning: a broker URL with a password on the command line is visible to every user in ps; "
              "use DAY0_AGENT_BROKER", file=sys.stderr)
    if not args.token:
        print("day0 agent: --token (or DAY0_AGENT_TOKEN) is required: an agent token bound to the hardware",
              file=sys.stderr)
        return 2
    env = {"DAY0_AGENT_PORTAL": args.portal, "DAY0_AGENT_TOKEN": args.token, "DAY0_AGENT_HARDWARE": args.hardware,
           "DAY0_AGENT_MODELS_DIR": args.models_dir or ""}
    if args.device:
        env["DAY0_AGENT_DEVICE"] = args.device
    if args.hostname:
        env["DAY0_AGENT_HOSTNAME"] = args.hostname
    if args.broker:
        env["DAY0_AGENT_BROKER"] = args.broker
    os.environ.update(env)
    import logging

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per event batch and heartbeat is noise

    from agents.pipeline.support.environment import environment_lock
    from agents.worker.agent_state import STATE
    from agents.worker.app import app, consume, queue_name, run_worker, worker_argv
    from agents.worker.client import PortalClient, PortalError
    from agents.worker.heartbeat import Heartbeat
    from agents.worker.lifecycle import install_stop_on_shutdown

    client = PortalClient(STATE.portal_url, STATE.token)
    versions = environment_lock(STATE.device)
    if not 1024 <= args.rendezvous_port <= 60000:
        print(f"day0 agent: --rendezvous-port must be in [1024, 60000], got {args.rendezvous_port}", file=sys.stderr)
        return 2
    capabilities = {"device": STATE.device, "device_name": versions.get("device"),
                    "device_count": versions.get("device_count"), "dispatch_key": versions.get("dispatch_key"),
                    "queue": queue_name(args.hardware), "address": args.address or _host_address(),
                    "rendezvous_port": args.rendezvous_port}
    for attempt in range(60):
        try:
            agent = client.register_agent(hostname=STATE.hostname, capabilities=capabilities, versions=versions)
            break
        except PortalError as exc:
            if exc.status in (401, 403):
                print(f"day0 agent: the portal refused the token: {exc}", file=sys.stderr)
                return 2
            if exc.status and exc.status < 500:
                print(f"day0 agent: registration refused: {exc}", file=sys.stderr)
                return 2
            print(f"day0 agent: portal not reachable ({exc}); retrying ({attempt + 1}/60)", file=sys.stderr)
            time.sleep(2)
    else:
        return 1
    STATE.agent_id = int(agent["id"])
    os.environ["DAY0_AGENT_ID"] = str(STATE.agent_id)
    queues = consume(app, args.hardware, STATE.agent_id)  # and its own: a multi-node job's node
    print(f"agent {STATE.agent_id} ({STATE.hostname}) registered for {args.hardware}; consuming "
          f"{','.join(queues)} on {app.conf.broker_url.split('@')[-1]}", flush=True)
    install_stop_on_shutdown(STATE)
    heartbeat = Heartbeat(STATE, interval=args.heartbeat).start()
    try:  # a worker the broker refused exits non-zero
        code = run_worker(app, worker_argv(queues, f"agent-{args.hardware}-{STATE.agent_id}@{STATE.hostname}",
                                           os.environ.get("DAY0_AGENT_LOGLEVEL", "INFO")))
    finally:
        heartbeat.stop()
    return code


# ---------------------------------------------------------------- day0 jobs


def _client(args: argparse.Namespace) -> Any:
    from agents.worker.client import PortalClient

    return PortalClient(args.portal, args.token)


def _ask(action: str, call: Any, *call_args: Any) -> Any:
    """``call(*call_args)``; a refusal prints ``day0 jobs <action>: <the portal's sentence>`` and exits 1."""
    from agents.worker.client import PortalError

    try:
        return call(*call_args)
    except PortalError as exc:
        print(f"day0 jobs {action}: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


def run_submit(args: argparse.Namespace) -> int:
    stages = [s.strip() for s in args.stages.split(",") if s.strip()] if args.stages else None
    with _client(args) as client:
        pins = {k: v for k, v in (("tp", args.tp), ("pp", args.pp), ("ep", args.ep)) if v is not None}
        job = _ask("submit", lambda: client.create_job(model=args.model, hardware=args.hardware, stages=stages,
                                                       dtype=job_dtype(args.dtype), **pins))
    nodes = int(job.get("nodes") or 1)
    spans = f" (its plan spans {nodes} nodes: it runs on {nodes} agents at once)" if nodes > 1 else ""
    print(f"job {job['id']} queued: {args.portal.rstrip('/')}/jobs/{job['id']}/{spans}", flush=True)
    if args.watch:
        args.job_id, args.after = int(job["id"]), 0
        return run_watch(args)
    return 0


def run_list(args: argparse.Namespace) -> int:
    params = {k: v for k, v in (("state", args.state), ("model", args.model), ("hardware", args.hardware)) if v}
    with _client(args) as client:
        page = _ask("list", lambda: client.list_jobs(page_size=args.limit, **params))
    rows = page.get("results", [])
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no jobs" + (f" matching {', '.join(f'{k}={v}' for k, v in params.items())}" if params else ""))
        return 0
    print(f"{'ID':>6}  {'STATE':<10}  {'MODEL':<28}  {'HARDWARE':<16}  {'CREATED':<16}  NOTE")
    for job in rows:
        error = (str(job.get("error") or "").strip().splitlines() or [""])[-1][:80]
        note = job.get("waiting_reason") or (f"failed at {job['failed_stage']}: {error}" if job.get("failed_stage")
                                             else error if job["state"] in ("failed", "lost") else "")
        created = str(job.get("created_at") or "")[:16].replace("T", " ")
        print(f"{job['id']:>6}  {job['state']:<10}  {job['model']:<28}  {job['hardware']:<16}  {created:<16}  {note}")
    more = page.get("count", len(rows)) - len(rows)
    if more > 0:
        print(f"… and {more} more (use --limit, --state, --model or --hardware)")
    return 0


def run_cancel(args: argparse.Namespace) -> int:
    with _client(args) as client:
        job = _ask("cancel", client.cancel_job, args.job_id)
    print(f"job {job['id']} {job['state']}")
    return 0


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
        from agents.pipeline.tiers import TIER_NAMES, compute_tier

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
    with _client(args) as client:
        job = _ask("watch", client.get_job, args.job_id)
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


def _host_address() -> str:
    """This host's address as its name resolves (what another node dials); the name itself when it does not."""
    import socket

    name = socket.gethostname()
    try:
        return socket.gethostbyname(name)
    except OSError:
        return name
