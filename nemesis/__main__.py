import sys

from nemesis.cli import main

sys.exit(main())
