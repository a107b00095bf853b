#!/usr/bin/env bash
# Set up and run the whole test suite (fast and slow tests) plus the linter.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check -e ".[dev]"
python3 -m ruff check .
python3 -m pytest "$@"
