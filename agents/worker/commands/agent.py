"""``day0 agent``: registers this host with the portal and runs a Celery worker for one hardware pool (queue
``hw.<slug>``) and its own queue (a multi-node job's node), with a heartbeat beside it."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


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
    from agents.worker.app import app, consume, run_worker, worker_argv
    from agents.worker.client import PortalClient, PortalError
    from agents.worker.heartbeat import Heartbeat
    from agents.worker.lifecycle import install_stop_on_shutdown
    from contract.queues import hardware_queue

    client = PortalClient(STATE.portal_url, STATE.token)
    versions = environment_lock(STATE.device)
    if not 1024 <= args.rendezvous_port <= 60000:
        print(f"day0 agent: --rendezvous-port must be in [1024, 60000], got {args.rendezvous_port}", file=sys.stderr)
        return 2
    capabilities = {"device": STATE.device, "device_name": versions.get("device"),
                    "device_count": versions.get("device_count"), "dispatch_key": versions.get("dispatch_key"),
                    "queue": hardware_queue(args.hardware), "address": args.address or _host_address(),
                    "rendezvous_port": args.rendezvous_port}
    from agents.worker.engines import discover_engines

    try:
        capabilities["engines"] = discover_engines(getattr(args, "engine", []))
    except ValueError as exc:
        print(f"day0 agent: {exc}", file=sys.stderr)
        return 2
    os.environ["DAY0_AGENT_ENGINES"] = ",".join(f"{k}={v}" for k, v in capabilities["engines"].items())
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


def _host_address() -> str:
    """This host's address as its name resolves (what another node dials); the name itself when it does not."""
    import socket

    name = socket.gethostname()
    try:
        return socket.gethostbyname(name)
    except OSError:
        return name
