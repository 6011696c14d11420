"""``prefetch``, ``gc``, ``node-features``, ``quarantine``: the node-local tier.

Warmed, bounded, published, and kept from serving what failed a canary.
"""

from __future__ import annotations

from pathlib import Path

import click

from artifactd import bounds as B  # noqa: N812
from artifactd import constants as C  # noqa: N812
from artifactd.cli import render
from artifactd.cli import specs as S  # noqa: N812
from artifactd.cli.group import cli
from artifactd.cli.options import (
    family_option,
    fingerprint_options,
    json_option,
    number_option,
    options,
    store_option,
    verify_key_option,
)
from artifactd.cli.specs import family_names
from artifactd.pod.nodefeatures import DEFAULT_MAX_LABELS, LABEL_PREFIX


@cli.command()
@store_option
@click.option(
    "--node-store",
    required=True,
    envvar=C.ENV_NODE_STORE,
    metavar="oci:PATH",
    help="The node store (a local OCI layout on a hostPath), as gc --store and restore "
    "--node-store name it.",
)
@family_option
@fingerprint_options
@click.option(
    "--software-from",
    envvar=C.ENV_SOFTWARE_FROM,
    metavar="REF",
    help="Take the runtime image's software fields from this artifact's fingerprint, "
    "as restore --software-from does (for a prefetch run from the init image).",
)
@verify_key_option(
    "Adopt --software-from only from an artifact signed by one of these public keys "
    "(a PEM file, or env://NAME; repeatable), as restore --verify-key does: unsigned or "
    "wrongly signed exits 14. What the prefetch fetches is verified by each restore."
)
@options(S.MIRRORS)
@json_option
def prefetch(
    *,
    store: str,
    insecure: bool,
    mirrors: tuple[str, ...],
    hosts_dir: Path | None,
    registries_conf: Path | None,
    node_store: str,
    software_from: str | None,
    verify_keys: tuple[str, ...],
    families: tuple[str, ...],
    gpu_arch: str | None,
    image_digest: str | None,
    workload: tuple[str, ...],
    overrides: tuple[str, ...],
    as_json: bool,
) -> None:
    """Fill this node's store for a fingerprint before the pods start (no install).

    Probes this node as restore does (give the pods' --workload, --gpu-arch,
    --image-digest), then copies from STORE into the node store what a
    restore would pick: the whole artifact and its family tags, else each
    family's. Run it from a DaemonSet or a Job when a release rolls out;
    pods then restore with no network. An unreachable STORE exits 3, a full
    node disk 9; with --verify-key, a --software-from artifact no key signed
    exits 14.
    """
    from artifactd.fingerprint.probe import probe_request
    from artifactd.restore.nodefill import prefetch as do_prefetch
    from artifactd.stores.mirrors import MirrorSettings

    settings = MirrorSettings.from_environ(
        urls=mirrors, hosts_dir=hosts_dir, registries_conf=registries_conf
    )

    raw = probe_request(
        gpu_arch=gpu_arch, image_digest=image_digest, workload=workload, overrides=overrides
    )
    if software_from is not None:
        from artifactd.stores.artifacts import adopt_software_from

        raw = adopt_software_from(
            raw,
            software_from,
            store=store,
            verify_keys=verify_keys,
            insecure=insecure,
            mirrors=settings,
        )
    result = do_prefetch(
        store,
        node_store,
        raw,
        families=family_names(families),
        insecure=insecure,
        on_event=render.event_printer(as_json),
        mirrors=settings,
    )
    if as_json:
        from artifactd.reports import result_report

        render.emit_json(result_report(result))
        return
    render.echo(
        f"{result.node}: {result.outcome}; {len(result.fetched)} tag(s) fetched, "
        f"{render.human_bytes(result.bytes_fetched)} in {result.seconds:.2f} s"
    )
    for tag in result.tags:
        render.echo(f"  {tag}")


