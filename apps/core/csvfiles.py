"""CSV text for exports: one header row, ``None`` as an empty field, and text that a spreadsheet would run as a
formula (a leading ``=``, ``+``, ``-``, ``@``, tab or carriage return: a model's name is free text) prefixed with
an apostrophe. Numbers are written as they are (a negative lead time stays a number)."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_field(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def csv_text(rows: Iterable[Mapping[str, Any]], fieldnames: Sequence[str]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(fieldnames), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: csv_field(v) for k, v in row.items()})
    return out.getvalue()
