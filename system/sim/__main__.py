"""`python -m system.sim`: see system/sim/cli.py."""

# Run the copy of the module that everything else imports (not __main__), so the classes a
# --variant refers to are the ones main() checks against.
from system.sim.cli import main

raise SystemExit(main())
