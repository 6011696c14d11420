"""``matrix shapes``: a serve matrix's requests from an engine's own traffic metrics."""

from __future__ import annotations

from pathlib import Path

import click

from artifactd import bounds as B  # noqa: N812
from artifactd.build.scrape import FETCH_TIMEOUT_S
from artifactd.cli import render
from artifactd.cli.fanout import matrix
from artifactd.cli.options import json_option, number_option


@matrix.command()
@click.option(
    "--from-metrics",
    "sources",
    multiple=True,
    required=True,
    metavar="FILE|URL",
    help="A /metrics scrape (a file) or an http(s) URL of one; repeat it for "
    "each replica or scrape: they are summed.",
)
@number_option(
    "--coverage",
    bound=B.COVERAGE,
    default=0.99,
    show_default=True,
    help="Fraction of the observed traffic to cover.",
)
@click.option(
    "--engine",
    type=click.Choice(["auto", "vllm", "sglang"]),
    default="auto",
    show_default=True,
    help="Whose metric families to read (auto: by their vllm: or sglang: prefix).",
)
@number_option(
    "--timeout",
    "timeout_s",
    bound=B.SCRAPE_TIMEOUT_S,
    default=FETCH_TIMEOUT_S,
    show_default=True,
    metavar="S",
    help="Seconds a URL may take to answer in full.",
)
@click.option(
    "--write",
    "write",
    type=click.Path(path_type=Path),
    default=None,
    metavar="MATRIX",
    help="Replace MATRIX's serve.requests block with the result, in place; "
    "every other line and comment stays as it is.",
)
@json_option
def shapes(
    *,
    sources: tuple[str, ...],
    coverage: float,
    engine: str,
    timeout_s: float,
    write: Path | None,
    as_json: bool,
) -> None:
    """Serve requests and CUDA-graph sizes that cover COVERAGE of observed traffic.

    Reads vLLM's or SGLang's Prometheus histograms of prompt and generation
    lengths, tokens per step and the running-requests gauge, and prints the
    prompt-length buckets, max_tokens, concurrency and CUDA-graph batch sizes
    that cover that fraction, with the YAML `requests:` to paste into a serve
    matrix (or --write it). Figures are at the histograms' bucket granularity.

    \b
      artifactd matrix shapes --from-metrics http://10.0.3.7:8000/metrics \\
          --from-metrics http://10.0.3.8:8000/metrics --coverage 0.99
      artifactd matrix shapes --from-metrics scrape.txt --write warmup_matrices/vllm-h100.yaml
    """
    from artifactd.build.shapes import shapes_from_metrics

    result = shapes_from_metrics(
        list(sources),
        coverage=coverage,
        engine=engine,  # type: ignore[arg-type]  # click.Choice checked it
        timeout_s=timeout_s,
    )
    if write is not None:
        from artifactd.build.matrix_edit import replace_requests

        replace_requests(
            write,
            result.requests,
            comment=f"from traffic: artifactd matrix shapes --coverage {coverage:g} "
            f"({result.requests_observed} {result.engine} requests observed)",
        )
    if as_json:
        from artifactd.reports import shapes_report

        render.emit_json(shapes_report(result, written=write))
        return
    render.shapes(result)
    if write is not None:
        render.echo(f"wrote serve.requests into {write}")
