#!/usr/bin/env python3
"""Download the library releases the drift guards read, and unpack the files they need.

The releases (project, version, archive URL, size, sha256, members) are pinned
in ``tests/fixtures/drift/releases.json``. For each one this script downloads
the archive from PyPI (or takes it from ``--from DIR``), refuses it unless its
size and sha256 match the pin, extracts only the listed members into
``<dest>/<key>/`` (an sdist's top-level ``<name>-<version>/`` is stripped, so
members have their wheel paths) and writes ``<dest>/<key>/.release.json``.
The archive itself is not kept. A release already unpacked with the pinned
sha256 is not fetched again.

``<dest>`` is ``--dest``, else ``$ARTIFACTD_DRIFT_SOURCES``, else
``.artifactd/drift`` in the checkout (ignored by git). ``scripts/setup.sh``
runs this; ``tests/test_drift_guards.py`` fails until it has run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.request
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from artifactd.constants import ENV_DRIFT_SOURCES  # noqa: E402 - after the path set-up

RELEASES = ROOT / "tests" / "fixtures" / "drift" / "releases.json"
STAMP = ".release.json"
_CHUNK = 1 << 20
_TIMEOUT_S = 120


class FetchError(Exception):
    """A release could not be fetched or did not match its pin."""


def default_dest() -> Path:
    """Return where the sources go: ``$ARTIFACTD_DRIFT_SOURCES``, else ``.artifactd/drift``."""
    configured = os.environ.get(ENV_DRIFT_SOURCES)
    return Path(configured) if configured else ROOT / ".artifactd" / "drift"


def load_releases(path: Path) -> dict[str, dict[str, Any]]:
    """Return the pinned releases by key."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    releases: dict[str, dict[str, Any]] = doc["releases"]
    return releases


def is_current(release: dict[str, Any], out: Path) -> bool:
    """Whether ``out`` already holds this release's members, unpacked from the pinned archive."""
    try:
        stamp = json.loads((out / STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return stamp.get("sha256") == release["sha256"] and all(
        (out / m).is_file() for m in release["members"]
    )


def _download(url: str, into: Path) -> None:
    with urllib.request.urlopen(url, timeout=_TIMEOUT_S) as response, into.open("wb") as f:  # noqa: S310 - pinned https URL
        shutil.copyfileobj(response, f, _CHUNK)


def _verify(release: dict[str, Any], archive: Path) -> None:
    digest = hashlib.sha256()
    with archive.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    size = archive.stat().st_size
    if size != release["size"] or digest.hexdigest() != release["sha256"]:
        raise FetchError(
            f"{release['filename']}: size {size}, sha256 {digest.hexdigest()}; the pin says"
            f" size {release['size']}, sha256 {release['sha256']}. Not unpacked. Hint: a"
            " truncated download is retried by running the script again; a changed pin"
            " belongs in tests/fixtures/drift/releases.json."
        )


def _members(archive: Path, wanted: set[str]) -> dict[str, bytes]:
    """Return the ``wanted`` regular files of a wheel (zip) or sdist (tar.gz) by package path."""
    found: dict[str, bytes] = {}
    if archive.name.endswith((".whl", ".zip")):
        with zipfile.ZipFile(archive) as z:
            for info in z.infolist():
                if not info.is_dir() and info.filename in wanted:
                    found[info.filename] = z.read(info)
        return found
    with tarfile.open(archive, "r:gz") as t:
        for member in t:
            parts = PurePosixPath(member.name).parts[1:]  # strip <name>-<version>/
            name = PurePosixPath(*parts).as_posix() if parts else ""
            data = t.extractfile(member) if member.isfile() and name in wanted else None
            if data is not None:
                found[name] = data.read()
    return found


def unpack(release: dict[str, Any], archive: Path, out: Path) -> None:
    """Extract the release's members from a verified archive into ``out``, then stamp it."""
    _verify(release, archive)
    wanted = release["members"]
    members = _members(archive, set(wanted))
    missing = [m for m in wanted if m not in members]
    if missing:
        raise FetchError(
            f"{release['filename']} has no {', '.join(missing)}. Hint: the member list in"
            " tests/fixtures/drift/releases.json names files of another release."
        )
    if out.exists():
        shutil.rmtree(out)
    for name in wanted:
        rel = PurePosixPath(name)
        if rel.is_absolute() or ".." in rel.parts:
            raise FetchError(f"{release['filename']}: refusing member path {name!r}")
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(members[name])
    stamp = {k: release[k] for k in ("project", "version", "filename", "sha256")}
    (out / STAMP).write_text(json.dumps(stamp, indent=2) + "\n", encoding="utf-8")


def fetch(key: str, release: dict[str, Any], dest: Path, local: Path | None) -> str:
    """Make ``dest/key`` hold the release's members; return what was done."""
    out = dest / key
    if is_current(release, out):
        return "present"
    if local is not None and (local / release["filename"]).is_file():
        unpack(release, local / release["filename"], out)
        return "unpacked from " + str(local)
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        archive = Path(tmp) / release["filename"]
        try:
            _download(release["url"], archive)
        except OSError as e:
            raise FetchError(
                f"{release['filename']}: download failed ({e}). Hint: PyPI must be reachable,"
                " or pass --from DIR holding the archive."
            ) from e
        unpack(release, archive, out)
    return f"downloaded {release['size'] / 1e6:.1f} MB"


def main(argv: list[str] | None = None) -> int:
    """Fetch every pinned release (or those named); 1 when one failed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("keys", nargs="*", help="release keys (default: all)")
    parser.add_argument("--dest", type=Path, default=None, help="where to unpack")
    parser.add_argument("--from", dest="local", type=Path, default=None, help="archives dir")
    parser.add_argument("--releases", type=Path, default=RELEASES, help="the pins")
    args = parser.parse_args(argv)
    releases = load_releases(args.releases)
    dest = args.dest or default_dest()
    failed = 0
    for key in args.keys or sorted(releases):
        if key not in releases:
            print(f"fetch_drift_sources: no release {key!r} in {args.releases}", file=sys.stderr)
            failed += 1
            continue
        try:
            print(f"{key}: {fetch(key, releases[key], dest, args.local)}", file=sys.stderr)
        except FetchError as e:
            print(f"fetch_drift_sources: {key}: {e}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
