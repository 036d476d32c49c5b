"""Next-token choice for a batch of last-token logits, each row with its own sampling settings."""

from __future__ import annotations

import torch

from agents.runtime import kernels
from agents.runtime.engine.sequence import Sequence


def sample(logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
    """Greedy rows take the argmax; the others are scaled by temperature, filtered by top-k and top-p,
    and drawn with the request's own generator when it set a seed. Every index and parameter tensor is built
    on the logits' device."""
    logits = logits.float()  # logits: [N, V]
    dev = logits.device
    greedy = kernels.argmax_rows(logits)  # fp32 CPU: one pass per row on every thread
    if greedy is None:
        greedy = logits.argmax(dim=-1).tolist()
    rows = [i for i, s in enumerate(seqs) if not s.params.greedy]
    if not rows:
        return greedy
    vocab = logits.shape[1]
    params = [seqs[i].params for i in rows]
    idx = torch.tensor(rows, dtype=torch.long, device=dev)  # idx: [R]
    temps = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=dev)  # temps: [R]
    scaled = logits.index_select(0, idx) / temps.unsqueeze(1)  # scaled: [R, V]
    sorted_logits, sorted_ids = scaled.sort(dim=-1, descending=True)  # both [R, V]
    top_k = torch.tensor([min(p.top_k, vocab) if p.top_k > 0 else vocab for p in params], device=dev)  # [R]
    ranks = torch.arange(vocab, device=dev).unsqueeze(0)  # ranks: [1, V]
    drop = ranks >= top_k.unsqueeze(1)  # drop: [R, V]
    top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=dev)  # top_p: [R]
    probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
    # keep a token while the mass before it is below top_p (the first token always stays)
    mass_before = probs.cumsum(dim=-1) - probs
    drop |= mass_before >= top_p.unsqueeze(1)
    probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)  # probs: [R, V]
    out = list(greedy)
    for j, i in enumerate(rows):
        gen = seqs[i].generator  # a CPU generator: seeded draws are the same on every device
        row = probs[j] if gen is None else probs[j].cpu()
        pick = int(torch.multinomial(row, 1, generator=gen))
        out[i] = int(sorted_ids[j, pick])
    return out
