"""CSV text for exports: one header row, ``None`` as an empty field, and text that a spreadsheet would run as a
formula (a leading ``=``, ``+``, ``-``, ``@``, tab or carriage return: a model's name is free text) prefixed with
an apostrophe. Numbers are written as they are (a negative lead time stays a number)."""

from __future__ import annotations

import csv
import io
import re
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


FILENAME_PART_MAX = 60
_UNSAFE_IN_FILENAME = re.compile(r"[^A-Za-z0-9._-]+")


def attachment_disposition(*parts: str, ext: str) -> str:
    """A ``Content-Disposition: attachment`` value whose filename joins the non-empty ``parts`` (query parameters
    such as a model slug, which may hold anything: quotes, CR/LF, ``;``) reduced to letters, digits, ``.``,
    ``_`` and ``-``, so a header can neither break nor carry a second ``filename``."""
    safe = [_UNSAFE_IN_FILENAME.sub("-", str(p)).strip(".-")[:FILENAME_PART_MAX] for p in parts]
    stem = "-".join(p for p in safe if p) or "export"
    return f'attachment; filename="{stem}.{ext}"'
