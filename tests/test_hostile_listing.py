"""A registry's tag listing is hostile input: bounded, origin-checked, validated (issue 28, 2-4).

The registry is the real docker-registry (with htpasswd auth where credentials
matter) behind the fault proxy, which rewrites its tag-list answers as a
hostile registry or a man in the middle would: a ``Link`` to another host, to
the same page, to a page that links back, a ``tags`` that is a string, a body
that is not an object. The foreign host is a small HTTP server of the test's
own that records what it was sent. Every command runs in its own process
through the real entry point; each ends in bounded time (the run's timeout is
the ceiling), with exit 3, a message, no traceback and no password.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import clean_env, run_artifactd
from faultproxy import FaultProxy, Rewriter
from registry_server import RegistryServer

from artifactd.constants import ENV_REGISTRY_HOST, ENV_REGISTRY_PASSWORD, ENV_REGISTRY_USERNAME
from artifactd.errors import IntegrityError, StoreError
from artifactd.format.oci import MANIFEST_MEDIA_TYPE
from artifactd.hashing import digest_of
from artifactd.stores import listing, open_store
from artifactd.stores.layout import LayoutStore
from artifactd.stores.reference import RegistryRef
from artifactd.stores.registry import RegistryStore

USER, PASSWORD = "ci", "s3cret-pw"  # the auth_registry fixture's pair
TAGS = ["alpha", "beta", "gamma"]
#: The ceiling on a run that must end: generous, it proves "does not hang".
CEILING_S = 60


def _seed(host: str, repo: str, tags: list[str], tmp: Path, env: dict[str, str] | None) -> None:
    """Push one tiny manifest under ``tags`` straight to the registry (no proxy)."""
    config = b"{}"
    (tmp / "config").write_bytes(config)
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPE,
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": digest_of(config),
                "size": len(config),
            },
            "layers": [],
        }
    ).encode()
    with RegistryStore(RegistryRef(host, repo), environ=env) as st:
        st.put_blob(tmp / "config", digest_of(config), len(config))
        st.put_manifest(manifest, MANIFEST_MEDIA_TYPE, tags)


class _Recorder(BaseHTTPRequestHandler):
    """A foreign host: records every request's path and Authorization, answers a tag list."""

    seen: list[tuple[str, str | None]]

    def do_GET(self) -> None:
        self.seen.append((self.path, self.headers.get("Authorization")))
        body = json.dumps({"name": "x", "tags": ["from-the-foreign-host"]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def foreign() -> Iterator[tuple[str, list[tuple[str, str | None]]]]:
    """A foreign HTTP server on another loopback port: (HOST:PORT, what it received)."""
    seen: list[tuple[str, str | None]] = []
    handler = type("Recorder", (_Recorder,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


Headers = list[tuple[str, str]]


def _with_link(link: str) -> Rewriter:
    """Answer as the registry did, with ``link`` as the Link header."""

    def rewrite(path: str, headers: Headers, body: bytes) -> tuple[Headers, bytes]:
        return [(k, v) for k, v in headers if k.lower() != "link"] + [("Link", link)], body

    return rewrite


def _body(new: bytes) -> Rewriter:
    """Answer with the registry's headers and the body ``new``."""

    def rewrite(path: str, headers: Headers, body: bytes) -> tuple[Headers, bytes]:
        return headers, new

    return rewrite


def _refused(proc_stderr: str, returncode: int, *words: str) -> None:
    assert returncode == 3, proc_stderr[-2000:]
    assert "Traceback" not in proc_stderr, proc_stderr[-2000:]
    for word in words:
        assert word in proc_stderr, proc_stderr[-2000:]


# --------------------------------------------------------------------------
# Item 2: a Link to another origin gets no credential
# --------------------------------------------------------------------------


def test_a_link_to_another_host_is_refused_and_gets_no_credentials(
    auth_registry: RegistryServer,
    repo: str,
    tmp_path: Path,
    foreign: tuple[str, list[tuple[str, str | None]]],
) -> None:
    upstream_env = {
        ENV_REGISTRY_HOST: auth_registry.host,
        ENV_REGISTRY_USERNAME: USER,
        ENV_REGISTRY_PASSWORD: PASSWORD,
    }
    _seed(auth_registry.host, repo, TAGS, tmp_path, upstream_env)
    elsewhere, received = foreign
    with FaultProxy(auth_registry.host) as proxy:
        proxy.rewrite(
            r"/tags/list",
            _with_link(f'<http://{elsewhere}/v2/{repo}/tags/list?n=1000>; rel="next"'),
        )
        env = clean_env(
            {
                ENV_REGISTRY_HOST: proxy.host,
                ENV_REGISTRY_USERNAME: USER,
                ENV_REGISTRY_PASSWORD: PASSWORD,
            }
        )
        start = time.monotonic()
        proc = run_artifactd("ls", proxy.ref(repo), env=env, timeout=CEILING_S)
        # The bound registry was answered with the pair: the refusal is about the Link.
        assert any(r.authorization for r in proxy.records(method="GET")), proxy.log
    assert time.monotonic() - start < CEILING_S
    _refused(proc.stderr, proc.returncode, "another origin", elsewhere)
    assert PASSWORD not in proc.stdout + proc.stderr
    assert "from-the-foreign-host" not in proc.stdout
    assert [auth for _, auth in received if auth] == [], received  # the password never left
    assert received == [], "nothing at all is sent to a foreign origin"


def test_a_link_elsewhere_on_the_same_host_or_with_user_info_is_not_followed_as_written(
    registry: RegistryServer, repo: str, tmp_path: Path
) -> None:
    """Same host, another repository's list: refused; user info in the link: never used."""
    _seed(registry.host, repo, TAGS, tmp_path, None)
    with FaultProxy(registry.host) as proxy:
        proxy.rewrite(r"/tags/list", _with_link('</v2/other/repo/tags/list?n=1000>; rel="next"'))
        proc = run_artifactd("ls", proxy.ref(repo), timeout=CEILING_S)
        _refused(proc.stderr, proc.returncode, "not this repository's tag list")
        proxy.clear()
        # A first page linking to a second with user info: the second page is
        # fetched by our own URL (no user info), and links nowhere.
        page2 = f"/v2/{repo}/tags/list?n=1000&last=alpha"
        proxy.rewrite(
            r"n=1000$",
            _with_link(f'<http://evil:pw@{proxy.host}{page2}#frag>; rel="next"'),
        )
        proxy.reset_log()
        proc = run_artifactd("ls", proxy.ref(repo), timeout=CEILING_S)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == TAGS
        assert [r.authorization for r in proxy.records(method="GET")] == [None, None]
        assert [r.path for r in proxy.records(method="GET")][-1] == page2


# --------------------------------------------------------------------------
# Item 3: pagination ends, in bounded time, with a clear error
# --------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["ls"], ["du", "--store"], ["prune", "--store"]])
def test_a_self_link_and_a_two_page_cycle_end_with_a_clear_error(
    registry: RegistryServer, repo: str, tmp_path: Path, command: list[str]
) -> None:
    _seed(registry.host, repo, TAGS, tmp_path, None)
    first = f"/v2/{repo}/tags/list?n=1000"
    second = f"{first}&last=alpha"
    with FaultProxy(registry.host) as proxy:
        proxy.rewrite(r"n=1000$", _with_link(f'<{first}>; rel="next"'))  # names itself
        proc = run_artifactd(*command, proxy.ref(repo), timeout=CEILING_S)
        _refused(proc.stderr, proc.returncode, "pagination cycle")
        assert proxy.count(method="GET") <= 2  # one page, at most one answered challenge
        proxy.clear()
        proxy.rewrite(r"n=1000$", _with_link(f'<{second}>; rel="next"'))
        proxy.rewrite(r"last=alpha$", _with_link(f'<{first}>; rel="next"'))
        proxy.reset_log()
        proc = run_artifactd(*command, proxy.ref(repo), timeout=CEILING_S)
        _refused(proc.stderr, proc.returncode, "pagination cycle")
        assert [r.path for r in proxy.records(method="GET")] == [first, second]


def test_endless_distinct_pages_stop_at_the_page_cap_and_the_deadline(
    registry: RegistryServer, repo: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A registry that names a new next page forever (each URL distinct: no cycle)."""
    _seed(registry.host, repo, TAGS, tmp_path, None)
    counter = iter(range(1, 1 << 30))

    def onward(path: str, headers: Headers, body: bytes) -> tuple[Headers, bytes]:
        nxt = f"/v2/{repo}/tags/list?n=1000&last=a{next(counter)}"
        return [*headers, ("Link", f'<{nxt}>; rel="next"')], body

    with FaultProxy(registry.host) as proxy:
        proxy.rewrite(r"/tags/list", onward)
        monkeypatch.setattr(listing, "MAX_TAG_PAGES", 25)
        with open_store(proxy.ref(repo)) as st, pytest.raises(StoreError, match="past 25 pages"):
            st.list_tags()
        assert proxy.count(method="GET") == 25
        monkeypatch.setattr(listing, "LISTING_DEADLINE_S", 0.0)
        proxy.reset_log()
        with open_store(proxy.ref(repo)) as st, pytest.raises(StoreError, match="took over"):
            st.list_tags()
        assert proxy.count(method="GET") == 1


def test_a_listing_over_the_tag_cap_is_refused_on_a_registry_and_a_layout(
    registry: RegistryServer, repo: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _seed(registry.host, repo, TAGS, tmp_path, None)
    layout = LayoutStore(tmp_path / "layout", create=True)
    ref = open_store(registry.ref(repo)).get_manifest("alpha")
    assert ref is not None
    layout.put_manifest(ref.data, ref.media_type, TAGS)
    with open_store(registry.ref(repo)) as st:
        assert st.list_tags() == TAGS
    assert layout.list_tags() == TAGS
    monkeypatch.setattr(listing, "MAX_TAGS", 2)
    for store in (open_store(registry.ref(repo)), layout):
        with store, pytest.raises(StoreError, match="more than 2 tags"):
            store.list_tags()


def test_a_layout_ref_name_that_is_not_a_string_is_a_damaged_index(tmp_path: Path) -> None:
    layout = LayoutStore(tmp_path / "layout", create=True)
    digest = layout.put_blob_bytes(b"{}")
    index = json.loads((tmp_path / "layout" / "index.json").read_text())
    index["manifests"] = [
        {
            "mediaType": MANIFEST_MEDIA_TYPE,
            "digest": digest,
            "size": 2,
            "annotations": {"org.opencontainers.image.ref.name": name},
        }
        for name in ("ok", 7)
    ]
    (tmp_path / "layout" / "index.json").write_text(json.dumps(index))
    with pytest.raises(IntegrityError, match="malformed"):
        layout.list_tags()
    proc = run_artifactd("ls", f"oci:{tmp_path / 'layout'}", timeout=CEILING_S)
    assert proc.returncode == 5 and "Traceback" not in proc.stderr, proc.stderr


# --------------------------------------------------------------------------
# Item 4, last bullet: an answer that is not {"tags": [str, ...]}
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b'{"name": "x", "tags": "fp-abc"}', '"tags" is a JSON string'),
        (b'["alpha", "beta"]', "a JSON array, not an object"),
        (b'{"tags": ["ok", 7]}', '"tags" holds a JSON number'),
        (b'{"tags": ["../../etc"]}', "is not a valid tag"),
        (b"<html>busy</html>", "not JSON"),
        (b"[" * 100_000, "malformed"),
    ],
)
def test_a_malformed_tag_list_is_exit_3_with_a_message(
    registry: RegistryServer, repo: str, tmp_path: Path, body: bytes, why: str
) -> None:
    _seed(registry.host, repo, TAGS, tmp_path, None)
    with FaultProxy(registry.host) as proxy:
        proxy.rewrite(r"/tags/list", _body(body))
        for command in (["ls"], ["prune", "--store"]):
            proc = run_artifactd(*command, proxy.ref(repo), timeout=CEILING_S)
            _refused(proc.stderr, proc.returncode, "tag listing is malformed", why)
            assert proc.stdout.strip() == "", "nothing listed from a malformed answer"
    with open_store(registry.ref(repo)) as st:
        assert st.list_tags() == TAGS  # nothing was deleted meanwhile
