"""The paged KV-cache pool: fixed-size blocks handed to sequences and taken back on finish, abort or
preemption. It only does bookkeeping; the tensors live in the model runner.

Prefix caching (``enable_prefix_caching``, vLLM's flag): a block whose ``block_size`` tokens all hold computed
K/V is named by a chained hash, ``h_i = H(h_{i-1}, tokens of block i)`` (the chain's root is the hash of the
request's images, if any, so the same placeholder ids over other pixels never match), named when the step that
computes it is scheduled (``register``: a request admitted later in that step shares it). Blocks are ref-counted:
a request admitted with a prompt whose leading full blocks are known takes those blocks (ref + 1) and skips
their prefill. A block whose last holder finishes goes back to the free list with its hash kept, reusable until
the allocator takes it for something else: the free list is in eviction order, unhashed blocks first, then
hashed ones least recently freed first (a sequence's blocks are freed tail first, so its shared head lasts)."""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict

import torch

from agents.runtime.engine.sequence import Sequence


def block_hash(parent: bytes, tokens: list[int] | tuple[int, ...]) -> bytes:
    """The chained hash of one full block: 128-bit BLAKE2b of the parent's hash and the block's token ids."""
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(array("q", tokens).tobytes())
    return h.digest()


def root_hash(seq: Sequence) -> bytes:
    """The chain's root: empty for a text prompt; for a prompt with images, the hash of their pixels and the
    processor's other image tensors (the placeholder token ids are the same for every image)."""
    if seq.images is None:
        return b""
    h = hashlib.blake2b(b"images", digest_size=16)
    images = seq.images
    for name, tensor in [("pixel_values", images.pixel_values), *sorted(images.extra.items())]:
        t = tensor.detach().cpu().contiguous().flatten()
        h.update(f"{name}:{t.dtype}:{tuple(tensor.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())  # the raw bytes, whatever the dtype
    h.update(array("q", images.positions).tobytes())
    return h.digest()


class BlockManager:
    """``num_blocks`` blocks of ``block_size`` token slots each; ``enable_prefix_caching`` shares full blocks."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # eviction order
        self._ref = [0] * num_blocks
        self._hash_of: dict[int, bytes] = {}  # block -> its hash (full, computed blocks only)
        self._cached: dict[bytes, int] = {}  # hash -> block
        # prompt tokens looked up at admission, and those found cached (vLLM's prefix_cache_queries / _hits)
        self.num_queries = 0
        self.num_hits = 0
        self.num_evictions = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks that hold a known prefix (in use or free and still reusable)."""
        return len(self._cached)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """Extra blocks ``seq`` needs so its table covers ``num_tokens`` slots."""
        return max(0, self.blocks_for(num_tokens) - len(seq.block_table))

    def can_allocate(self, seq: Sequence, num_tokens: int, reserve: int = 0) -> bool:
        return self.blocks_needed(seq, num_tokens) + reserve <= len(self._free)

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        """Grow ``seq.block_table`` to cover ``num_tokens`` slots."""
        need = self.blocks_needed(seq, num_tokens)
        if need > len(self._free):
            raise RuntimeError(f"out of KV blocks: {seq.request_id} needs {need}, {len(self._free)} free")
        for _ in range(need):
            block, _ = self._free.popitem(last=False)
            old = self._hash_of.pop(block, None)
            if old is not None:  # evicted: its prefix is forgotten
                del self._cached[old]
                self.num_evictions += 1
            self._ref[block] = 1
            seq.block_table.append(block)

    def free(self, seq: Sequence) -> None:
        """Drop ``seq``'s hold on each of its blocks (idempotent); a block nobody holds goes to the free list,
        an unhashed one to the front (taken first), a hashed one to the back (kept longest), tail first."""
        for block in reversed(seq.block_table):
            if self._ref[block] < 1:
                raise RuntimeError(f"block {block} of {seq.request_id} was not allocated")
            self._ref[block] -= 1
            if self._ref[block] == 0:
                self._free[block] = None
                if block not in self._hash_of:
                    self._free.move_to_end(block, last=False)
        seq.block_table = []
        seq.num_registered_blocks = 0

    def slot(self, seq: Sequence, position: int) -> int:
        return seq.block_table[position // self.block_size] * self.block_size + position % self.block_size

    # ---- prefix caching ----

    def _hashes(self, seq: Sequence, num_blocks: int) -> list[bytes]:
        """The chained hashes of ``seq``'s first ``num_blocks`` full blocks (kept on the sequence: its tokens
        never change, so they survive a preemption)."""
        hashes = seq.block_hashes
        if not hashes and num_blocks:
            seq.prefix_root = root_hash(seq)
        bs = self.block_size
        while len(hashes) < num_blocks:
            i = len(hashes)
            hashes.append(block_hash(hashes[-1] if hashes else seq.prefix_root, seq.token_ids[i * bs : (i + 1) * bs]))
        return hashes

    def lookup(self, seq: Sequence) -> list[int]:
        """The cached blocks that hold ``seq``'s leading full blocks, taken nothing yet. The last token is never
        cached (its logits are needed), nor is anything for a request that scores its prompt (prompt logprobs
        need every position's logits)."""
        if not self.enable_prefix_caching or seq.block_table or seq.prompt_logprobs is not None:
            return []
        hits: list[int] = []
        for h in self._hashes(seq, (seq.num_tokens - 1) // self.block_size):
            block = self._cached.get(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def blocks_taken(self, hits: list[int]) -> int:
        """Free-list blocks that taking ``hits`` removes from the pool (those nobody holds now)."""
        return sum(1 for b in hits if self._ref[b] == 0)

    def take(self, seq: Sequence, hits: list[int]) -> None:
        """Give ``seq`` the cached ``hits`` as its first blocks: their tokens count as computed."""
        if seq.block_table:
            raise RuntimeError(f"{seq.request_id} already holds blocks")
        for block in hits:
            if self._ref[block] == 0:
                del self._free[block]
            self._ref[block] += 1
            seq.block_table.append(block)
        seq.num_computed_tokens = len(hits) * self.block_size
        seq.num_registered_blocks = len(hits)
        seq.num_cached_tokens = seq.num_computed_tokens
        self.num_queries += seq.num_tokens
        self.num_hits += seq.num_computed_tokens

    def register(self, seq: Sequence, num_tokens: int | None = None) -> list[int]:
        """Name the blocks of ``seq`` full once its first ``num_tokens`` tokens are computed (default: those
        computed now); a block whose hash another block holds already stays unnamed (a duplicate, freed first).
        The scheduler names them when it schedules the step that computes them (as vLLM does): a request admitted
        later in the same step takes them, and its chunk's attention reads their K/V, which the step writes for
        every token of a layer before that layer's attention. Returns the blocks named now (``forget`` drops
        them when that step fails)."""
        if not self.enable_prefix_caching:
            return []
        done = seq.num_computed_tokens if num_tokens is None else num_tokens
        full = min(done // self.block_size, len(seq.block_table))
        if full <= seq.num_registered_blocks:
            return []
        hashes = self._hashes(seq, full)
        named = []
        for i in range(seq.num_registered_blocks, full):
            block = seq.block_table[i]
            if block not in self._hash_of and hashes[i] not in self._cached:
                self._hash_of[block] = hashes[i]
                self._cached[hashes[i]] = block
                named.append(block)
        seq.num_registered_blocks = full
        return named

    def forget(self, blocks: list[int]) -> None:
        """Unname ``blocks`` (named for a step whose forward pass failed: their K/V may be missing); call before
        their holders free them, so that they go back to the free list as plain blocks."""
        for block in blocks:
            h = self._hash_of.pop(block, None)
            if h is not None and self._cached.get(h) == block:
                del self._cached[h]
