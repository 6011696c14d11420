"""The fingerprint's key: the canonical hash, the per-family scopes, and the document's inputs.

Pure functions over a plain fingerprint document (nested dicts, as
:func:`artifactd.fingerprint.probe.probe_raw` returns it and as
:class:`artifactd.fingerprint.model.Fingerprint` dumps it): :func:`raw_hash`
(sha256 of the canonical JSON of the hashed view, all but ``info``),
:func:`scope_key` (one family's fields and nothing else), the software fields a
pod adopts from its runtime image (:func:`adopt_software`), and the parsing of
what a command states about the document (``--workload`` pairs, ``--set``
overrides, ``--gpu-arch``, ``--image-digest``).

Like the probe, it imports nothing heavy: a no-op restore hashes with it.
"""

from __future__ import annotations

from _collections_abc import Mapping  # collections.abc's own: importing it loads collections

from artifactd.errors import UsageError
from artifactd.fsutil import utf8_argument
from artifactd.hashing import canonical_hash
from artifactd.jsontext import dumps, loads

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, TypeAlias

    Raw: TypeAlias = dict[str, Any]


# --------------------------------------------------------------------------
# Pure helpers shared with the pydantic model
# --------------------------------------------------------------------------


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten nested mappings into dotted-path leaves (lists stay leaves)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, path + "."))
        else:
            out[path] = value
    return out


