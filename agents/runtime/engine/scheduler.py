"""Continuous batching. Each step the scheduler spends a token budget: running decodes first (one token
each), then chunks of prompts already being prefilled, then new requests, as long as their blocks fit.
Decodes and prefill chunks share one forward pass, so a long prompt never stalls the running decodes. When
blocks run out the newest running sequence is preempted (its blocks freed, recomputed later)."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from agents.runtime.engine.block_manager import BlockManager
from agents.runtime.engine.sequence import Sequence, SequenceStatus


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 64  # sequences in one step
    max_num_batched_tokens: int = 512  # token budget of one step (prefill chunk size)
    max_model_len: int = 2048
    chunked_prefill: bool = True  # False: a prompt is prefilled whole (the recompute path needs that)

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if not self.chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError("without chunked prefill max_num_batched_tokens must cover max_model_len")


@dataclass
class ScheduledBatch:
    """The sequences of one step and how many new tokens each contributes."""

    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    registered: list[int] = field(default_factory=list)  # prefix-cache blocks named for this step's tokens

    @property
    def empty(self) -> bool:
        return not self.seqs

    @property
    def is_decode(self) -> bool:
        return bool(self.seqs) and all(n == 1 for n in self.num_new_tokens)


class Scheduler:
    """Owns the waiting and running queues and the block manager's bookkeeping for them."""

    def __init__(self, config: SchedulerConfig, block_manager: BlockManager) -> None:
        self.config = config
        self.blocks = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def abort(self, request_id: str) -> Sequence | None:
        """Remove a request wherever it is and free its blocks at once."""
        for seq in self.running:
            if seq.request_id == request_id:
                self.running.remove(seq)
                return self._finish(seq, "abort")
        for seq in self.waiting:
            if seq.request_id == request_id:
                self.waiting.remove(seq)
                return self._finish(seq, "abort")
        return None

    def finish(self, seq: Sequence, reason: str) -> None:
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self._finish(seq, reason)

    def _finish(self, seq: Sequence, reason: str) -> Sequence:
        self.blocks.free(seq)
        seq.finish(reason)
        return seq

    def requeue_isolated(self, seq: Sequence) -> None:
        """After a failed forward pass: recompute ``seq`` later, alone, to find out whether it is the culprit."""
        seq.isolate = True
        seq.num_failures += 1
        self._preempt(seq, count=False)

    def _preempt(self, seq: Sequence, count: bool = True) -> None:
        self.running.remove(seq)
        self.blocks.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += count
        self.num_preemptions += count
        self.waiting.appendleft(seq)

    def schedule(self) -> ScheduledBatch:
        isolated = self._schedule_isolated()
        if isolated is not None:
            return isolated
        batch = ScheduledBatch()
        budget = self.config.max_num_batched_tokens
        scheduled: set[int] = set()
        decodes = [s for s in self.running if s.num_uncomputed_tokens == 1]
        prefills = [s for s in self.running if s.num_uncomputed_tokens > 1]
        for seq in decodes + prefills:
            if budget == 0 or seq not in self.running:
                continue
            n = min(seq.num_uncomputed_tokens, budget)
            if not self._make_room(seq, seq.num_computed_tokens + n, scheduled, batch):
                continue
            self._add(batch, seq, n)
            scheduled.add(id(seq))
            budget -= n
        if batch.preempted:
            return batch  # blocks are short: let the running sequences drain before admitting more
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            hits = self.blocks.lookup(seq)  # prefix caching: leading full blocks whose K/V is cached
            cached = len(hits) * self.blocks.block_size
            n = seq.num_tokens - cached if hits else seq.num_uncomputed_tokens
            if n > budget and not self.config.chunked_prefill:
                break
            n = min(n, budget)
            # admit only with a little headroom so the newcomer does not force an immediate preemption
            reserve = (1 if self.running else 0) + self.blocks.blocks_taken(hits)
            if self.blocks.blocks_for(cached + n) - len(hits) + reserve > self.blocks.num_free_blocks:
                break
            self.waiting.popleft()
            if self.blocks.enable_prefix_caching and not seq.block_table:
                self.blocks.take(seq, hits)
            seq.first_scheduled_time = seq.first_scheduled_time or time.monotonic()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            self._add(batch, seq, n)
            budget -= n
        return batch

    def _schedule_isolated(self) -> ScheduledBatch | None:
        """A suspect sequence runs alone until it produces a token (or fails alone and is ended)."""
        seq = next((s for s in self.running if s.isolate), None)
        if seq is None and self.waiting and self.waiting[0].isolate:
            seq = self.waiting[0]
            if not self.blocks.can_allocate(seq, seq.num_computed_tokens + 1):
                return None
            self.waiting.popleft()
            seq.first_scheduled_time = seq.first_scheduled_time or time.monotonic()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
        if seq is None:
            return None
        batch = ScheduledBatch()
        n = min(seq.num_uncomputed_tokens, self.config.max_num_batched_tokens)
        if not self._make_room(seq, seq.num_computed_tokens + n, {id(seq)}, batch):
            return batch
        self._add(batch, seq, n)
        return batch

    def _add(self, batch: ScheduledBatch, seq: Sequence, n: int) -> None:
        """Put ``seq``'s next ``n`` tokens in ``batch`` with the blocks they need. The blocks full once they are
        computed are named now, not after the step: a request admitted later in this step shares them (see
        ``BlockManager.register``); ``batch.registered`` lists them for ``BlockManager.forget`` if the step fails."""
        self.blocks.allocate(seq, seq.num_computed_tokens + n)
        batch.registered += self.blocks.register(seq, seq.num_computed_tokens + n)
        batch.seqs.append(seq)
        batch.num_new_tokens.append(n)

    def _make_room(self, seq: Sequence, num_tokens: int, scheduled: set[int], batch: ScheduledBatch) -> bool:
        """Preempt the newest unscheduled running sequences until ``seq`` fits; False if ``seq`` itself went."""
        while not self.blocks.can_allocate(seq, num_tokens):
            victims = [s for s in self.running if id(s) not in scheduled]
            victim = victims[-1]
            self._preempt(victim)
            batch.preempted.append(victim)
            if victim is seq:
                return False
        return True

    def on_step_done(self, batch: ScheduledBatch) -> list[Sequence]:
        """Advance progress after a forward pass; return the sequences that reached their end (to sample)."""
        ready = []
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            seq.num_computed_tokens += n  # its full blocks were named when it was scheduled (_add)
            if seq.num_uncomputed_tokens == 0:
                ready.append(seq)
        return ready