@cli.command()
@click.option(
    "--store",
    required=True,
    envvar=C.ENV_NODE_STORE,
    metavar="oci:PATH",
    help="The node store to collect (a local OCI layout).",
)
@number_option(
    "--max-bytes",
    bound=B.SIZE,
    metavar="SIZE",
    help="Evict until the store holds at most SIZE (20G; 0 empties it).",
)
@number_option(
    "--min-free",
    bound=B.MIN_FREE_PCT,
    metavar="PCT",
    help="Evict until the store's filesystem has PCT percent free.",
)
@click.option("--apply", "do_apply", is_flag=True, help="Evict. Without it: a dry run, as prune.")
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print what would be evicted; change nothing (the default; kept for scripts).",
)
@click.option(
    "--metrics-file",
    type=click.Path(path_type=Path),
    envvar=C.ENV_METRICS_FILE,
    metavar="PATH",
    help="Write the node store's size and evictions (node-exporter textfile).",
)
@json_option
def gc(
    *,
    store: str,
    max_bytes: int | None,
    min_free: float | None,
    do_apply: bool,
    dry_run: bool,
    metrics_file: Path | None,
    as_json: bool,
) -> None:
    """Evict the least recently used artifacts from a node store: a dry run unless --apply.

    Last use is recorded at each restore and prefetch. Under the node store's
    exclusive lock (a restore reading it holds it shared, so nothing in use
    is removed), tags are evicted oldest use first, then every blob no
    remaining tag references, until the store fits --max-bytes and its disk
    has --min-free percent free. Like prune, gc changes nothing without
    --apply (before 0.2 it evicted by default: a gc line without --apply now
    says so on stderr).
    """
    from artifactd.errors import UsageError
    from artifactd.stores.layout import LayoutStore
    from artifactd.stores.nodestore import gc as do_gc
    from artifactd.stores.nodestore import node_root

    if max_bytes is None and min_free is None:
        raise UsageError("gc needs a target: --max-bytes SIZE and/or --min-free PCT")
    if do_apply and dry_run:
        raise UsageError("gc: --apply and --dry-run contradict each other", hint="give one")
    if not do_apply and not dry_run:
        render.echo(
            "artifactd: note: gc is a dry run unless --apply (as prune is; before 0.2 it "
            "evicted by default): nothing was evicted",
            err=True,
        )
    dry_run = not do_apply
    node = LayoutStore(node_root(store))
    result = do_gc(
        node,
        max_bytes=max_bytes,
        min_free_pct=min_free,
        dry_run=dry_run,
        on_event=render.event_printer(as_json),
    )
    if metrics_file is not None and not dry_run:
        from artifactd.pod.metrics import node_store_registry, write_textfile

        registry = node_store_registry(
            result.bytes_after,
            result.evictions_total,
            high_water_bytes=max_bytes,
            free_ratio=result.free_pct_after / 100,
            min_free_ratio=None if min_free is None else min_free / 100,
        )
        warning = write_textfile(metrics_file, registry)
        if warning is not None:  # an add-on: gc's outcome stands
            render.echo(warning, err=True)
    if as_json:
        from artifactd.reports import result_report

        render.emit_json(result_report(result))
        return
    verb = "would evict" if dry_run else "evicted"
    render.echo(
        f"{result.store}: {verb} {len(result.evicted)} artifact(s), freeing "
        f"{render.human_bytes(result.freed)} ({render.human_bytes(result.bytes_before)} -> "
        f"{render.human_bytes(result.bytes_after)}; {result.free_pct_after:.1f}% free)"
    )
    for ev in result.evicted:
        render.echo(f"  {ev.tag}")
    if result.note:
        render.echo(f"artifactd: warning: {result.note}", err=True)


@cli.command("node-features")
@click.option(
    "--store",
    required=True,
    envvar=C.ENV_NODE_STORE,
    metavar="oci:PATH",
    help="The node store whose artifacts to publish (a local OCI layout).",
)
@click.option(
    "--out",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    metavar="FILE",
    help="The features file to write, in NFD's features.d directory.",
)
@number_option(
    "--max-labels",
    bound=B.MAX_LABELS,
    default=DEFAULT_MAX_LABELS,
    show_default=True,
    help="At most this many labels: the most recently used artifacts.",
)
@click.option(
    "--prefix",
    default=LABEL_PREFIX,
    show_default=True,
    help="The labels' prefix (a DNS subdomain NFD is allowed to label with).",
)
@json_option
def node_features(*, store: str, out: Path, max_labels: int, prefix: str, as_json: bool) -> None:
    """Publish the artifacts a node store holds as node-feature-discovery labels.

    Writes a local features file (NFD's features.d) with one line
    PREFIX/<tag>=true per artifact, most recently used first, at most
    --max-labels; fp-<hash> tags become PREFIX/fp-<first 16 hex>, the label a
    Deployment's preferred node affinity names. Replaced atomically; a node
    store not made yet gives a file with no label.
    """
    from artifactd.pod.nodefeatures import write_features
    from artifactd.stores.nodestore import node_root

    keys = write_features(Path(node_root(store)), out, max_labels=max_labels, prefix=prefix)
    if as_json:
        from artifactd.reports import versioned

        render.emit_json(versioned({"store": store, "file": str(out), "labels": keys}))
        return
    render.echo(f"{out}: {len(keys)} label(s) for {store}")
    for key in keys:
        render.echo(f"  {key}")


@cli.group()
def quarantine() -> None:
    """List or release the artifacts this node refuses to serve (a failed canary).

    `status --canary --node-store oci:PATH` quarantines the artifact whose
    canary failed in a pod: no restore from that node store serves it (nor a
    manifest holding one of its layers) again, and node-features stops
    advertising it.
    """


_QUARANTINE_STORE = click.option(
    "--store",
    "--node-store",
    "node_store",
    required=True,
    envvar=C.ENV_NODE_STORE,
    metavar="oci:PATH",
    help="The node's local OCI layout (a hostPath), as restore --node-store names it.",
)


@quarantine.command("ls")
@_QUARANTINE_STORE
@json_option
def quarantine_ls(*, node_store: str, as_json: bool) -> None:
    """List the quarantined artifacts: digest, since when, why."""
    from artifactd.stores.nodestore import node_root, read_quarantine

    entries = sorted(read_quarantine(node_root(node_store)).values(), key=lambda q: q.since)
    if as_json:
        from artifactd.reports import versioned

        render.emit_json(versioned({"node_store": node_store, "quarantined": entries}))
        return
    render.echo(f"{node_store}: {len(entries)} artifact(s) quarantined")
    for q in entries:
        render.echo(f"  {q.digest} ({len(q.layers)} layer(s)): {q.why}")


@quarantine.command("rm")
@_QUARANTINE_STORE
@click.argument("digest")
@json_option
def quarantine_rm(*, node_store: str, digest: str, as_json: bool) -> None:
    """Release DIGEST: restores from this node store may serve it again."""
    from artifactd.errors import UsageError
    from artifactd.stores.nodestore import node_root, release

    if not release(node_root(node_store), digest):
        raise UsageError(
            f"{digest} is not quarantined in {node_store}",
            hint="`artifactd quarantine ls` lists what is",
        )
    if as_json:
        from artifactd.reports import versioned

        render.emit_json(versioned({"node_store": node_store, "released": digest}))
        return
    render.echo(f"{node_store}: released {digest}")
