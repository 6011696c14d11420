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
    *S.PREDICT_INPUTS,
    S.METRICS_FILE,
    S.INSECURE,
    S.JSON,
)


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
    engine_args_text: str | None,
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

    The engine's command line may instead come as one string in
    --engine-args (ARTIFACTD_ENGINE_ARGS), as a pod's env gives it.
    `restore --predict` asks the same before it downloads anything.

    Exit 0 whatever it predicts, unless --require-hit and the engine will
    not hit: 17.
    """
    from artifactd.restore.predict import miss_error, pod_inputs, run_predict

    inputs = pod_inputs(
        environ=C.current_environ(),
        args=engine_args,
        engine_args_text=engine_args_text,
        gpu_name=gpu_name,
        model_dir=model_dir,
        relocate=relocate,
        engine_factors=engine_factors,
        engine_python=engine_python,
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
        raise miss_error(result)
