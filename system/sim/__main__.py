"""`python -m system.sim`: see system/sim/cli.py.

The one file under system/ that imports the harness's checker: the command is where the
simulator meets the checker that decides its runs' linearizability (everything the
command runs takes it as an argument, `check`). tests/test_purity.py allows this file alone.
"""

from checker import check_versioned_kv

# Run the copy of the module that everything else imports (not __main__), so the classes a
# --variant refers to are the ones main() checks against.
from system.sim.cli import main

raise SystemExit(main(check=check_versioned_kv))
