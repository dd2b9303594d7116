"""`python -m rl_core COMMAND ...`: the command line of rl_core (the package rl_core.cli, whose
docstring lists every command and the module that holds it)."""

from __future__ import annotations

import sys

from rl_core.cli import main

if __name__ == "__main__":
    sys.exit(main())
