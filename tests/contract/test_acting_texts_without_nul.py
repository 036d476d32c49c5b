"""A random-weight model writes NUL characters (byte-fallback tokens); the portal's JSON refuses them, so the code
and agent tasks carry them as U+FFFD on both sides (the demo's reference run was refused whole before this)."""

import json

from contract.suites import agent_env, humaneval


def test_a_completion_with_nul_is_cut_hashed_and_run_without_it() -> None:
    raw = "    return 1\x00\n\ndef other():"
    cut = humaneval.cut(raw)
    assert "\x00" not in cut and cut == "    return 1\ufffd\n"
    assert humaneval.digest(raw) == humaneval.digest(cut)  # the hash is of the text as posted and run
    assert "\\u0000" not in json.dumps(cut)


def test_an_action_line_with_nul_is_recorded_and_replayed_alike() -> None:
    episode = agent_env.Episode.from_seed(3)
    episode.step('{"tool": "list"\x00')
    assert episode.actions == ['{"tool": "list"\ufffd']
    replay = agent_env.Episode.from_seed(3)
    replay.step(episode.actions[0])  # the portal replays what was posted
    assert replay.actions == episode.actions and replay.observations == episode.observations
