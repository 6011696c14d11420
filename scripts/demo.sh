#!/usr/bin/env bash
# Set up, then build the CPU demo matrix cold into the embedded default store
# (.artifactd/store, a local OCI layout), restore it into a fresh directory
# in a new process, and time the warm start.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/artifactd demo "$@"
