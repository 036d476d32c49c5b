"""The needle heatmap's rows: the eval section's target and reference grids ([length][depth]) zipped per cell in
the selector, so the template loops over rows and cells only."""

from __future__ import annotations

from apps.dashboards.selectors.cell import needle_heatmap


def test_grids_are_paired_per_length_and_depth() -> None:
    heat = needle_heatmap({"lengths": [256, 512], "depths": [0, 50], "depth_unit": "percent", "samples": 2,
                           "target": [[1.0, 0.25], [0.5, 0.0]], "reference": [[1.0, 0.5], [0.5, 1.0]]})
    assert [r.length for r in heat.rows] == [256, 512] and heat.depths == [0, 50] and heat.samples == 2
    assert [[(c.target, c.reference) for c in r.cells] for r in heat.rows] == [[(1.0, 1.0), (0.25, 0.5)],
                                                                               [(0.5, 0.5), (0.0, 1.0)]]
    assert [[c.below for c in r.cells] for r in heat.rows] == [[False, True], [False, True]]
    assert [[c.on_dark for c in r.cells] for r in heat.rows] == [[True, False], [True, False]]


def test_ragged_or_non_numeric_grids_show_missing_cells_instead_of_shifting() -> None:
    heat = needle_heatmap({"lengths": [256, 512], "depths": [0, 50],
                           "target": [[1.0, "x"], [0.5]], "reference": [[1.0, 1.0], [0.5, 1.0], [1.0, 1.0]]})
    assert [r.length for r in heat.rows] == [256, 512, None]  # a third reference row without a length
    assert [[(c.target, c.reference) for c in r.cells] for r in heat.rows] == [
        [(1.0, 1.0), (None, 1.0)], [(0.5, 0.5), (None, 1.0)], [(None, 1.0), (None, 1.0)]]
    assert not any(c.below for r in heat.rows for c in r.cells)  # a missing side is never "below"


def test_without_lengths_or_a_grid_there_is_no_heatmap() -> None:
    assert needle_heatmap(None) is None
    assert needle_heatmap({"lengths": [], "target": [[1.0]], "reference": [[1.0]]}) is None
    assert needle_heatmap({"lengths": [256], "target": [[1.0]]}) is None
