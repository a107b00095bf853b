"""Entry point of `python -m checker` (see checker.cli)."""

import sys

from checker.cli import main

sys.exit(main())
