"""What the ``day0 jobs`` actions share: the job states, the ``--portal``/``--token`` options, a client from
them, and a refusal printed as the portal's sentence (``client.PortalError``)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

# "lost" as the REST API shows it is final (the attempts ran out): a re-queued job is queued again in the same
# transaction. Over the WebSocket a "lost" is followed by "queued" when the job is re-queued.
TERMINAL_STATES = ("succeeded", "failed", "cancelled", "lost")
JOB_STATES = ("queued", "dispatched", "running", "succeeded", "failed", "cancelled", "lost")


def bounded_int(low: int, high: int) -> Any:
    """An argparse ``type`` taking a whole number in ``[low, high]``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is outside {low}-{high}")
        return value

    return parse


def add_portal_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--portal", default=os.environ.get("DAY0_PORTAL_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--token", default=os.environ.get("DAY0_TOKEN"), help="API token (or DAY0_TOKEN)")


def portal_client(args: argparse.Namespace) -> Any:
    """A ``PortalClient`` on the ``--portal`` and ``--token`` parsed."""
    from agents.worker.client import PortalClient

    return PortalClient(args.portal, args.token)


def ask(action: str, call: Any, *call_args: Any) -> Any:
    """``call(*call_args)``; a refusal prints ``day0 jobs <action>: <the portal's sentence>`` and exits 1."""
    from agents.worker.client import PortalError

    try:
        return call(*call_args)
    except PortalError as exc:
        print(f"day0 jobs {action}: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
