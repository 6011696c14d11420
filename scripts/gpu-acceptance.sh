#!/usr/bin/env bash
# The GPU acceptance on one Hopper node (H200, H100), offline, in under 10 minutes:
# real warm-ups for Inductor, Triton, the driver's PTX JIT, nvcc (generic),
# FlashInfer, CuTe DSL, TileLang, SGLang's JIT, DeepGEMM and vLLM; the GPU probe against the real driver; harvest,
# restore into a fresh root, run again: 0 compiled per family; a canary recorded
# at build and replayed in a pod (status --canary), exactly. One summary
# line at the end; OUT/report.json holds every step. Without a GPU (or with
# --dry-run) it runs what needs none and says which steps it skipped and why.
#
#   bash scripts/gpu-acceptance.sh --wheels /path/to/wheels --out /tmp/acc
#   bash scripts/gpu-acceptance.sh --dry-run --out /tmp/acc       # anywhere
#
# --python PATH   the Python to run with (default: python3 when its torch is a
#                 CUDA build, else this checkout's .venv, else python3)
# --wheels DIR    extra wheels installed offline into OUT/site (pip --no-index
#                 --no-deps): flashinfer-python, nvidia-cutlass-dsl, tilelang,
#                 sglang, sgl-deep-gemm, vllm, artifactd's
#                 own wheel and every dependency the node lacks
# --out DIR       output folder (default ./gpu-acceptance)
# --dry-run       skip the GPU steps even where a GPU is found
# --relocate      restore into OUT/restored, not at the cold caches' path
# --fixture NAME  also keep the GPU probe's recording as tests/fixtures/gpu/NAME.json
# Exit status: 0 when no step failed, 1 when one did, 2 for a usage error.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

python=""
args=()
while (($#)); do
    case "$1" in
        --python) [[ $# -ge 2 ]] || { echo "gpu-acceptance: --python needs a path" >&2; exit 2; }
                  python=$2; shift 2 ;;
        --python=*) python=${1#--python=}; shift ;;
        *) args+=("$1"); shift ;;
    esac
done

cuda_torch() { "$1" -c 'import sys, torch; sys.exit(torch.version.cuda is None)' >/dev/null 2>&1; }
if [[ -z $python ]]; then
    # The node's Python is the one whose torch runs on the GPU; a checkout's
    # .venv made by scripts/setup.sh holds a CPU torch.
    if command -v python3 >/dev/null && cuda_torch python3; then
        python=$(command -v python3)
    elif [[ -x $repo/.venv/bin/python ]]; then
        python=$repo/.venv/bin/python
    else
        python=$(command -v python3 || true)
    fi
fi
if [[ -z $python ]] || ! command -v "$python" >/dev/null; then
    echo "gpu-acceptance: no Python found (pass --python PATH)" >&2
    exit 2
fi
echo "gpu-acceptance: python $python"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
exec "$python" "$repo/scripts/gpu_acceptance.py" ${args[@]+"${args[@]}"}
