"""Patterns written out by hand read as the regular expressions they replaced.

The modules a pod start loads (``artifactd/cli/fast.py``'s light modules)
import no ``re`` (25 million instructions, most of a bare Python start), so
the few patterns they matched are written out. Each was a regular
expression; each is checked here against it, on
generated text built from the characters that matter to it (with non-ASCII
digits, spaces and word characters among them, where ``re`` counts those).
Where the written-out form is deliberately stricter, the test says so:
``--gpu-arch`` takes ASCII digits only, and a digest or a tag with a final
newline (which ``$`` lets through under :func:`re.match`) is refused.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from artifactd.errors import UsageError
from artifactd.fingerprint import key, probe, tools
from artifactd.format import oci
from artifactd.trust import keys


def _parsed(fn: object, text: str) -> object:
    try:
        return fn(text)  # type: ignore[operator]
    except UsageError:
        return "refused"


_ARCH_RE = re.compile(r"^sm_(\d+)(\d)([af]?)$")


def _arch_by_re(arch: str) -> object:
    m = _ARCH_RE.match(arch.strip())
    if not m or not m.group(1).isascii() or not m.group(2).isascii():
        return "refused"  # stricter on purpose: digits are ASCII digits
    return arch.strip(), f"{int(m.group(1))}.{m.group(2)}"


@settings(max_examples=1500, deadline=None)
@given(
    st.text(alphabet="sm_019afbx \n\u0669\u00b2", max_size=9).map(lambda t: "sm_" + t)
    | st.text(max_size=6)
)
@example("sm_90a")
@example(" sm_100f\n")
@example("sm_\u06699a")
def test_gpu_arch(text: str) -> None:
    assert _parsed(key.parse_gpu_arch, text) == _arch_by_re(text)


_DIGEST_RE = re.compile(r"^(?:[^@\s]+@)?(sha256:[0-9a-f]{64})$")
_HEX = "0123456789abcdef"


def _digest_by_re(value: str) -> object:
    m = _DIGEST_RE.match(value.strip())
    return m.group(1) if m else "refused"


_digests = st.builds(
    lambda ref, hx, tail: ref + "sha256:" + hx + tail,
    st.text(alphabet="r@ \u00a0/:x", max_size=5),
    st.text(alphabet=_HEX + "AG", min_size=62, max_size=66),
    st.sampled_from(["", "\n", " ", "x"]),
)


@settings(max_examples=1500, deadline=None)
@given(_digests | st.text(max_size=10))
@example("repo@sha256:" + "a" * 64)
@example("sha256:" + "0" * 64 + "\n")
def test_image_digest(text: str) -> None:
    assert _parsed(key.parse_image_digest, text) == _digest_by_re(text)


_NOTABLE_RE = re.compile(
    r"^(avx512\w*|amx\w*|avx_vnni\w*|avx10\w*|sve\w*|sve2|asimd\w*|bf16|i8mm)$"
)
_flags = st.builds(
    lambda head, tail: head + tail,
    st.sampled_from(
        ["avx512", "amx", "avx_vnni", "avx10", "sve", "asimd", "bf16", "i8mm", "av", ""]
    ),
    st.text(alphabet="f_1x-.\u00e9\u0669 ", max_size=4),
)


@settings(max_examples=1500, deadline=None)
@given(_flags)
def test_notable_cpu_flags(flag: str) -> None:
    assert probe.notable_flag(flag) == bool(_NOTABLE_RE.match(flag))


@settings(max_examples=1000, deadline=None)
@given(st.text(alphabet="aB-_.9", max_size=10))
def test_distribution_names(name: str) -> None:
    assert probe._normalize(name) == re.sub(r"[-_.]+", "_", name).lower()


_RELEASE_RE = re.compile(r"release [\d.]+, V([\d.]+)")


@settings(max_examples=1500, deadline=None)
@given(
    st.lists(
        st.sampled_from(["release ", "13", ".", "0", ", V", ",", " ", "V", "\u0669", "x\n"]),
        max_size=12,
    ).map("".join)
)
@example("Cuda compilation tools, release 13.0, V13.0.88\nBuild cuda_13.0")
def test_cuda_release(text: str) -> None:
    m = _RELEASE_RE.search(text)
    assert tools.cuda_release(text) == (m.group(1) if m else None)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  575.51.03  Wed", "575.51.03"),
        (
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release",
            "580.65.06",
        ),
        ("nothing here", None),
    ],
)
def test_proc_driver_version(tmp_path: Path, text: str, value: str | None) -> None:
    path = tmp_path / "version"
    path.write_text(text)
    assert probe.proc_driver_version(path) == value


_OCI_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
_OCI_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
_SUPERSEDED_RE = re.compile(r"^superseded-([0-9]{8}T[0-9]{6}Z)-([0-9a-f]{64})$")


def _whole(pattern: re.Pattern[str], text: str) -> bool:
    """``pattern`` matches, and not by ``$`` before a final newline (the stricter reading)."""
    return bool(pattern.match(text)) and not text.endswith("\n")


@settings(max_examples=1500, deadline=None)
@given(
    st.builds(
        lambda head, hx, tail: head + hx + tail,
        st.sampled_from(["sha256:", "sha512:", "sha256", ""]),
        st.text(alphabet=_HEX + "AG\u0669", min_size=62, max_size=66),
        st.sampled_from(["", "\n", " "]),
    )
    | st.text(max_size=8)
)
@example("sha256:" + "0" * 64 + "\n")
def test_oci_digest(text: str) -> None:
    assert oci.is_digest(text) == _whole(_OCI_DIGEST_RE, text)


@settings(max_examples=1500, deadline=None)
@given(
    st.text(alphabet="aZ9_.-:/ \n\u00e9", max_size=6)
    | st.text(alphabet="a.", min_size=126, max_size=130)
)
@example("a" * 128)
@example("a" * 129)
@example("v1\n")
def test_oci_tag(text: str) -> None:
    assert oci.is_tag(text) == _whole(_OCI_TAG_RE, text)


@settings(max_examples=1500, deadline=None)
@given(
    st.builds(
        lambda stamp, hx, tail: "superseded-" + stamp + "-" + hx + tail,
        st.text(alphabet="0123456789TZ-\u0669", min_size=14, max_size=17),
        st.text(alphabet=_HEX + "-", min_size=63, max_size=65),
        st.sampled_from(["", "\n"]),
    )
)
@example("superseded-20261204T101500Z-" + "a" * 64)
def test_superseded_tag(tag: str) -> None:
    m = _SUPERSEDED_RE.match(tag)
    expected = (m.group(1), f"sha256:{m.group(2)}") if m and not tag.endswith("\n") else None
    assert oci.parse_superseded_tag(tag) == expected


_PUBLIC_PEM = re.compile(
    rb"-----BEGIN PUBLIC KEY-----\s*([A-Za-z0-9+/=\s]+?)\s*-----END PUBLIC KEY-----"
)
_PEM_PIECES = [
    b"-----BEGIN PUBLIC KEY-----",
    b"-----END PUBLIC KEY-----",
    b"MFkw",
    b"QQ==",
    b"\n",
    b" \t",
    b"-",
    b"!",
    b"\x00",
    b"-----BEGIN PRIVATE KEY-----",
]


@settings(max_examples=2000, deadline=None)
@given(st.lists(st.sampled_from(_PEM_PIECES), max_size=10).map(b"".join))
@example(b"-----BEGIN PUBLIC KEY-----\nMFkw\nQQ==\n-----END PUBLIC KEY-----\n")
@example(b"-----BEGIN PUBLIC KEY----- \n-----END PUBLIC KEY-----")
def test_public_key_blocks(pem: bytes) -> None:
    by_re = [(m.group(0), b"".join(m.group(1).split())) for m in _PUBLIC_PEM.finditer(pem)]
    written = [(whole, b"".join(body.split())) for whole, body in keys.public_blocks(pem)]
    assert written == by_re


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=12) | st.text(alphabet="QUJDab+/=\n!", max_size=12).map(str.encode))
def test_strict_base64(data: bytes) -> None:
    try:
        expected: object = base64.b64decode(data, validate=True)
    except ValueError:
        expected = "refused"
    try:
        got: object = keys._b64decode_strict(data)
    except ValueError:
        got = "refused"
    assert got == expected
