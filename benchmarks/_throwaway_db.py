"""A throwaway PostgreSQL database for the portal benchmarks: ``test_<name>_<suffix>``, created and migrated
on the server ``DAY0_DATABASE_URL`` names, dropped when the process exits. Not a benchmark itself."""

from __future__ import annotations

import atexit
import sys


def use_throwaway_database(suffix: str) -> bool:
    """Points Django's default connection at a fresh migrated database; False (with a message) when the
    environment selects no PostgreSQL. Call after ``django.setup()``."""
    from django.conf import settings
    from django.db import connection
    from django.test.utils import setup_test_environment

    database = settings.DATABASES["default"]
    if "postgresql" not in database["ENGINE"]:
        print("set DAY0_DATABASE_URL=postgres://… (the benchmark runs on PostgreSQL)", file=sys.stderr)
        return False
    setup_test_environment()
    database.setdefault("TEST", {})["NAME"] = f"test_{database['NAME']}_{suffix}"
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    atexit.register(connection.creation.destroy_test_db, old_name, verbosity=0)
    return True
