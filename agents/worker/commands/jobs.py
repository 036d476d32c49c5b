"""``day0 jobs submit|list|cancel``: a vendor's terminal on the portal's jobs (``watch`` follows one live)."""

from __future__ import annotations

import argparse
import json

from agents.worker.commands.portal import ask, portal_client
from agents.worker.commands.watch import run_watch


def job_dtype(name: str | None) -> str | None:
    """The portal's name of a dtype given as ``day0 estimate`` takes it (``fp8`` → ``float8_e4m3fn``)."""
    if name is None:
        return None
    from contract.planner.memory import ALIASES

    return ALIASES.get(name.strip().lower(), name.strip())


def run_submit(args: argparse.Namespace) -> int:
    stages = [s.strip() for s in args.stages.split(",") if s.strip()] if args.stages else None
    with portal_client(args) as client:
        pins = {k: v for k, v in (("tp", args.tp), ("pp", args.pp), ("ep", args.ep),
                                  ("engine", getattr(args, "engine", None)),
                                  ("engine_command", getattr(args, "engine_command", None))) if v is not None}
        job = ask("submit", lambda: client.create_job(model=args.model, hardware=args.hardware, stages=stages,
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
    with portal_client(args) as client:
        page = ask("list", lambda: client.list_jobs(page_size=args.limit, **params))
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
    with portal_client(args) as client:
        job = ask("cancel", client.cancel_job, args.job_id)
    print(f"job {job['id']} {job['state']}")
    return 0
