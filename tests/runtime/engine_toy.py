"""A tiny paged-attention model for engine tests that must not depend on the native families: it honours the
ForwardContext contract (no cache, chunked paged prefill, paged decode) with a plain reference attention."""

from __future__ import annotations

import torch
from torch import nn

from agents.runtime.context import ForwardContext
from agents.runtime.interface import ForwardOutput, KVCacheSpec

VOCAB = 64
CONFIG = {"vocab_size": VOCAB, "max_position_embeddings": 256}


class ToyTokenizer:
    """Token i <-> the character chr(65 + i); EOS is token 0."""

    eos_token_ids = {0}
    vocab_size = VOCAB
    chat_template = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [min(VOCAB - 1, max(1, ord(c) - 65)) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(65 + i) for i in ids if i != 0 or not skip_special_tokens)


class ToyPagedModel(nn.Module):
    path = "native"

    def __init__(self, layers: int = 2, heads: int = 2, head_dim: int = 8, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        dim = heads * head_dim
        self.heads, self.head_dim = heads, head_dim
        self.embed = nn.Embedding(VOCAB, dim)
        self.pos = nn.Embedding(CONFIG["max_position_embeddings"], dim)
        self.qkv = nn.ModuleList(nn.Linear(dim, 3 * dim) for _ in range(layers))
        self.out = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.head = nn.Linear(dim, VOCAB)
        self.caches: list[tuple[torch.Tensor, ...]] = []

    def kv_cache_spec(self) -> KVCacheSpec:
        return KVCacheSpec("kv", num_layers=len(self.qkv), num_kv_heads=self.heads, head_dim=self.head_dim)

    def bind_kv_cache(self, caches: list[tuple[torch.Tensor, ...]]) -> None:
        self.caches = caches

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head(hidden)

    def forward(self, input_ids, positions, ctx: ForwardContext, output_hidden_states: bool = False):
        x = self.embed(input_ids) + self.pos(positions)  # x: [T, D]
        T = x.shape[0]
        for i, (qkv, out) in enumerate(zip(self.qkv, self.out, strict=True)):
            q, k, v = qkv(x).view(T, 3, self.heads, self.head_dim).unbind(1)  # each [T, H, Dh]
            if ctx.uses_cache:
                kc, vc = self.caches[i]
                flat_k, flat_v = kc.view(-1, self.heads, self.head_dim), vc.view(-1, self.heads, self.head_dim)
                keep = ctx.slot_mapping >= 0
                flat_k[ctx.slot_mapping[keep]] = k[keep]
                flat_v[ctx.slot_mapping[keep]] = v[keep]
            outs = []
            for s in range(ctx.num_seqs):
                a, b = int(ctx.cu_seqlens_q[s]), int(ctx.cu_seqlens_q[s + 1])
                L = int(ctx.seqlens_k[s])
                if ctx.uses_cache:
                    bs = kc.shape[1]
                    table = ctx.block_tables[s][: -(-L // bs)].long()
                    ks = kc[table].reshape(-1, self.heads, self.head_dim)[:L]  # ks: [L, H, Dh]
                    vs = vc[table].reshape(-1, self.heads, self.head_dim)[:L]
                else:
                    ks, vs = k[a:b], v[a:b]
                qpos = torch.arange(L - (b - a), L).unsqueeze(1)  # [q, 1]
                mask = torch.arange(L).unsqueeze(0) <= qpos  # [q, L]
                scores = torch.einsum("qhd,khd->hqk", q[a:b], ks) / self.head_dim**0.5
                probs = scores.masked_fill(~mask, float("-inf")).softmax(-1)
                outs.append(torch.einsum("hqk,khd->qhd", probs, vs).reshape(b - a, -1))
            x = x + out(torch.cat(outs))
        return ForwardOutput(hidden=x)
