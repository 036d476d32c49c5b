"""The panel GEMM (``agents.runtime.kernels.panels``) against the product at every tail, the same bits for a
row whatever it is batched with, the cases it refuses, and packed weights' torch code where it does not run."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from agents.runtime import kernels
from agents.runtime.kernels import library

needs_kernels = pytest.mark.skipif(not kernels.available(), reason=f"kernels not built: {kernels.status()}")


@pytest.fixture
def kernels_off(monkeypatch):
    """The layers' torch code, as on a host where the library is not built."""
    monkeypatch.setattr(library, "state", "unavailable")


@needs_kernels
@pytest.mark.parametrize("rows,out,inner", [(1, 1, 1), (1, 33, 70), (2, 16, 64), (3, 77, 5), (16, 48, 300),
                                            (17, 100, 257), (40, 31, 768), (129, 64, 513), (5, 20, 0)])
@pytest.mark.parametrize("bias", [False, True])
def test_panel_linear_equals_the_product_at_every_tail(rows, out, inner, bias):
    """Tails of every kind: one row, a partial 16-row tile, more than one tile, an output count that leaves the
    last panel partly padding, K past one K block and not a multiple of 16, K = 0."""
    torch.manual_seed(rows * 1000 + out + inner)
    w, x = torch.randn(out, inner), torch.randn(rows, inner)
    b = torch.randn(out) if bias else None
    wp = kernels.pack_panels(w)
    assert wp.shape == (-(-out // kernels.PANEL), inner, kernels.PANEL)
    y = kernels.panel_linear(x, wp, out, b)
    want = F.linear(x.double(), w.double(), None if b is None else b.double())
    assert y.shape == (rows, out)
    assert torch.allclose(y.double(), want, atol=1e-4 * max(1, inner) ** 0.5, rtol=1e-5)


@needs_kernels
def test_panel_linear_gives_a_row_the_same_bits_whatever_it_is_batched_with():
    """Each output is one multiply-add chain over k in order: a row alone, in a batch of 16, in a batch of 300
    (K blocked), strided, on one thread or two: the same bits."""
    torch.manual_seed(3)
    w, x = torch.randn(200, 640), torch.randn(300, 640)
    wp = kernels.pack_panels(w)
    batch = kernels.panel_linear(x, wp, 200)
    wide = torch.randn(300, 1000)
    wide[:, 100:740] = x
    assert torch.equal(kernels.panel_linear(wide[:, 100:740], wp, 200), batch)  # rows strided
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            assert torch.equal(kernels.panel_linear(x[:16].contiguous(), wp, 200), batch[:16])
            for i in (0, 7, 299):
                assert torch.equal(kernels.panel_linear(x[i:i + 1].contiguous(), wp, 200), batch[i:i + 1])
    finally:
        torch.set_num_threads(threads)


@needs_kernels
def test_panel_linear_refuses_what_it_does_not_cover():
    w, x = torch.randn(40, 24), torch.randn(3, 24)
    wp = kernels.pack_panels(w)
    assert kernels.panel_linear(x, wp, 40) is not None
    assert kernels.panel_linear(x, wp, 49) is None  # more outputs than the panels hold
    assert kernels.panel_linear(x, wp, 32) is None  # a whole panel of padding: not this weight's panels
    assert kernels.panel_linear(torch.randn(3, 25), wp, 40) is None  # K of another width
    assert kernels.panel_linear(x.double(), wp, 40) is None
    assert kernels.panel_linear(x.t().contiguous().t(), wp, 40) is None  # columns strided
    assert kernels.panel_linear(x, wp, 40, torch.randn(41)) is None  # bias of another length
    assert kernels.pack_panels(w.double()) is None and kernels.pack_panels(w.t()) is None


def test_panel_packed_weights_run_their_torch_code_where_the_kernel_does_not(kernels_off, monkeypatch):
    """With the library out of reach (or a dispatch mode tracing), a panel-packed weight's product is computed
    by torch ops, to the same values."""
    from agents.runtime.layers import linear

    torch.manual_seed(5)
    w, x, b = torch.randn(40, 24), torch.randn(6, 24), torch.randn(40)
    panels = torch.zeros(48, 24)
    panels[:40] = w
    packed = torch.nn.Parameter(panels.view(3, 16, 24).transpose(1, 2).contiguous(), requires_grad=False)
    packed.panel_rows = 40
    assert torch.allclose(linear.dense_linear(x, packed, b), F.linear(x, w, b), atol=1e-5)
