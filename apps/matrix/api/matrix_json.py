"""The body of ``GET /api/v1/matrix/`` as JSON text, built with one query per table: PostgreSQL writes each
cell's object (``json_build_object``, the keys of ``CellView.as_dict`` in their order) and Python only joins the
8,000 texts into rows, instead of decoding each cell's JSON columns and timestamps into objects and encoding them
again. Other databases take ``matrix_data`` through DRF's renderer; both give the same JSON value (tested)."""

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


# a timestamp as Python's isoformat() writes an aware UTC datetime (microseconds only when there are some)
_ISO = ("CASE WHEN {c} IS NULL THEN NULL WHEN date_part('microseconds', {c}) = floor(date_part('seconds', {c})) "
        "* 1000000 THEN to_char({c} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"+00:00\"') "
        "ELSE to_char({c} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"+00:00\"') END")


def _cells_sql(by_hardware: bool, engine: tuple[str, str | None] | None) -> str:
    names = " ".join(f"WHEN {int(t)} THEN %s" for t in TIER_NAMES)
    table, engines = Cell._meta.db_table, Engine._meta.db_table
    where = (" AND hardware_id = ANY(%s)" if by_hardware else "") + (
        "" if engine is None else " AND e.name = %s" + (" AND e.version = %s" if engine[1] else ""))
    return (
        f"SELECT model_id, hardware_id, e.name, e.version, e.\"default\", tier, job_count, json_build_object("
        f"'tier', tier, 'tier_name', CASE tier {names} END, 'failed_stage', NULLIF(failed_stage, ''), "
        f"'fits', fits, 'fits_devices', fits_devices, 'fits_dtype', fits_plan -> 'dtype', "
        f"'lead_time_hours', lead_hours, "
        f"'tier_reached_at', CASE WHEN jsonb_typeof(tier_reached_at) = 'object' THEN tier_reached_at "
        f"ELSE '{{}}'::jsonb END, "
        f"'reached_at', {_ISO.format(c='current_tier_reached_at')}, 'jobs', job_count, "
        f"'custom_thresholds', custom_thresholds, 'synthetic', synthetic, "
        f"'disputed', CASE WHEN jsonb_typeof(disputed) = 'array' THEN disputed ELSE '[]'::jsonb END"
        f")::text FROM {table} JOIN {engines} e ON e.id = {table}.engine_id WHERE model_id = ANY(%s)" + where
    )


def _best_texts(rows: list[tuple[Any, ...]]) -> dict[tuple[int, int], str]:
    """Each model × hardware's best engine's cell text (``selectors.engine_rank``), with its ``engine`` and every
    engine's (``engines``) as ``CellView.as_dict`` writes them."""
    best: dict[tuple[int, int], tuple[tuple[Any, ...], str, str]] = {}
    listed: dict[tuple[int, int], list[tuple[str, int]]] = {}
    for model_id, hw_id, name, version, default, tier, jobs, text in rows:
        ref = f"{name}@{version}" if version else name
        key, rank = (model_id, hw_id), engine_rank(tier, default, jobs, version)
        listed.setdefault(key, []).append((ref, tier))
        if key not in best or rank > best[key][0]:
            best[key] = (rank, ref, text)
    out = {}
    for key, (_, ref, text) in best.items():
        engines = sorted(listed[key], key=lambda e: (e[0] != ref, -e[1]))
        out[key] = (f'{text[:-1]},"engine":{_dumps(ref)},"engines":'
                    f'{_dumps([{"engine": r, "tier": t} for r, t in engines])}}}')
    return out


def matrix_json(actor: Actor, filters: MatrixFilters, number: int | None, size: int) -> str:
    """``matrix_data`` as JSON text. Three queries (four with ``min_tier``): hardware, models, cells."""
    if connection.vendor != "postgresql":
        return JSONRenderer().render(matrix_data(actor, filters, number, size)).decode()
    hardware, models = select_rows(actor, filters)
    page = None
    if number is not None:
        count = len(models)
        number, models = page_of(models, number, size)
        page = {"number": number, "size": size, "pages": max(1, -(-count // size)), "count": count}
    texts: dict[tuple[int, int], str] = {}
    if models and hardware:
        params: list[Any] = [*TIER_NAMES.values(), [m.pk for m in models]]
        if filters.vendor:
            params.append([h.pk for h in hardware])
        engine = parse_engine_filter(filters.engine)
        if engine is not None:
            params += [engine[0]] + ([engine[1]] if engine[1] else [])
        with connection.cursor() as cursor:
            cursor.execute(_cells_sql(bool(filters.vendor), engine), params)
            texts = _best_texts(cursor.fetchall())
    columns = [(h.pk, _dumps(h.slug)) for h in hardware]
    rows = []
    for m in models:
        cells = ",".join(f"{slug}:{texts.get((m.pk, hw_id), 'null')}" for hw_id, slug in columns)
        rows.append(f'{_dumps(_model(m))[:-1]},"cells":{{{cells}}}}}')
    body = (f'{{"tiers":{_dumps(TIER_NAMES)},"hardware":{_dumps([_hardware(h) for h in hardware])},'
            f'"models":[{",".join(rows)}]')
    return body + (f',"page":{_dumps(page)}}}' if page is not None else "}")
