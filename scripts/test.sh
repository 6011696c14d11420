#!/usr/bin/env bash
# The whole test suite, from a fresh machine: set up, lint, type-check, test;
# then the fast suite on every other supported Python the machine has.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --tests
.venv/bin/ruff check artifactd tests bench scripts setup.py
.venv/bin/ruff format --check artifactd tests bench scripts setup.py
.venv/bin/mypy
# Two workers (pytest-xdist): each starts its own registries and podman
# service, so any count works; arguments come last, so `-n 0` runs serially.
.venv/bin/python -m pytest -n 2 "$@"

# The fast suite (scripts/noxfile.py says what it holds) on each other Python
# of its list, in a virtualenv without torch; about a minute each, and half a
# minute more the first time (the virtualenv). nox finds pythonX.Y on PATH;
# pyenv's versions are added after it. An absent Python is skipped, with a line.
for bin in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.*/bin; do
    [[ -d $bin ]] && PATH="$PATH:$bin"
done
dev=$(.venv/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')
read -ra pythons < <(.venv/bin/python -c \
    'import runpy; print(*runpy.run_path("scripts/noxfile.py")["PYTHONS"])')
summary=("python$dev: the whole suite (.venv)")
failed=0
for version in "${pythons[@]}"; do
    [[ $version == "$dev" ]] && continue
    if ! command -v "python$version" >/dev/null; then
        summary+=("python$version: not on this machine, skipped")
        continue
    fi
    start=$SECONDS
    if .venv/bin/nox -f scripts/noxfile.py -s "fast-$version"; then
        summary+=("python$version: the fast suite passed ($((SECONDS - start)) s)")
    else
        summary+=("python$version: the fast suite FAILED ($((SECONDS - start)) s)")
        failed=1
    fi
done
printf 'test: %s\n' "${summary[@]}"
exit "$failed"
