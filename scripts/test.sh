#!/usr/bin/env bash
# Set up and run the whole test suite (fast and slow tests) plus the linter.
# Where a Docker engine answers, the node image is built first (offline, cached across runs
# on the same machine), so the Docker platform's tests and runs find it.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check -e ".[dev]"
python3 -m ruff check .
if python3 -c 'import sys; from nemesis.platforms.docker import docker_available; ok, why = docker_available(); print("docker:", why); sys.exit(0 if ok else 1)'; then
    python3 -m nemesis.platforms.image
fi
python3 -m pytest "$@"
