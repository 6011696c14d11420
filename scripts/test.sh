#!/usr/bin/env bash
# The whole test suite, from a fresh machine: set up, lint, type-check, test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --tests
.venv/bin/ruff check artifactd tests bench scripts
.venv/bin/ruff format --check artifactd tests bench scripts
.venv/bin/mypy
# Two workers (pytest-xdist): each starts its own registries and podman
# service, so any count works; arguments come last, so `-n 0` runs serially.
.venv/bin/python -m pytest -n 2 "$@"
