"""The scheduler driven without a model: random arrivals, lengths, aborts and a pool small enough to force
preemptions. Every block must come back."""

from __future__ import annotations

import random

from agents.runtime.engine.block_manager import BlockManager
from agents.runtime.engine.sampling_params import SamplingParams
from agents.runtime.engine.scheduler import Scheduler, SchedulerConfig
from agents.runtime.engine.sequence import Sequence


def _scheduler(num_blocks: int = 40, block_size: int = 4, budget: int = 32, max_len: int = 128) -> Scheduler:
    cfg = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=budget, max_model_len=max_len)
    return Scheduler(cfg, BlockManager(num_blocks, block_size))


def _fake_step(sched: Scheduler, rng: random.Random) -> None:
    """One step as the engine does it, with random tokens instead of a model."""
    batch = sched.schedule()
    for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
        assert len(seq.block_table) * sched.blocks.block_size >= seq.num_computed_tokens + n
    assert sum(batch.num_new_tokens) <= sched.config.max_num_batched_tokens
    for seq in sched.on_step_done(batch):
        seq.append_token(rng.randrange(1, 100))
        if seq.num_output_tokens >= seq.params.max_tokens:
            sched.finish(seq, "length")


def test_thousand_random_requests_with_aborts_and_preemptions_return_every_block():
    rng = random.Random(0)
    sched = _scheduler()
    seqs: list[Sequence] = []
    for i in range(1000):
        prompt = [rng.randrange(1, 100) for _ in range(rng.randint(1, 60))]
        seq = Sequence(f"r{i}", prompt, SamplingParams(max_tokens=rng.randint(1, 128 - len(prompt))))
        seqs.append(seq)
        sched.add(seq)
        for _ in range(rng.randint(0, 3)):
            _fake_step(sched, rng)
        if rng.random() < 0.15:
            victim = rng.choice(seqs)
            sched.abort(victim.request_id)
        used = sum(len(s.block_table) for s in sched.running)
        assert used == sched.blocks.num_used_blocks  # only running sequences hold blocks
        assert all(not s.block_table for s in sched.waiting)
    steps = 0
    while sched.has_unfinished():
        _fake_step(sched, rng)
        steps += 1
        assert steps < 100_000
    assert sched.num_preemptions > 0
    assert sched.blocks.num_free_blocks == sched.blocks.num_blocks
    assert all(s.is_finished and not s.block_table for s in seqs)
    reasons = {s.finish_reason for s in seqs}
    assert reasons == {"length", "abort"}


def test_running_decodes_are_scheduled_before_a_long_prefill():
    sched = _scheduler(num_blocks=200, budget=16)
    short = Sequence("short", [1, 2, 3], SamplingParams(max_tokens=50))
    sched.add(short)
    batch = sched.schedule()
    sched.on_step_done(batch)
    short.append_token(5)
    sched.add(Sequence("long", list(range(1, 101)), SamplingParams(max_tokens=4)))
    for _ in range(5):
        batch = sched.schedule()
        ids = [s.request_id for s in batch.seqs]
        assert ids[0] == "short" and batch.num_new_tokens[0] == 1
        assert batch.num_new_tokens[1] == 15  # the prompt is chunked into the rest of the budget
        for seq in sched.on_step_done(batch):
            seq.append_token(7)


def test_abort_frees_blocks_immediately():
    sched = _scheduler()
    seq = Sequence("a", list(range(1, 30)), SamplingParams(max_tokens=5))
    sched.add(seq)
    sched.schedule()
    assert sched.blocks.num_used_blocks > 0
    assert sched.abort("a") is seq
    assert sched.blocks.num_free_blocks == sched.blocks.num_blocks
    assert seq.finish_reason == "abort"
    assert sched.abort("a") is None


def test_preempted_sequence_is_recomputed_from_scratch():
    sched = _scheduler(num_blocks=6, block_size=4, budget=64, max_len=24)
    a = Sequence("a", list(range(1, 8)), SamplingParams(max_tokens=17))
    b = Sequence("b", list(range(1, 8)), SamplingParams(max_tokens=17))
    sched.add(a)
    sched.add(b)
    preempted = []
    rng = random.Random(1)
    for _ in range(12):
        batch = sched.schedule()
        preempted += batch.preempted
        for seq in sched.on_step_done(batch):
            seq.append_token(rng.randrange(1, 100))
        assert sched.blocks.num_used_blocks == sum(len(s.block_table) for s in sched.running)
    assert b in preempted and b.num_preemptions >= 1 and b.num_computed_tokens == 0
    assert a.num_computed_tokens > 0 and a.num_preemptions == 0
