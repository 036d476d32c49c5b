"""``day0 agent`` (a Celery worker for one hardware pool) and ``day0 jobs submit|watch|list|cancel`` (vendors'
terminal); also the agent's own command line, ``python -m agents.worker agent|jobs …``, started without the
``day0`` command's package. Refusals print as sentences naming the field the portal objected to.

``register`` adds both parsers; the handlers live by family: ``agent`` (``day0 agent``), ``jobs`` (submit, list,
cancel), ``watch`` (the live view), and what the ``jobs`` actions share in ``portal``. Registration stays cheap:
the handlers import the Celery app, the portal client and the pipeline when they run."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from agents.runtime.commands import build_parser, run
from agents.worker.commands.agent import run_agent
from agents.worker.commands.jobs import run_cancel, run_list, run_submit
from agents.worker.commands.portal import JOB_STATES, add_portal_args, bounded_int
from agents.worker.commands.watch import run_watch


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
    agent.add_argument("--engine", action="append", default=[], metavar="NAME=PATH",
                       help="an engine this agent can start beside those found on PATH (vllm): advertised to the "
                            "portal, which sends it the jobs naming that engine (repeatable)")
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
        submit.add_argument(f"--{degree}", type=bounded_int(1, 4096), default=None,
                            help=f"pin the plan's {what} (the portal checks it against the planner's rules)")
    submit.add_argument("--engine", default=None, metavar="NAME[@VERSION]",
                        help="the serving engine (GET /api/v1/engines/; default day0, the bundled runtime)")
    submit.add_argument("--engine-command", default=None, metavar="TEMPLATE",
                        help="the engine's launch command ({model_path} {port} …), for openai-compatible")
    submit.add_argument("--watch", action="store_true", help="watch the job after submitting it")
    add_portal_args(submit)
    submit.set_defaults(handler=run_submit)
    watch = jobs_sub.add_parser("watch", help="follow a job live: a progress bar per stage, then the tier")
    watch.add_argument("job_id", type=int)
    watch.add_argument("--after", type=int, default=0, help="replay events after this seq")
    add_portal_args(watch)
    watch.set_defaults(handler=run_watch)
    lister = jobs_sub.add_parser("list", help="list jobs you may see, newest first")
    lister.add_argument("--state", choices=JOB_STATES)
    lister.add_argument("--model", default=None, help="model slug")
    lister.add_argument("--hardware", default=None, help="hardware slug")
    lister.add_argument("--limit", type=bounded_int(1, 500), default=20, help="at most this many (1-500)")
    lister.add_argument("--json", action="store_true", help="the API's rows as JSON")
    add_portal_args(lister)
    lister.set_defaults(handler=run_list)
    cancel = jobs_sub.add_parser("cancel", help="cancel a queued, dispatched or running job")
    cancel.add_argument("job_id", type=int)
    add_portal_args(cancel)
    cancel.set_defaults(handler=run_cancel)


def main(argv: list[str] | None = None) -> int:
    """``python -m agents.worker``: the agent's commands alone (``day0 agent`` and ``day0 jobs``)."""
    parser = build_parser("python -m agents.worker", "The Day-0 agent: run one for a hardware pool, or submit and "
                                                     "follow jobs (the same commands as `day0 agent|jobs`).",
                          ("agents.worker.commands",))
    return run(parser, argv)
