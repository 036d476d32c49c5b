"""The body of ``GET /api/v1/matrix/`` as JSON text, built with a constant number of queries: PostgreSQL writes
each cell's object as compact text (the keys of ``CellView.as_dict`` in their order) and Python only joins the
8,000 texts into rows, instead of decoding each cell's JSON columns and timestamps into objects and encoding them
again. The texts are kept in this process by row version (``xmin`` and ``ctid``), so a rebuild after a change
(the cached body invalidated) asks PostgreSQL for the versions and for the changed cells' texts only. Other
databases take ``matrix_data`` through DRF's renderer; both give the same JSON value (tested)."""

from __future__ import annotations

import json
from typing import Any

from django.db import connection
from rest_framework.renderers import JSONRenderer

from apps.accounts.access import Actor
from apps.catalog.engines import parse_engine_filter
from apps.catalog.models import Engine, Hardware, ModelRelease
from apps.matrix.models import Cell
from apps.matrix.selectors import MatrixFilters, build_matrix, build_matrix_page, engine_rank, page_of, select_rows
from contract.tiers import TIER_NAMES


def matrix_data(actor: Actor, filters: MatrixFilters, number: int | None, size: int) -> dict[str, Any]:
    """The API's matrix as plain data: every row, or page ``number`` of ``size`` rows (then with ``page``)."""
    if number is None:
        matrix = build_matrix(actor, filters)
        page = None
    else:
        page = build_matrix_page(actor, filters, number, size)
        matrix = page.matrix
    columns = [(h.pk, h.slug) for h in matrix.hardware]
    rows = []
    for m in matrix.models:
        cells = {slug: (c.as_dict() if (c := matrix.cells.get((m.pk, hw_id))) is not None else None)
                 for hw_id, slug in columns}
        rows.append({**_model(m), "cells": cells})
    data: dict[str, Any] = {"tiers": TIER_NAMES, "hardware": [_hardware(h) for h in matrix.hardware], "models": rows}
    if page is not None:
        data["page"] = {"number": page.number, "size": page.size, "pages": page.pages, "count": page.shown}
    return data


def _hardware(h: Hardware) -> dict[str, Any]:
    return {"slug": h.slug, "vendor": h.vendor, "name": h.name, "memory_bytes": h.memory_bytes,
            "devices_per_node": h.devices_per_node}


def _model(m: ModelRelease) -> dict[str, Any]:
    return {"slug": m.slug, "name": m.name, "organization": m.organization.slug, "architecture": m.architecture,
            "family": m.family, "params_total": m.params_total, "params_active": m.params_active,
            "released_at": m.released_at.isoformat() if m.released_at else None}


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


# a timestamp as Python's isoformat() writes an aware UTC datetime, quoted (microseconds only when there are some)
_ISO = ("COALESCE('\"' || replace(to_char({c} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US'), '.000000', '') "
        "|| '+00:00\"', 'null')")
# per process and database: a cell's "id:version" -> (model id, hardware id, its JSON text); bounded
_FRAGMENTS: dict[str, dict[str, tuple[int, int, str]]] = {}
_MAX_FRAGMENTS = 120_000  # ~50 MB of texts at ~400 bytes a cell: 15 x the 8,000-cell matrix


def _bool(column: str) -> str:
    return f"CASE {column} WHEN true THEN 'true' WHEN false THEN 'false' ELSE 'null' END"


def _cells_sql(where: str) -> str:
    """The JSON text of the cells ``where`` selects, with each cell's engine (name, version, default) and the
    tier and job count that rank it: compact (no space after ``:`` or ``,`` at the top level) and built by
    concatenation, which PostgreSQL ran in 170 ms where ``json_build_object`` took 225 (8,000 cells, a loaded
    2-core host); the keys of ``CellView.as_dict`` in their order, less ``engine``/``engines`` (``_best_texts``)."""
    names = " ".join(f"WHEN {int(t)} THEN %s" for t in TIER_NAMES)
    return (
        "SELECT c.id, c.model_id, c.hardware_id, e.name, e.version, e.\"default\", c.tier, c.job_count, concat("
        "'{\"tier\":', tier, ',\"tier_name\":', COALESCE(CASE tier " + names + " END, 'null'), "
        "',\"failed_stage\":', COALESCE(to_json(NULLIF(failed_stage, ''))::text, 'null'), "
        "',\"fits\":', " + _bool("fits") + ", ',\"fits_devices\":', COALESCE(fits_devices::text, 'null'), "
        "',\"fits_dtype\":', COALESCE((fits_plan -> 'dtype')::text, 'null'), "
        "',\"lead_time_hours\":', COALESCE(to_json(lead_hours)::text, 'null'), "
        "',\"tier_reached_at\":', CASE WHEN jsonb_typeof(tier_reached_at) = 'object' THEN tier_reached_at::text "
        "ELSE '{}' END, "
        "',\"reached_at\":', " + _ISO.format(c="current_tier_reached_at") + ", ',\"jobs\":', job_count, "
        "',\"custom_thresholds\":', " + _bool("custom_thresholds") + ", ',\"synthetic\":', " + _bool("synthetic")
        + ", ',\"disputed\":', CASE WHEN jsonb_typeof(disputed) = 'array' THEN disputed::text ELSE '[]' END, '}')"
        f" FROM {Cell._meta.db_table} c JOIN {Engine._meta.db_table} e ON e.id = c.engine_id WHERE {where}"
    )


