"""A tiny MoE model's job, every stage, from the REST POST to its final tier, on the embedded default (SQLite,
filesystem broker, in-memory channel layer) with a real CPU agent process; target: under 2 minutes.

Side by side: the same pipeline run standalone by ``day0 adapt`` (no portal, no broker, no agent), so the
portal's overhead (dispatch, event streaming, result ingest) shows as the difference.

    .venv/bin/python benchmarks/job_end_to_end.py [--arch qwen3-moe] [--no-peer]
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TARGET_SECONDS = 120.0
STAGES = ["plan", "load", "inventory", "align", "serve", "bench", "env"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_agent(base: str, token: str, timeout: float = 120) -> float:
    """Seconds until an agent is registered and online."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        r = httpx.get(f"{base}/api/v1/agents/", headers={"Authorization": f"Token {token}"}, timeout=10)
        if r.status_code == 200:
            rows = r.json().get("results", r.json()) if isinstance(r.json(), dict) else r.json()
            if any(a.get("online", True) for a in rows):
                return time.monotonic() - t0
        time.sleep(0.5)
    raise SystemExit("the agent did not register within 120 s")


def run_portal_job(arch: str) -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from day0cli.demo import demo_environment, prepare_demo, start_portal, stop_portal

    data = Path(tempfile.mkdtemp(prefix="day0-e2e-"))
    env = demo_environment(data)
    info = prepare_demo(env)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    portal = start_portal(port=port, env=env)
    from agents.runtime.testing.make_model import cached_model
    from agents.worker import demo
    from day0cli.demo_seed import ensure_demo_model, make_agent_token

    cached_model(arch)  # built before the clock starts
    slug, models_dir = ensure_demo_model(arch)
    agent, log = demo.start_agent(base, make_agent_token("cpu"), models_dir=models_dir)
    try:
        agent_ready = wait_agent(base, info.token)
        t0 = time.monotonic()
        job = demo.submit_job(base, info.token, model=slug, stages=STAGES)
        headers = {"Authorization": f"Token {info.token}"}
        while True:
            state = httpx.get(f"{base}/api/v1/jobs/{job['id']}/", headers=headers, timeout=10).json()
            if state["state"] in ("succeeded", "failed", "cancelled", "lost"):
                break
            if time.monotonic() - t0 > 900:
                raise SystemExit(f"job still {state['state']} after 15 min; agent log: {log}")
            time.sleep(0.5)
        elapsed = time.monotonic() - t0
        cell = httpx.get(f"{base}/api/v1/cells/{slug}/cpu/", headers=headers, timeout=10).json()
        events = httpx.get(f"{base}/api/v1/jobs/{job['id']}/events/?limit=5000", headers=headers, timeout=10).json()
        stage_s = {e["data"]["stage"]: e["data"]["seconds"] for e in events["events"] if e["kind"] == "stage_finished"}
        return {"seconds": elapsed, "state": state["state"], "tier": cell.get("tier"), "stages": stage_s,
                "events": len(events["events"]), "agent_ready": agent_ready, "error": state.get("error")}
    finally:
        demo.stop_agent(agent)
        stop_portal(portal)


def run_adapt(arch: str) -> dict:
    from agents.runtime.testing.make_model import cached_model

    model_dir = cached_model(arch)
    report = Path(tempfile.mkdtemp(prefix="day0-adapt-")) / "report.json"
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "day0cli", "adapt", str(model_dir), "--hardware", "cpu",
                    "--stages", ",".join(STAGES), "--dtype", "float32", "--report", str(report)],
                   cwd=ROOT, check=False, capture_output=True)
    elapsed = time.monotonic() - t0
    import json

    doc = json.loads(report.read_text()) if report.exists() else {}
    return {"seconds": elapsed, "tier": doc.get("tier"), "stages": doc.get("seconds", {})}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="qwen3-moe")
    parser.add_argument("--no-peer", action="store_true", help="skip the standalone `day0 adapt` run")
    args = parser.parse_args()
    logging.getLogger("httpx").setLevel(logging.WARNING)
    job = run_portal_job(args.arch)
    peer = None if args.no_peer else run_adapt(args.arch)
    print(f"\ntiny {args.arch}, stages {', '.join(STAGES)}, float32, CPU agent (agent ready in "
          f"{job['agent_ready']:.1f} s before the POST)\n")
    print(f"{'stage':<10} {'portal job (s)':>15} {'day0 adapt (s)':>15}")
    for stage in STAGES:
        peer_s = f"{peer['stages'].get(stage, float('nan')):>15.1f}" if peer else f"{'-':>15}"
        print(f"{stage:<10} {job['stages'].get(stage, float('nan')):>15.1f} {peer_s}")
    peer_total = f"{peer['seconds']:>15.1f}" if peer else f"{'-':>15}"
    print(f"{'POST→tier':<10} {job['seconds']:>15.1f} {peer_total}   (adapt: process start to report)")
    print(f"\njob {job['state']}, cell tier {job['tier']}, {job['events']} events stored"
          + (f", error: {job['error']}" if job["error"] else ""))
    ok = job["state"] == "succeeded" and job["seconds"] < TARGET_SECONDS
    print(f"target POST→final tier < {TARGET_SECONDS:.0f} s: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
