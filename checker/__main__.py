"""Entry point of `python -m checker` (see checker.cli)."""

import os
import sys

from checker.cli import main

code = main(own_process=True)
# Leave without tearing the interpreter down: freeing a long history's objects one by one
# cost a tenth of a check's CPU, and nothing is left to run or flush once main returned.
try:
    sys.stdout.flush()
    sys.stderr.flush()
except BrokenPipeError:
    pass
os._exit(code)
