"""The body of ``GET /api/v1/matrix/`` as JSON text, built with a constant number of queries: PostgreSQL writes
each cell's object as compact text (the keys of ``CellView.as_dict`` in their order) and Python only joins the
texts into rows, instead of decoding each cell's JSON columns and timestamps into objects and encoding them
again. Each model row's cells are kept in this process as one text under the versions of the cells it was built
from (``xmin`` and ``ctid``), the engines' versions, the columns and the engine filter, so a rebuild after a
change (the cached body invalidated) asks PostgreSQL for the rows' versions and builds only the rows whose cells
changed: the response is a join of kept row texts. Other databases take ``matrix_data`` through DRF's renderer;
both give the same JSON value (tested)."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

from django.db import connection
from rest_framework.renderers import JSONRenderer

from apps.accounts.access import Actor
from apps.catalog.engines import parse_engine_filter
from apps.catalog.models import Engine, Hardware, ModelRelease
from apps.matrix.grid_cache import Piece, piece
from apps.matrix.models import Cell
from apps.matrix.selectors import (
    MatrixFilters,
    build_matrix,
    build_matrix_page,
    engine_rank,
    page_of,
    select_row_values,
)
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


# the keys of a model row (``matrix_data``) and the columns they come from (``select_row_values``)
_MODEL_KEYS = ("slug", "name", "organization", "architecture", "family", "params_total", "params_active",
               "released_at")
_MODEL_FIELDS = ("slug", "name", "organization__slug", "architecture", "family", "params_total", "params_active",
                 "released_at")


def _model(m: ModelRelease) -> dict[str, Any]:
    return _model_keys((m.slug, m.name, m.organization.slug, m.architecture, m.family, m.params_total,
                        m.params_active, m.released_at))


def _model_keys(values: tuple[Any, ...]) -> dict[str, Any]:
    """A model row's own keys from its ``_MODEL_FIELDS`` values."""
    row = dict(zip(_MODEL_KEYS, values, strict=True))
    row["released_at"] = row["released_at"].isoformat() if row["released_at"] else None
    return row


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


# a timestamp as Python's isoformat() writes an aware UTC datetime, quoted (microseconds only when there are some)
_ISO = ("COALESCE('\"' || replace(to_char({c} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US'), '.000000', '') "
        "|| '+00:00\"', 'null')")
# per process: each model row's JSON (``_row_set``): its cells' versions, the model's values (``_MODEL_FIELDS``), the
# length of the model's own keys in the row's text, the row
RowKey = tuple[str, tuple[str, str | None] | None, tuple[tuple[int, str], ...], str]  # db, engine, columns, engines
Row = tuple[str, list[Any], int, Piece]
_ROWS: OrderedDict[RowKey, dict[int, Row]] = OrderedDict()
_MAX_SETS = 16  # filter sets (engine × vendor columns) kept: ~3.7 MB each at 200 models × 40 hardware
_MAX_ROWS = 20_000  # rows in one set (models deleted, rows never listed again): cleared past it
_LOCK = threading.Lock()


def _bool(column: str) -> str:
    return f"CASE {column} WHEN true THEN 'true' WHEN false THEN 'false' ELSE 'null' END"


