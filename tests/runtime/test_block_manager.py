from __future__ import annotations

import pytest

from agents.runtime.engine.block_manager import BlockManager
from agents.runtime.engine.sampling_params import SamplingParams
from agents.runtime.engine.sequence import Sequence


def _seq(name: str, n: int) -> Sequence:
    return Sequence(name, list(range(1, n + 1)), SamplingParams())


def test_allocation_covers_tokens_and_free_returns_every_block():
    bm = BlockManager(num_blocks=8, block_size=4)
    a, b = _seq("a", 5), _seq("b", 4)
    bm.allocate(a, 5)
    bm.allocate(b, 4)
    assert len(a.block_table) == 2 and len(b.block_table) == 1
    assert bm.num_free_blocks == 5
    bm.allocate(a, 8)  # still two blocks
    assert len(a.block_table) == 2
    bm.allocate(a, 9)
    assert len(a.block_table) == 3
    assert set(a.block_table).isdisjoint(b.block_table)
    assert bm.slot(a, 8) == a.block_table[2] * 4
    bm.free(a)
    bm.free(b)
    assert bm.num_free_blocks == 8 and a.block_table == []


def test_allocating_past_the_pool_raises_and_changes_nothing():
    bm = BlockManager(num_blocks=2, block_size=4)
    a = _seq("a", 9)
    assert not bm.can_allocate(a, 9)
    with pytest.raises(RuntimeError, match="out of KV blocks"):
        bm.allocate(a, 9)
    assert bm.num_free_blocks == 2 and a.block_table == []


def test_freed_blocks_are_reused():
    bm = BlockManager(num_blocks=3, block_size=2)
    a = _seq("a", 6)
    bm.allocate(a, 6)
    first = set(a.block_table)
    bm.free(a)
    b = _seq("b", 6)
    bm.allocate(b, 6)
    assert set(b.block_table) == first


def test_bad_pool_sizes_are_refused():
    with pytest.raises(ValueError, match="num_blocks"):
        BlockManager(num_blocks=0, block_size=16)
