"""``inspect``, ``ls``, ``copy`` and ``mirrors``: what a store holds, moving it, and by where."""

from __future__ import annotations

from pathlib import Path

import click

from artifactd import constants as C  # noqa: N812
from artifactd.cli import render
from artifactd.cli import specs as S  # noqa: N812
from artifactd.cli.group import cli
from artifactd.cli.options import (
    insecure_option,
    json_option,
    load_sign_key,
    options,
    positional_or_option,
    sign_key_option,
    sign_unverified_option,
    signing_basis,
    verify_key_option,
)


@cli.command()
@click.argument("ref")
@click.option("--files", "show_files", is_flag=True, help="List every file.")
@verify_key_option(
    "Check the signatures and attestations with these public keys (repeatable); "
    "exit 14 when no key verifies the artifact's signature."
)
@insecure_option
@json_option
def inspect(
    *, ref: str, show_files: bool, verify_keys: tuple[str, ...], insecure: bool, as_json: bool
) -> None:
    """Show what an artifact holds: fingerprint, families, files, provenance, signatures.

    REF is oci:DIR:TAG, HOST[:PORT]/REPO:TAG, or either with @sha256:DIGEST
    (see `artifactd ls`). Signatures (sha256-<hex>.sig) and attestations
    (sha256-<hex>.att, the build provenance) are listed; with --verify-key
    they are checked, and the command fails (exit 14) unless a given key
    signed exactly this artifact's digest.
    """
    from artifactd.stores.artifacts import inspect_ref
    from artifactd.trust.keys import load_public_keys

    keys = load_public_keys(verify_keys) if verify_keys else []
    art, trust = inspect_ref(ref, keys=keys, insecure=insecure)
    if as_json:
        from artifactd.reports import inspect_report

        render.emit_json(inspect_report(art, trust))
    else:
        render.inspect(art, show_files=show_files)
        render.trust(trust)
    if keys and trust.verified_by is None:
        from artifactd.errors import TrustError

        raise TrustError(trust.error or "not verified", reason=trust.reason or "unknown_key")


@cli.command(name="ls")
@click.argument("store", required=False, default=None)
@click.option(
    "--store",
    "store_option",
    metavar="REF",
    help="The store, as every command takes it (the STORE argument is the same).",
)
@insecure_option
@json_option
def ls_cmd(*, store: str | None, store_option: str | None, insecure: bool, as_json: bool) -> None:
    """List the tags in a store (default: ARTIFACTD_STORE or oci:.artifactd/store)."""
    from artifactd.stores import list_tags

    given = positional_or_option(store, store_option, flag="--store", name="the store")
    ref = given or C.current_environ().get(C.ENV_STORE, C.DEFAULT_STORE)
    tags = list_tags(ref, insecure=insecure)
    if as_json:
        from artifactd.reports import tags_report

        render.emit_json(tags_report(ref, tags))
        return
    for tag in tags:
        click.echo(tag)


@cli.command()
@click.argument("source")
@click.argument("destination")
@click.option(
    "--tag",
    "tags",
    multiple=True,
    metavar="TAG",
    help="Copy only these tags (repeatable). Default: every artifactd artifact.",
)
@verify_key_option(
    "Copy only what one of these public keys signed (a PEM file, or env://NAME; "
    "repeatable): every manifest is verified in SOURCE before anything is written to "
    "DESTINATION; one that does not verify exits 14 and nothing is copied or signed."
)
@sign_key_option
@sign_unverified_option
@insecure_option
@json_option
def copy(
    *,
    source: str,
    destination: str,
    tags: tuple[str, ...],
    verify_keys: tuple[str, ...],
    sign_key: str | None,
    sign_unverified: bool,
    insecure: bool,
    as_json: bool,
) -> None:
    """Copy artifacts between stores (local layout <-> registry, registry -> registry).

    Blobs the destination already has are not transferred; every blob is
    verified against its digest on the way; a tag is written only after all of
    its manifest's blobs are in place. Signatures and attestations
    (sha256-<hex>.sig/.att) travel with their artifacts and stay valid.

    --sign-key also signs every copied manifest in the destination (a
    promotion signed with the production key). It needs --verify-key (CI's
    public key): everything copied must verify before anything is written
    or signed, so an artifact someone else pushed to SOURCE never leaves with
    your signature. --sign-unverified signs without that check, explicitly.
    """
    from artifactd.stores.artifacts import copy_between

    basis = signing_basis(verify_keys, sign_unverified, signing=bool(sign_key), what="copy")
    key = load_sign_key(sign_key)
    result = copy_between(
        source, destination, list(tags) or None, insecure=insecure, trust=basis, sign_key=key
    )
    if as_json:
        from artifactd.reports import result_report

        render.emit_json(result_report(result))
    else:
        render.copy(result)


@cli.command()
@click.argument("ref")
@options(S.MIRRORS)
@json_option
def mirrors(
    *,
    ref: str,
    mirrors: tuple[str, ...],
    hosts_dir: Path | None,
    registries_conf: Path | None,
    as_json: bool,
) -> None:
    """Show the hosts a pull of REF would use, in order, and why.

    REF is HOST[:PORT]/REPO (a tag or digest may follow). Tags and signatures
    always come from the registry itself; manifests and blobs by digest come
    from each mirror in turn, verified, and last from the registry. The first
    configuration that matches wins: --mirror (ARTIFACTD_MIRRORS), then
    containerd's hosts.toml (--hosts-dir), then registries.conf.
    """
    from artifactd.stores.mirrors import MirrorSettings, explain

    settings = MirrorSettings.from_environ(
        urls=mirrors, hosts_dir=hosts_dir, registries_conf=registries_conf
    )
    plan = explain(ref, settings)
    if as_json:
        render.emit_json(plan.describe())
        return
    render.mirrors(plan)