def _cells_sql(where: str) -> str:
    """The JSON text of the cells ``where`` selects, with each cell's engine (name, version, default) and the
    tier and job count that rank it: compact (no space after ``:`` or ``,`` at the top level) and built by
    concatenation, which PostgreSQL ran in 170 ms where ``json_build_object`` took 225 (8,000 cells, a loaded
    2-core host); the keys of ``CellView.as_dict`` in their order, less ``engine``/``engines`` (``_best_texts``)."""
    names = " ".join(f"WHEN {int(t)} THEN %s" for t in TIER_NAMES)
    return (
        "SELECT c.model_id, c.hardware_id, e.name, e.version, e.\"default\", c.tier, c.job_count, concat("
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
    """Each model row's cell versions as one text (``id:version`` per cell, the version ``xmin`` (the writing
    transaction) with ``ctid`` (the tuple's place, new at every UPDATE, twice in one transaction too), so any
    write is seen, bulk updates and raw SQL included), then a row with no model: every engine's version (a cell
    shows its engine's name, version and default flag). A text per row, not per cell: nothing per cell for the
    driver to decode. The cells come in the order of the (model, hardware, engine) unique index, read as it is
    (no sort); were PostgreSQL to aggregate them in another order, the row would only be rebuilt."""
    return (f"SELECT c.model_id, string_agg(c.id::text || ':' || c.xmin::text || c.ctid::text, ' ') FROM ("
            f"SELECT c.model_id, c.id, c.xmin, c.ctid FROM {Cell._meta.db_table} c WHERE {_where(by_hardware)} "
            "ORDER BY c.model_id, c.hardware_id, c.engine_id) c GROUP BY c.model_id UNION ALL "
            f"SELECT NULL, string_agg(e.id::text || ':' || e.xmin::text || e.ctid::text, ' ' ORDER BY e.id) "
            f"FROM {Engine._meta.db_table} e")


Fragment = tuple[int, int, str, str, bool, int, int, str]  # model, hardware, engine name, version, default, tier, jobs, text


def _row_set(key: RowKey) -> dict[int, Row]:
    """The rows kept for one database, engine filter, column list (hardware ids and slugs, in order) and engine
    versions, by model id. The least recently used set goes first."""
    with _LOCK:
        rows = _ROWS.get(key)
        if rows is None or len(rows) > _MAX_ROWS:
            rows = _ROWS[key] = {}
        _ROWS.move_to_end(key)
        while len(_ROWS) > _MAX_SETS:
            _ROWS.popitem(last=False)
        return rows


def _row_pieces(models: list[tuple[Any, ...]], hardware: list[Hardware], by_hardware: bool,
                engine: tuple[str, str | None] | None) -> list[Piece]:
    """Each model's row, ``{…model…,"cells":{"hardware slug":cell,…}}``, in two queries whatever the cells: the
    rows' versions, then the cells of the rows not kept in this process under the same versions (on a warm
    process, the rows whose cells changed; every row on the first request; no query when none changed). A row's
    cells are only reused for the very cells, engines and columns they were built from; its model's own keys
    are compared at every request (the values of ``_MODEL_FIELDS``) and the row rebuilt (not re-read) when they
    differ."""
    params: list[Any] = [[m[0] for m in models], *([[h.pk for h in hardware]] if by_hardware else [])]
    with connection.cursor() as cursor:
        cursor.execute(_versions_sql(by_hardware), params)
        versions: dict[int | None, str] = dict(cursor.fetchall())
        columns = tuple((h.pk, h.slug) for h in hardware)
        rows = _row_set((str(connection.settings_dict.get("NAME")), engine, columns, versions.pop(None, None) or ""))
        stale = [m[0] for m in models if (kept := rows.get(m[0])) is None or kept[0] != versions.get(m[0], "")]
        cells: list[Fragment] = []
        if stale:
            cursor.execute(_cells_sql(_where(by_hardware)), [*(_dumps(n) for n in TIER_NAMES.values()), stale,
                                                            *params[1:]])
            cells = cursor.fetchall()
    built: dict[int, bytes] = {}
    if stale:
        # a cell written between the two queries is built as it is now and kept under the versions before it,
        # which no later request reads: rebuilt again, never served stale
        texts = _best_texts(cells, engine)
        keys = [f"{_dumps(slug)}:" for _, slug in columns]
        for model_id in stale:
            row = texts.get(model_id, {})
            built[model_id] = ",".join(map(str.__add__, keys, [row.get(h, "null") for h, _ in columns])).encode()
    out = []
    for model_id, *values in models:
        kept = rows.get(model_id)
        if (body := built.get(model_id)) is None and kept is not None:
            if kept[1] == values:  # the model's own keys as they were: the row as it was
                out.append(kept[3])
                continue
            body = kept[3].data[kept[2]:-2]  # the model's own keys changed (a rename): its cells did not
        head = f'{_dumps(_model_keys(values))[:-1]},"cells":{{'.encode()
        rows[model_id] = (versions.get(model_id, ""), values, len(head), piece(head + body + b"}}"))
        out.append(rows[model_id][3])
    return out


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


_COMMA = piece(b",")


def matrix_pieces(actor: Actor, filters: MatrixFilters, number: int | None, size: int) -> list[Piece]:
    """``matrix_data`` as JSON, in pieces (``grid_cache.cached_pieces``): the head, then each row (kept in this
    process) with a comma between, then the tail. Three or four queries (one more with ``min_tier``): hardware,
    models, the rows' versions, the cells of the rows that changed (none changed: no query)."""
    if connection.vendor != "postgresql":
        return [piece(JSONRenderer().render(matrix_data(actor, filters, number, size)))]
    hardware, models = select_row_values(actor, filters, *_MODEL_FIELDS)
    page = None
    if number is not None:
        count = len(models)
        number, models = page_of(models, number, size)
        page = {"number": number, "size": size, "pages": max(1, -(-count // size)), "count": count}
    rows = _row_pieces(models, hardware, bool(filters.vendor), parse_engine_filter(filters.engine)) if models else []
    head = f'{{"tiers":{_dumps(TIER_NAMES)},"hardware":{_dumps([_hardware(h) for h in hardware])},"models":['
    tail = f'],"page":{_dumps(page)}}}' if page is not None else "]}"
    out = [piece(head.encode())]
    for n, row in enumerate(rows):
        out += (_COMMA, row) if n else (row,)
    return [*out, piece(tail.encode())]


def matrix_json(actor: Actor, filters: MatrixFilters, number: int | None, size: int) -> str:
    """``matrix_pieces`` as one text."""
    return b"".join(p.data for p in matrix_pieces(actor, filters, number, size)).decode()
