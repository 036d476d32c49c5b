"""A database check (``manage.py migrate`` and ``manage.py check --database default`` run it): stored verdicts
judged under an older defaults table are named, with the command that judges them again."""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.db import DatabaseError

from apps.evidence.rejudge import outdated_defaults_count
from contract.thresholds import DEFAULTS_VERSION


@checks.register(checks.Tags.database)
def outdated_verdicts_check(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    if not databases:
        return []
    try:
        stale = outdated_defaults_count()
    except DatabaseError:  # not migrated yet: nothing is stored under older defaults
        return []
    if not stale:
        return []
    return [checks.Warning(f"{stale} stored stage results were judged under an older defaults version than "
                           f"{DEFAULTS_VERSION}", hint="run `manage.py rejudge_results` (manage.py seed runs it too)",
                           id="evidence.W001")]
