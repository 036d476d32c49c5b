"""The broker names (contract/queues.py) are wire format: agents already deployed consume these exact names, so
they are pinned here, and both sides are checked to use them."""

from __future__ import annotations

from contract.queues import AGENT_DEFAULT_QUEUE, RUN_JOB_TASK, agent_queue, agent_queues, hardware_queue


def test_the_names_on_the_wire_stay_as_deployed_agents_know_them() -> None:
    assert RUN_JOB_TASK == "day0.run_job"
    assert (hardware_queue("nvidia-h100"), agent_queue(42)) == ("hw.nvidia-h100", "agent.42")
    assert agent_queues("cpu", 7) == ("hw.cpu", "agent.7") and AGENT_DEFAULT_QUEUE == "hw.default"


def test_the_agent_registers_the_task_and_consumes_the_queues_the_portal_sends_to() -> None:
    from agents.worker.app import consume, make_app
    from agents.worker.tasks import run_job_task

    assert run_job_task.name == RUN_JOB_TASK
    app = make_app("memory://")
    assert consume(app, "cpu", 7) == [hardware_queue("cpu"), agent_queue(7)]
    assert [q.name for q in app.conf.task_queues] == [hardware_queue("cpu"), agent_queue(7)]