def hashed_view(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Return the part of a fingerprint document that enters its hash (all but ``info``)."""
    return {k: v for k, v in raw.items() if k != "info"}


#: Fingerprint fields that describe the runtime image's software, not the machine.
#: A container other than the runtime image (the init image) cannot probe them.
SOFTWARE_FIELDS = ("python", "libraries", "compilers", "cuda", "paths", "image", "platform.glibc")


def adopt_software(raw: Mapping[str, Any], source: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``raw`` with every :data:`SOFTWARE_FIELDS` value taken from ``source``.

    Both are fingerprint documents; the machine's fields (GPU, driver, CPU,
    architecture) and the workload stay as ``raw`` has them.
    """
    out: dict[str, Any] = _copy(dict(raw))
    for name in SOFTWARE_FIELDS:
        group, _, leaf = name.partition(".")
        theirs = source.get(group)
        if leaf:
            out.setdefault(group, {})[leaf] = (theirs or {}).get(leaf)
        elif theirs is None:
            out.pop(group, None)
        else:
            out[group] = _copy(theirs)
    return out


def _copy(data: Any) -> Any:
    """Return a deep copy of plain JSON data (what a JSON round trip gives)."""
    return loads(dumps(data))


def count_is_informational(data: Any) -> Any:
    """Read a fingerprint document written before the GPU count left the hash (``gpu.count``).

    Its ``gpu.count`` becomes ``info.gpu_count``, so older artifacts stay
    readable (their fingerprint hash, recorded beside it, is never
    recomputed). Both readers run it first: the pydantic model and the light
    reader (:mod:`artifactd.format.light`).
    """
    if isinstance(data, dict) and isinstance(data.get("gpu"), dict) and "count" in data["gpu"]:
        if not isinstance(data.get("info") or {}, dict):
            return data  # not a fingerprint: the model refuses it as it is
        gpu = dict(data["gpu"])
        count = gpu.pop("count")
        info = dict(data.get("info") or {})
        info.setdefault("gpu_count", count)
        data = {**data, "gpu": gpu, "info": info}
    return data


def raw_hash(raw: Mapping[str, Any]) -> str:
    """Hash a fingerprint document: sha256 of the canonical JSON of its hashed view."""
    return canonical_hash(hashed_view(raw))


def select(flat: Mapping[str, Any], dimensions: Sequence[str]) -> dict[str, Any]:
    """Return the leaves under each dotted prefix; an absent dimension maps to None."""
    chosen: dict[str, Any] = {}
    for dim in dimensions:
        hit = False
        for key, value in flat.items():
            if key == dim or key.startswith(dim + "."):
                chosen[key] = value
                hit = True
        if not hit:
            # Record absence explicitly: "no torch" must differ from "torch X".
            chosen.setdefault(dim, None)
    return chosen


def scope_key(
    flat: Mapping[str, Any], family: str, dimensions: Sequence[str], revision: int = 1
) -> str:
    """Hash the fields one family's validity depends on, and nothing else."""
    return canonical_hash(
        {"family": family, "revision": revision, "scope": select(flat, dimensions)}
    )


# --------------------------------------------------------------------------
# Inputs a command states
# --------------------------------------------------------------------------

#: Where ``sm_`` architectures end: a plain target, or ``a`` / ``f`` (arch- or family-specific).
_ARCH_SUFFIXES = ("a", "f")


def parse_gpu_arch(arch: str) -> tuple[str, str]:
    """Parse ``sm_90a`` into ``("sm_90a", "9.0")``; raise :class:`UsageError` if malformed.

    The form is ``sm_`` and at least two ASCII digits (the last is the minor
    capability), then ``a``, ``f`` or nothing; spaces around it are dropped.
    """
    text = arch.strip()
    digits = text[3:-1] if text.endswith(_ARCH_SUFFIXES) else text[3:]
    if not (text.startswith("sm_") and len(digits) >= 2 and _ascii_digits(digits)):
        raise UsageError(
            f"not a GPU architecture: {arch!r}",
            hint="use the form nvcc and Triton print, e.g. sm_80, sm_90a, sm_100a",
        )
    return text, f"{int(digits[:-1])}.{digits[-1]}"


def _ascii_digits(text: str) -> bool:
    return text.isascii() and text.isdigit()


#: What an image digest is: the algorithm, then 64 lowercase hex digits.
_DIGEST_PREFIX, _DIGEST_HEX = "sha256:", frozenset("0123456789abcdef")


def parse_image_digest(value: str) -> str:
    """Return ``sha256:<hex>`` from a digest or a ``REPO@sha256:<hex>`` reference.

    Both spellings name one image, so both give one fingerprint; anything
    else raises :class:`UsageError` (a tag is not a digest: it can move). A
    reference before the ``@`` is any text without spaces or another ``@``.
    """
    ref, at, digest = value.strip().rpartition("@")
    bad_ref = at and (not ref or "@" in ref or any(c.isspace() for c in ref))
    hex_part = digest[len(_DIGEST_PREFIX) :]
    if (
        bad_ref
        or not digest.startswith(_DIGEST_PREFIX)
        or len(hex_part) != 64
        or not _DIGEST_HEX.issuperset(hex_part)
    ):
        raise UsageError(
            f"not an image digest: {value!r}",
            hint="give sha256:<64 hex> or REPO@sha256:<64 hex> "
            "(`skopeo inspect docker://REF` prints it), never a tag",
        )
    return digest


def parse_pairs(pairs: Sequence[str], *, what: str) -> dict[str, str]:
    """Parse ``KEY=VALUE`` strings (CLI ``--workload`` and friends) into a dict."""
    out: dict[str, str] = {}
    for pair in (utf8_argument(p, what) for p in pairs):
        for item in (p for p in pair.split(",") if p.strip()):
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise UsageError(f"{what} must be KEY=VALUE, got {item!r}")
            out[key.strip()] = value.strip()
    return out


#: Sections where ``--set`` may create keys that the probe did not find.
_OPEN_SECTIONS = ("workload", "libraries")


def _parse_value(text: str) -> Any:
    """Parse a ``--set`` value: text, ``null``, or a ``[...]`` JSON list.

    Text stays text; the model converts "8" and "true" where a field is a
    number or a flag.
    """
    stripped = text.strip()
    if stripped == "null":
        return None
    if stripped.startswith("["):
        try:
            return loads(stripped)
        except ValueError:
            pass
    return text


def check_overrides(assignments: Sequence[str]) -> list[tuple[str, list[str], str]]:
    """Split ``PATH=VALUE`` overrides into (path, its dotted keys, value); refuse a malformed one.

    A command that probes late (``build``, after its cells ran) calls this
    first, so a bad ``--set`` fails before any work.
    """
    out = []
    for item in assignments:
        path, sep, text = utf8_argument(item, "--set").partition("=")
        keys = [k for k in path.strip().split(".") if k]
        if not sep or not keys:
            raise UsageError(
                f"--set wants PATH=VALUE with a dotted path, got {item!r}",
                hint="e.g. --set gpu.arch=sm_100a --set workload.tp=8",
            )
        out.append((path, keys, text))
    return out


def apply_overrides(raw: Raw, assignments: Sequence[str]) -> Raw:
    """Apply ``PATH=VALUE`` overrides (dotted paths as in the JSON Schema) to a document.

    For building on one machine for another target and for "what if" questions:
    ``gpu.arch=sm_100a``, ``driver.version=575.51``, ``workload.tp=8``,
    ``libraries.vllm.version=0.33.0``. A path must exist, except under
    ``workload`` and ``libraries``, where new keys may be added; ``info.*`` may
    be set too (it is never hashed). Returns a new document.
    """
    doc: Raw = _copy(raw)
    for path, keys, text in check_overrides(assignments):
        node: Any = doc
        for depth, key in enumerate(keys[:-1]):
            if not isinstance(node, dict):
                raise UsageError(f"--set {path}: {'.'.join(keys[:depth])} is not a section")
            if key not in node:
                if keys[0] not in _OPEN_SECTIONS:
                    raise UsageError(
                        f"--set {path}: no field {'.'.join(keys[: depth + 1])}",
                        hint="see registry-schema/fingerprint.schema.json",
                    )
                node[key] = {}
            node = node[key]
        leaf = keys[-1]
        if not isinstance(node, dict) or (leaf not in node and keys[0] not in _OPEN_SECTIONS):
            raise UsageError(
                f"--set {path}: no such field", hint="see registry-schema/fingerprint.schema.json"
            )
        if isinstance(node.get(leaf), dict):
            raise UsageError(f"--set {path}: is a section; set one of its fields")
        node[leaf] = text if keys[0] == "workload" else _parse_value(text)
    return doc


class Document:
    """A fingerprint as its full JSON document, the model's own checks already passed.

    What :func:`artifactd.format.light.fingerprint_of` gives a restore instead of
    the pydantic :class:`~artifactd.fingerprint.model.Fingerprint`: ``data`` is
    exactly the model's ``model_dump(mode="json")``, and every answer below comes
    from the same functions the model's methods call, so the two agree.
    """

    __slots__ = ("_data", "_flat")

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._data = dict(data)
        self._flat: dict[str, Any] | None = None

    @property
    def hash(self) -> str:
        """The sha256 of the canonical JSON of the hashed view (all but ``info``)."""
        return raw_hash(self._data)

    def flatten(self) -> dict[str, Any]:
        """Return hashed fields as ``{"dotted.path": value}`` leaves."""
        if self._flat is None:
            self._flat = flatten(hashed_view(self._data))
        return dict(self._flat)

    def select(self, dimensions: Sequence[str]) -> dict[str, Any]:
        """Return the leaves under each dotted prefix in ``dimensions`` (absent ones: None)."""
        return select(self.flatten(), dimensions)

    def document(self) -> dict[str, Any]:
        """Return the whole document (a deep copy), ``info`` included."""
        out: dict[str, Any] = _copy(self._data)
        return out
