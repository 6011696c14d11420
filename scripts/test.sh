#!/usr/bin/env bash
# The whole test suite, from a fresh machine: set up, lint, type-check, test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --tests
.venv/bin/ruff check artifactd tests bench scripts
.venv/bin/ruff format --check artifactd tests bench scripts
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