def _where(by_hardware: bool) -> str:
    return "c.model_id = ANY(%s)" + (" AND c.hardware_id = ANY(%s)" if by_hardware else "")


def _versions_sql(by_hardware: bool) -> str:
    """Every cell's ``id:version`` in one text: the version is ``xmin`` (the writing transaction) with ``ctid``
    (the tuple's place, new at every UPDATE, twice in one transaction too), so any write is seen, bulk updates and
    raw SQL included. One text instead of 8,000 rows: nothing per cell for the driver to decode. (An engine row's
    own edit is not a cell version: engines are keyed by name and version and not renamed.)"""
    return (f"SELECT string_agg(c.id::text || ':' || c.xmin::text || c.ctid::text, ' ') "
            f"FROM {Cell._meta.db_table} c WHERE {_where(by_hardware)}")


Fragment = tuple[int, int, str, str, bool, int, int, str]  # model, hardware, engine name, version, default, tier, jobs, text


def _cell_texts(models: list[ModelRelease], hardware: list[Hardware], by_hardware: bool) -> list[Fragment]:
    """Every engine's cell of the rows, in two queries whatever the cells: their versions, then the texts of those
    not kept in this process under the same version (on a warm process, the cells that changed; every cell on the
    first request)."""
    fragments = _FRAGMENTS.setdefault(str(connection.settings_dict.get("NAME")), {})
    params: list[Any] = [[m.pk for m in models], *([[h.pk for h in hardware]] if by_hardware else [])]
    with connection.cursor() as cursor:
        cursor.execute(_versions_sql(by_hardware), params)
        tokens = (cursor.fetchone()[0] or "").split()
        found = {token: cell for token in tokens if (cell := fragments.get(token)) is not None}
        missing = {int(token.partition(":")[0]): token for token in tokens if token not in found}
        # most cells unknown (a fresh process): select them as the versions were, faster than 8,000 ids
        whole = len(missing) * 4 > len(tokens)
        cursor.execute(_cells_sql(_where(by_hardware) if whole else "c.id = ANY(%s)"),
                       [*(_dumps(n) for n in TIER_NAMES.values()), *(params if whole else [list(missing)])])
        for cid, *cell in cursor.fetchall():
            if (token := missing.get(cid)) is not None:  # (whole: a cell already known is skipped)
                found[token] = fragments[token] = tuple(cell)
    if len(fragments) > _MAX_FRAGMENTS:  # versions no cell has any more: keep this request's only
        fragments.clear()
        fragments.update(found)
    return list(found.values())


def _best_texts(cells: list[Fragment], engine: tuple[str, str | None] | None) -> dict[int, dict[int, str]]:
    """Each model × hardware's best engine's cell text (``selectors.engine_rank``) by model id and hardware id, with
    its ``engine`` and every engine's (``engines``) as ``CellView.as_dict`` writes them; ``engine`` (the filter:
    a name, or a name and version) keeps only that engine's cells."""
    best: dict[tuple[int, int], tuple[tuple[Any, ...], str, str]] = {}
    listed: dict[tuple[int, int], list[tuple[str, int]]] = {}
    for model_id, hw_id, name, version, default, tier, jobs, text in cells:
        if engine is not None and (name != engine[0] or (engine[1] and version != engine[1])):
            continue
        ref = f"{name}@{version}" if version else name
        key, rank = (model_id, hw_id), engine_rank(tier, default, jobs, version)
        listed.setdefault(key, []).append((ref, tier))
        if key not in best or rank > best[key][0]:
            best[key] = (rank, ref, text)
    out: dict[int, dict[int, str]] = {}
    for (model_id, hw_id), (_, ref, text) in best.items():
        engines = sorted(listed[(model_id, hw_id)], key=lambda e: (e[0] != ref, -e[1]))
        out.setdefault(model_id, {})[hw_id] = (f'{text[:-1]},"engine":{_dumps(ref)},"engines":'
                                               f'{_dumps([{"engine": r, "tier": t} for r, t in engines])}}}')
    return out


def matrix_json(actor: Actor, filters: MatrixFilters, number: int | None, size: int) -> str:
    """``matrix_data`` as JSON text. Four queries (five with ``min_tier``): hardware, models, the cells' versions,
    the texts of the cells that changed."""
    if connection.vendor != "postgresql":
        return JSONRenderer().render(matrix_data(actor, filters, number, size)).decode()
    hardware, models = select_rows(actor, filters)
    page = None
    if number is not None:
        count = len(models)
        number, models = page_of(models, number, size)
        page = {"number": number, "size": size, "pages": max(1, -(-count // size)), "count": count}
    cells = _cell_texts(models, hardware, bool(filters.vendor)) if models and hardware else []
    texts = _best_texts(cells, parse_engine_filter(filters.engine))
    keys, hw_ids = [f"{_dumps(h.slug)}:" for h in hardware], [h.pk for h in hardware]
    rows = []
    for m in models:
        row = texts.get(m.pk, {})
        cells = ",".join(map(str.__add__, keys, [row.get(h, "null") for h in hw_ids]))
        rows.append(f'{_dumps(_model(m))[:-1]},"cells":{{{cells}}}}}')
    body = (f'{{"tiers":{_dumps(TIER_NAMES)},"hardware":{_dumps([_hardware(h) for h in hardware])},'
            f'"models":[{",".join(rows)}]')
    return body + (f',"page":{_dumps(page)}}}' if page is not None else "}")
