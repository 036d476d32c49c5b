"""Log-probabilities of chosen tokens and their top alternatives, from fp32 logits."""

from __future__ import annotations

import torch

from agents.runtime.engine.outputs import TokenLogprob

ROW_CHUNK = 256  # rows log-softmaxed at once: bounds the fp32 [rows, V] working set


def token_logprobs(logits: torch.Tensor, targets: list[int], top_n: list[int]) -> list[TokenLogprob]:
    """Per row of ``logits`` [N, V]: the log-softmax (in fp32) at ``targets[i]`` and the ``top_n[i]`` best
    tokens, best first (ties broken by the lower token id, as ``topk`` sorts)."""
    out: list[TokenLogprob] = []
    for lo in range(0, len(targets), ROW_CHUNK):
        hi = min(lo + ROW_CHUNK, len(targets))
        logp = torch.log_softmax(logits[lo:hi].float(), dim=-1)  # logp: [n, V]
        idx = torch.tensor(targets[lo:hi], dtype=torch.long, device=logp.device).unsqueeze(1)  # [n, 1]
        chosen = logp.gather(1, idx).squeeze(1).tolist()
        k = min(max(top_n[lo:hi]), logp.shape[-1])
        vals: list[list[float]] = [[] for _ in chosen]
        ids: list[list[int]] = [[] for _ in chosen]
        if k > 0:
            top = logp.topk(k, dim=-1)
            vals, ids = top.values.tolist(), top.indices.tolist()
        for j, (target, lp) in enumerate(zip(targets[lo:hi], chosen, strict=True)):
            n = top_n[lo + j]
            out.append(TokenLogprob(target, lp, tuple(zip(ids[j][:n], vals[j][:n], strict=True))))
    return out
