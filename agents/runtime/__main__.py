"""``python -m agents.runtime COMMAND …``: the runtime's own command line (serve, estimate, make-model, bench),
started without the Django project's package; ``day0 COMMAND`` runs the same commands."""

from __future__ import annotations

import sys

from agents.runtime.commands import main

if __name__ == "__main__":
    sys.exit(main())
