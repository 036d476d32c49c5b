"""Per-sequence changes to a batch of last-token logits before sampling, with vLLM's semantics: presence and
frequency penalties over the generated tokens, the repetition penalty over prompt and generated tokens
(positive logits divided, negative multiplied), ``logit_bias``, ``min_tokens`` (EOS and stop tokens masked until
reached) and ``min_p``. Each is vectorised over the rows that use it; a batch that uses none is returned as is."""

from __future__ import annotations

import torch

from agents.runtime.engine.sequence import Sequence


def _active(seq: Sequence) -> bool:
    p = seq.params
    return bool(p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1.0 or p.logit_bias
                or p.min_tokens or p.min_p)


def needs_processing(seqs: list[Sequence]) -> bool:
    return any(_active(s) for s in seqs)


def _token_counts(rows: list[Sequence], ids_of, vocab: int, dev: torch.device) -> torch.Tensor:
    """[R, V] counts of each row's tokens (``ids_of(seq)``), by one scatter over the concatenated ids."""
    counts = torch.zeros(len(rows), vocab, dtype=torch.float32, device=dev)
    lists = [[t for t in ids_of(s) if t < vocab] for s in rows]
    flat = [t for ids in lists for t in ids]
    if flat:
        row_of = torch.repeat_interleave(torch.arange(len(rows), device=dev),
                                         torch.tensor([len(ids) for ids in lists], device=dev))
        counts.index_put_((row_of, torch.tensor(flat, device=dev)), torch.ones(len(flat), device=dev),
                          accumulate=True)
    return counts


def apply_penalties(logits: torch.Tensor, seqs: list[Sequence], eos_ids: set[int]) -> torch.Tensor:
    """Return ``logits`` (float32 [N, V]) with every sequence's penalties, biases and min-p applied; the input is
    not modified. Rows that ask for nothing keep their values bit for bit."""
    if not needs_processing(seqs):
        return logits
    logits = logits.float().clone()
    vocab, dev = logits.shape[1], logits.device
    idx = [i for i, s in enumerate(seqs) if _active(s)]
    rows = [seqs[i] for i in idx]
    sel = torch.tensor(idx, dtype=torch.long, device=dev)
    sub = logits.index_select(0, sel)  # sub: [R, V]

    rep = [s.params.repetition_penalty for s in rows]
    if any(r != 1.0 for r in rep):
        seen = _token_counts(rows, lambda s: s.token_ids, vocab, dev) > 0  # prompt and output tokens
        r = torch.tensor(rep, dtype=torch.float32, device=dev).unsqueeze(1)
        penalised = torch.where(sub > 0, sub / r, sub * r)
        sub = torch.where(seen, penalised, sub)

    pres = [s.params.presence_penalty for s in rows]
    freq = [s.params.frequency_penalty for s in rows]
    if any(pres) or any(freq):
        counts = _token_counts(rows, lambda s: s.output_token_ids, vocab, dev)  # generated tokens only
        sub = sub - torch.tensor(freq, dtype=torch.float32, device=dev).unsqueeze(1) * counts
        sub = sub - torch.tensor(pres, dtype=torch.float32, device=dev).unsqueeze(1) * (counts > 0).float()

    bias_rows, bias_ids, bias_vals = [], [], []
    for j, s in enumerate(rows):
        for tok, val in s.params.logit_bias.items():
            if tok < vocab:
                bias_rows.append(j)
                bias_ids.append(tok)
                bias_vals.append(val)
    if bias_rows:
        sub = sub.index_put((torch.tensor(bias_rows, device=dev), torch.tensor(bias_ids, device=dev)),
                            torch.tensor(bias_vals, dtype=torch.float32, device=dev), accumulate=True)

    mask_rows, mask_ids = [], []
    for j, s in enumerate(rows):
        if s.num_output_tokens < s.params.min_tokens:
            stops = set(s.params.stop_token_ids) | (set() if s.params.ignore_eos else eos_ids)
            for tok in stops:
                if tok < vocab:
                    mask_rows.append(j)
                    mask_ids.append(tok)
    if mask_rows:
        sub[torch.tensor(mask_rows, device=dev), torch.tensor(mask_ids, device=dev)] = float("-inf")

    min_p = [s.params.min_p for s in rows]
    if any(min_p):
        # on the temperature-scaled distribution, as vLLM does (a greedy row keeps its argmax either way)
        temps = torch.tensor([s.params.temperature or 1.0 for s in rows], device=dev).unsqueeze(1)
        probs = (sub / temps).softmax(dim=-1)
        floor = probs.max(dim=-1, keepdim=True).values * torch.tensor(min_p, device=dev).unsqueeze(1)
        sub = sub.masked_fill(probs < floor, float("-inf"))

    logits.index_copy_(0, sel, sub)
    return logits
