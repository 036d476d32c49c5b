"""The sampler and the logprob helper on plain tensors: filters, seeds, bounds and ties (the device side runs
in tests/runtime/test_gpu_smoke.py)."""

from __future__ import annotations

import pytest
import torch

from agents.runtime.engine import SamplingParams
from agents.runtime.engine.logprobs import ROW_CHUNK, token_logprobs
from agents.runtime.engine.sampler import sample
from agents.runtime.engine.sequence import Sequence


def _seqs(*params: SamplingParams) -> list[Sequence]:
    return [Sequence(f"r{i}", [1, 2], p) for i, p in enumerate(params)]


def test_filters_that_keep_one_token_equal_greedy():
    torch.manual_seed(0)
    logits = torch.randn(4, 300)
    seqs = _seqs(SamplingParams(temperature=0.0), SamplingParams(top_k=1), SamplingParams(top_p=1e-6),
                 SamplingParams(temperature=1e-4))
    assert sample(logits, seqs) == logits.argmax(-1).tolist()


def test_top_k_beyond_the_vocabulary_is_no_filter_and_draws_stay_inside_it():
    torch.manual_seed(1)
    logits = torch.randn(3, 50)
    seqs = _seqs(SamplingParams(top_k=2**31 - 1, seed=1), SamplingParams(top_k=-1, seed=1), SamplingParams(seed=1))
    picks = sample(logits, seqs)
    assert all(0 <= p < 50 for p in picks)
    same = _seqs(*(SamplingParams(top_k=k, seed=4) for k in (2**31 - 1, -1, 0, 50)))
    assert len({tuple(sample(logits[:1], [s])) for s in same}) == 1  # all four mean "no top-k"


def test_a_seed_reproduces_the_draw_and_top_k_bounds_it():
    logits = torch.linspace(0, 1, 100).repeat(2, 1)
    draws = [sample(logits, _seqs(SamplingParams(seed=s, top_k=3), SamplingParams(seed=s, top_k=3)))
             for s in (5, 5, 2**64 - 1, -(2**63))]
    assert draws[0] == draws[1]
    assert all(p in (97, 98, 99) for d in draws for p in d)


@pytest.mark.parametrize(("field", "value"), [("seed", 2**64), ("seed", -(2**63) - 1), ("top_k", -2),
                                              ("top_k", 2**31), ("logprobs", 21), ("prompt_logprobs", -1),
                                              ("stop_token_ids", [2**31]), ("temperature", True)])
def test_out_of_range_params_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_max_tokens_zero_only_for_prompt_scoring():
    assert SamplingParams(max_tokens=0, prompt_logprobs=0).max_tokens == 0
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)


def test_token_logprobs_is_the_fp32_log_softmax_with_ordered_top_alternatives():
    torch.manual_seed(2)
    logits = torch.randn(ROW_CHUNK + 7, 40, dtype=torch.bfloat16)  # more rows than one chunk
    targets = torch.randint(0, 40, (logits.shape[0],)).tolist()
    top_n = [i % 4 for i in range(logits.shape[0])]
    out = token_logprobs(logits, targets, top_n)
    want = torch.log_softmax(logits.float(), dim=-1)
    for i, lp in enumerate(out):
        assert lp.token_id == targets[i]
        assert lp.logprob == pytest.approx(want[i, targets[i]].item(), abs=1e-6)
        assert [t for t, _ in lp.top] == want[i].topk(top_n[i]).indices.tolist()
        assert all(a[1] >= b[1] for a, b in zip(lp.top, lp.top[1:], strict=False))
