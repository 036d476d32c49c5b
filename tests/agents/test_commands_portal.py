"""What the ``day0 jobs`` actions share (``agents.worker.commands.portal``): bounded whole numbers, the portal
options from the environment, and a refusal printed as the portal's sentence with exit code 1."""

from __future__ import annotations

import argparse

import pytest

from agents.worker.client import PortalError, PortalUnavailable
from agents.worker.commands.portal import JOB_STATES, TERMINAL_STATES, add_portal_args, ask, bounded_int


def test_a_bounded_int_takes_whole_numbers_in_range_and_names_what_is_wrong() -> None:
    parse = bounded_int(1, 500)
    assert parse("1") == 1 and parse("500") == 500
    with pytest.raises(argparse.ArgumentTypeError, match=r"^501 is outside 1-500$"):
        parse("501")
    with pytest.raises(argparse.ArgumentTypeError, match=r"^0 is outside 1-500$"):
        parse("0")
    with pytest.raises(argparse.ArgumentTypeError, match=r"^'2.5' is not a whole number$"):
        parse("2.5")


def test_the_portal_options_default_to_the_environment(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("DAY0_PORTAL_URL", "http://portal.example:8000")
    monkeypatch.setenv("DAY0_TOKEN", "d0_from_env")
    parser = argparse.ArgumentParser()
    add_portal_args(parser)
    assert vars(parser.parse_args([])) == {"portal": "http://portal.example:8000", "token": "d0_from_env"}
    assert parser.parse_args(["--token", "d0_given"]).token == "d0_given"
    monkeypatch.delenv("DAY0_PORTAL_URL")
    monkeypatch.delenv("DAY0_TOKEN")
    parser = argparse.ArgumentParser()
    add_portal_args(parser)
    assert vars(parser.parse_args([])) == {"portal": "http://127.0.0.1:8000", "token": None}


def test_ask_returns_the_answer_and_a_refusal_is_the_portals_sentence_and_exit_1(capsys) -> None:  # noqa: ANN001
    assert ask("list", lambda *args: {"args": args}, 1, 2) == {"args": (1, 2)}

    def refuse() -> None:
        raise PortalError(400, "model: no model 'x' you may see")

    with pytest.raises(SystemExit) as stopped:
        ask("submit", refuse)
    assert stopped.value.code == 1
    assert capsys.readouterr().err == "day0 jobs submit: the portal answered 400: model: no model 'x' you may see\n"

    def away() -> None:
        raise PortalUnavailable(503, "the portal is away")

    with pytest.raises(SystemExit):  # an unreachable portal is a refusal too: the command cannot go on
        ask("watch", away)
    assert capsys.readouterr().err.startswith("day0 jobs watch: ")


def test_every_terminal_state_is_a_job_state() -> None:
    assert set(TERMINAL_STATES) < set(JOB_STATES) and "running" not in TERMINAL_STATES
