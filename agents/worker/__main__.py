"""``python -m agents.worker agent|jobs …``: the agent's own command line, without the ``day0`` command's package
(``day0 demo`` starts its agent this way); ``day0 agent|jobs`` runs the same commands."""

from __future__ import annotations

import sys

from agents.worker.commands import main

if __name__ == "__main__":
    sys.exit(main())
