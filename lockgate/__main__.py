"""``python -m lockgate``: the ``lockgate`` command-line tool (lockgate/cli.py)."""

from __future__ import annotations

import sys

from lockgate.cli import main

if __name__ == "__main__":
    sys.exit(main())
