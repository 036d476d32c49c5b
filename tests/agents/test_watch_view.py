"""``day0 jobs watch``'s terminal view: a bar per stage while it runs, one line when it ends, then the tier."""

from __future__ import annotations

import io

from agents.worker.commands.watch import ProgressView


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


def test_another_nodes_lines_are_tagged_each_once_and_leave_the_tier_to_node_0() -> None:
    from agents.worker.commands.watch import _ws_url

    out = Terminal()
    view = ProgressView(out)
    view.event(ev(1, "stage_started", "load", stage="load"))
    node_ev = {**ev(1, "stage_started", "load", stage="load", node=1), "message": "load: node 1 of 2 runs its ranks"}
    view.node_event(1, node_ev)
    view.node_event(1, node_ev)  # a replay overlap
    view.node_event(1, ev(2, "progress", "load", done=1, total=2))  # node 0's bar is the one bar
    failed = {**ev(3, "stage_finished", "load", stage="load", passed=False, error="rank 1 died"),
              "level": "error", "message": "load ranks of node 1 failed: rank 1 died"}
    view.node_event(1, failed)
    view.event(ev(2, "stage_finished", "load", stage="load", passed=True, seconds=1.0))
    text = out.getvalue()
    assert text.count("node 1 load      started") == 1 and "1/2" not in text
    assert "node 1 load      FAILED: load ranks of node 1 failed: rank 1 died" in text
    assert view.node_seq == {1: 3} and view.last_seq == 2 and view.passed == {"load": True}
    assert _ws_url("http://p", 7, 2, None, view.node_seq) == "ws://p/ws/jobs/7/?after=2&nodes_after=1%3A3"
