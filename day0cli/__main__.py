"""``python -m day0cli COMMAND …``: the ``day0`` command without its installed script."""

from __future__ import annotations

import sys

from day0cli.main import main

if __name__ == "__main__":
    sys.exit(main())
