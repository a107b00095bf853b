"""Entry point of `python -m checker` (see checker.cli)."""

import os
import sys

from checker.cli import main

try:
    sys.exit(main())
except BrokenPipeError:
    # Output piped into `head` and closed early: not an error of the check.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(0)
