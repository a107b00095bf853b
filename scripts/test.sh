#!/usr/bin/env bash
# Set up and run the whole test suite (fast and slow tests) plus the linter.
# Headless Chromium (Debian's chromium, chromium-driver) is installed for the report's browser tests.
# Where a Docker engine answers, the node image is built first (offline, cached across runs
# on the same machine), so the Docker platform's tests and runs find it.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check -e ".[dev]"
python3 -m ruff check .
# The report's browser tests drive Debian's headless Chromium through its chromedriver
# (selenium never downloads a browser); install both when missing and we may.
if ! { [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; }; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "installing chromium and chromium-driver (Debian) for the report's browser tests"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
    else
        echo "note: chromium/chromedriver missing and not root: the browser tests will skip"
    fi
fi
# etcd (Debian's etcd-server) is the second system the harness tests (nemesis/systems/etcd/)
# and the benchmark's peer; its tests skip, saying so, where it cannot be installed.
if ! command -v etcd >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "installing etcd-server (Debian) for the etcd system's tests"
        apt-cache show etcd-server >/dev/null 2>&1 || apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends etcd-server >/dev/null
    else
        echo "note: etcd missing and not root: the etcd system's tests will skip"
    fi
fi
if python3 -c 'import sys; from nemesis.platforms.docker import docker_available; ok, why = docker_available(); print("docker:", why); sys.exit(0 if ok else 1)'; then
    python3 -m nemesis.platforms.image
fi
python3 -m pytest "$@"
