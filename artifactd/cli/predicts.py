"""``predict``: will the engine use the restored compile cache? Said before it starts.

What it does lives in :mod:`artifactd.restore.predict`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from artifactd import constants as C  # noqa: N812
from artifactd.cli import render
from artifactd.cli import specs as S  # noqa: N812
from artifactd.cli.group import cli
from artifactd.cli.options import options
from artifactd.cli.specs import Opt
from artifactd.errors import UsageError

_SPECS = (
    Opt(
        "--cache-root",
        "cache_root",
        "A VLLM_CACHE_ROOT on disk (a restored target's vllm dir, or a baked tree).",
        C.ENV_PREDICT_CACHE_ROOT,
        metavar="DIR",
        kind="path",
    ),
    Opt(
        "--from",
        "ref",
        "An artifact (oci:DIR:TAG or HOST/REPO:TAG): only its config is read.",
        C.ENV_PREDICT_FROM,
        metavar="REF",
    ),
    Opt(
        "--gpu-name",
        "gpu_name",
        "The GPU's name (a node label such as nvidia.com/gpu.product); else NVML.",
        C.ENV_GPU_NAME,
        metavar="NAME",
    ),
    Opt(
        "--model-dir",
        "model_dir",
        "The model's local dir: its config.json gives the dtype when --dtype is auto.",
        C.ENV_MODEL_DIR,
        metavar="DIR",
        kind="path",
    ),
    Opt(
        "--relocate",
        "relocate",
        "OLD=NEW: where a build path (a venv, site-packages) lives in this image; a traced"
        " file found there is reported as moved.",
        C.ENV_RELOCATE,
        metavar="OLD=NEW",
        multiple=True,
    ),
    Opt(
        "--engine-factors",
        "engine_factors",
        "A JSON file of whole factor groups the engine's image computed (config, compiler,"
        " or 0.33's config_hash, compiler_hash): compared whole instead of by leaf.",
        C.ENV_ENGINE_FACTORS,
        metavar="FILE",
        kind="path",
    ),
    Opt(
        "--engine-python",
        "engine_python",
        "The engine's Python, where vLLM and torch are installed (default: the one running"
        " artifactd).",
        C.ENV_ENGINE_PYTHON,
        metavar="PATH",
    ),
    Opt(
        "--require-hit",
        "require_hit",
        "Exit 17 unless the engine will hit (a predicted miss or an unknown).",
        C.ENV_REQUIRE_HIT,
        is_flag=True,
    ),
    S.METRICS_FILE,
    S.INSECURE,
    S.JSON,
)


#: Most --relocate pairs (each is tried for every traced file missing at its path).
MAX_RELOCATIONS = 64


def _relocations(values: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    if len(values) > MAX_RELOCATIONS:
        raise UsageError(
            f"{len(values)} --relocate pairs: at most {MAX_RELOCATIONS}",
            hint="name the venv or site-packages roots, not each file",
        )
    out = []
    for value in values:
        old, eq, new = value.partition("=")
        if not eq or not old.startswith("/") or not new.startswith("/"):
            raise UsageError(
                f"--relocate {value!r} is not OLD=NEW with two absolute paths",
                hint="e.g. --relocate /opt/venv-build=/opt/venv",
            )
        out.append((old, new))
    return tuple(out)


@cli.command(context_settings={"ignore_unknown_options": True})
@options(_SPECS)
@click.argument("engine_args", nargs=-1, type=click.UNPROCESSED)
def predict(
    *,
    cache_root: Path | None,
    ref: str | None,
    gpu_name: str | None,
    model_dir: Path | None,
    relocate: tuple[str, ...],
    engine_factors: Path | None,
    engine_python: str | None,
    require_hit: bool,
    metrics_file: Any,
    insecure: bool,
    as_json: bool,
    engine_args: tuple[str, ...],
) -> None:
    """Predict the engine's own compile-cache hit before it starts (vLLM).

    Run it in an init container from the engine's image, with the pod's
    environment, and pass the engine's command line after --:

    \b
      artifactd predict --cache-root /cache/vllm -- vllm serve /models/m \\
          --max-num-batched-tokens 8192 -tp 2

    For each vLLM compile cache entry it recomputes the dir name from the
    recorded factors (an unknown recipe is said, never guessed), then
    compares env (vLLM's own env factors under this environment), code
    (each traced file re-hashed here), compiler (GPU name, torch_key, CUDA)
    and config (the engine's arguments): `will hit`, `will miss: <factor>:
    <recorded> -> <pod>`, or `unknown` with the reason.

    Exit 0 whatever it predicts, unless --require-hit and the engine will
    not hit: 17.
    """
    from artifactd.errors import PredictedMissError
    from artifactd.restore.engineside import PodInputs
    from artifactd.restore.predict import read_groups, run_predict

    inputs = PodInputs(
        environ=C.current_environ(),
        argv=engine_args,
        model_dir=model_dir,
        gpu_name=gpu_name,
        relocations=_relocations(relocate),
        groups=read_groups(engine_factors) if engine_factors is not None else {},
        python=engine_python,
    )
    result = run_predict(
        cache_root=cache_root,
        ref=ref,
        inputs=inputs,
        insecure=insecure,
        events=render.event_printer(as_json),
    )
    if metrics_file is not None:
        from artifactd.pod.metrics import predict_registry, write_textfile

        warning = write_textfile(metrics_file, predict_registry(result))
        if warning is not None:
            render.echo(warning, err=True)
    if as_json:
        from artifactd.reports import predict_report

        render.emit_json(predict_report(result))
    else:
        render.prediction(result)
    if require_hit and result.outcome != "hit":
        misses = [e.line() for e in result.entries]
        raise PredictedMissError(
            f"the engine will not hit its compile cache ({result.outcome}): "
            + " | ".join(misses)[:2000],
            hint="fix the factor named (or rebuild the artifact for this pod); "
            "drop --require-hit to start anyway",
        )
