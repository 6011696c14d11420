"""``keygen`` and ``sign``: the publisher's keys, and signing what is already published."""

from __future__ import annotations

from pathlib import Path

import click

from artifactd import constants as C  # noqa: N812
from artifactd.cli import render
from artifactd.cli.group import cli
from artifactd.cli.options import (
    insecure_option,
    json_option,
    load_sign_key,
    option,
    sign_unverified_option,
    signing_basis,
    verify_key_option,
)
from artifactd.cli.specs import SIGN_KEY
from artifactd.errors import UsageError


@cli.command()
@click.option(
    "--out",
    "prefix",
    type=click.Path(path_type=Path),
    default=Path("artifactd"),
    show_default=True,
    metavar="PREFIX",
    help="Write PREFIX.key (private, mode 0600) and PREFIX.pub (public).",
)
@click.option("--force", is_flag=True, help="Replace existing files.")
@json_option
def keygen(*, prefix: Path, force: bool, as_json: bool) -> None:
    """Make an ECDSA P-256 key pair for signing artifacts (the type cosign uses).

    PREFIX.key is PKCS#8 PEM, encrypted with ARTIFACTD_KEY_PASSWORD when it is
    set (set it: an unencrypted key is only as safe as the file). PREFIX.pub
    is the PEM public key that `restore --verify-key` and `cosign verify
    --key` read. Keep PREFIX.key in your CI's secret store; give pods only
    PREFIX.pub. To sign with the same key in cosign, import it there
    (`cosign import-key-pair --key`, the key decrypted with `openssl pkcs8`).

    \b
      ARTIFACTD_KEY_PASSWORD=... artifactd keygen --out ci/signing
      artifactd build MATRIX --sign-key ci/signing.key --store REGISTRY/REPO
      artifactd restore --verify-key ci/signing.pub --target /cache ...
    """
    from artifactd.trust.keys import generate

    pair = generate(
        prefix, password=C.current_environ().get(C.ENV_KEY_PASSWORD) or None, force=force
    )
    if as_json:
        from artifactd.reports import result_report

        render.emit_json(result_report(pair))
        return
    render.echo(
        f"private key {pair.private} ({'encrypted' if pair.encrypted else 'NOT encrypted'})"
    )
    render.echo(f"public key  {pair.public}")
    render.echo(f"key id      {pair.key_id}")
    if not pair.encrypted:
        render.echo(f"hint: set {C.ENV_KEY_PASSWORD} to encrypt the private key", err=True)


@cli.command()
@click.argument("ref")
@option(SIGN_KEY._replace(required=True))
@verify_key_option(
    "Sign only if one of these public keys already signed REF (a PEM file, or env://NAME; "
    "repeatable): the old key while rotating, CI's key when promoting. Else exit 14."
)
@sign_unverified_option
@insecure_option
@json_option
def sign(
    *,
    ref: str,
    sign_key: str,
    verify_keys: tuple[str, ...],
    sign_unverified: bool,
    insecure: bool,
    as_json: bool,
) -> None:
    """Sign an artifact already in a store (REF: STORE:TAG or STORE@sha256:DIGEST).

    Adds a signature by this key to REF's sha256-<hex>.sig (a no-op when the
    key signed it already). `build`, `harvest` and `merge` sign what they
    make with the same --sign-key, which needs no check. This signs what is
    already in a store, which anyone with push access could have put there
    (as `copy --sign-key` does), so it needs --verify-key (REF must verify
    under one of those keys first: a second signer, a key rotation) or, for
    content published before signing began, an explicit --sign-unverified.
    """
    from artifactd.stores.artifacts import sign_ref

    basis = signing_basis(verify_keys, sign_unverified, signing=True, what="sign")
    key = load_sign_key(sign_key)
    if key is None:  # --sign-key "" (an unset variable in a script) names no key
        raise UsageError("sign needs a key: --sign-key is empty", hint="--sign-key PATH.key")
    result = sign_ref(ref, key, basis=basis, insecure=insecure)
    if as_json:
        from artifactd.reports import result_report

        render.emit_json(result_report(result))
    else:
        for s in result.signed:
            render.echo(f"{'signed' if s.added else 'already signed'} {s.digest} -> {s.tag}")
        render.signing(result)
