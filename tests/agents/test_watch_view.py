"""``day0 jobs watch``'s terminal view: a bar per stage while it runs, one line when it ends, then the tier."""

from __future__ import annotations

import io

from agents.worker.commands import ProgressView


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def ev(seq: int, kind: str, where: str, **data) -> dict:  # noqa: ANN003
    return {"seq": seq, "kind": kind, "stage": where, "level": "info", "message": "", "data": data}


def test_bars_then_outcomes_then_the_tier_each_event_once() -> None:
    out = Terminal()
    view = ProgressView(out)
    view.event(ev(1, "stage_started", "load", stage="load"))
    view.event(ev(2, "progress", "load", done=5, total=10, what="tensors loaded"))
    assert out.getvalue().endswith("load      [" + "#" * 15 + "." * 15 + "] 5/10 tensors loaded")
    view.event(ev(2, "progress", "load", done=5, total=10, what="tensors loaded"))  # a replay overlap
    assert out.getvalue().count("5/10") == 1
    view.event(ev(3, "stage_finished", "load", stage="load", passed=True, seconds=1.5))
    view.event(ev(4, "stage_finished", "serve", stage="serve", passed=False, seconds=0.2, error="port busy"))
    lines = out.getvalue().split("\n")
    assert lines[-3].endswith("passed (1.5 s)") and "FAILED: port busy" in lines[-2]
    assert view.finish({"id": 7, "state": "failed", "failed_stage": "serve", "error": "port busy"}) == 1
    # load passed, plan has no evidence: the tier the terminal shows follows the tier rule
    assert out.getvalue().rstrip().endswith("job 7 failed: tier 0 (untested), failed at serve: port busy")
