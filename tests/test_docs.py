"""Docs that run: every shell block is executed against real parts, or says why it cannot be.

A shell block (```sh, ```bash, ```console) in ``README.md``, ``docs/`` or
``deploy/README.md`` is preceded by a marker comment:

* ``<!-- example: run NAME -->``: executed here, in order, in one workspace,
  against a real registry (a loopback ``docker-registry``) and real keys.
  :data:`RUNNERS` names what each block needs (its substitutions: the
  example's ``registry.example.com`` becomes the loopback registry, ``/cache``
  a directory of the workspace) and checks what it must have done;
* ``<!-- example: gpu -->``, ``<!-- example: cluster -->``: it needs an NVIDIA
  GPU, or a cluster (a Kubernetes API, a node, a registry's own host);
* ``<!-- example: ci -->``: the README's two commands, which ``.ci/run`` runs.

A synopsis with placeholders is a ```text block, not a shell block. The
command reference (``docs/reference/cli.md``) is generated from the commands
and must be current, and the site builds with ``mkdocs build --strict``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cachetrees import make_generic_tree
from conftest import REPO, clean_env, scaled
from registry_server import RegistryServer, start_registry

DOCS = [REPO / "README.md", REPO / "deploy" / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
SHELL = re.compile(r"^```(sh|bash|console|shell)\s*$")
MARKER = re.compile(r"^<!-- example: (run|gpu|cluster|ci)(?: ([a-z-]+))? -->$")
PASSWORD = "..."  # what the README's keygen line types; the blocks read it back


@dataclass
class Block:
    """One shell block of a document, with the marker above it."""

    path: Path
    line: int
    kind: str
    name: str | None
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """Every shell block of ``path``; ``kind`` is ``?`` where no marker precedes it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        if SHELL.match(lines[i]):
            start = i
            above = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            marker = MARKER.match(above.strip())
            i += 1
            body: list[str] = []
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            kind, name = (marker.group(1), marker.group(2)) if marker else ("?", None)
            found.append(Block(path, start + 1, kind, name, "\n".join(body) + "\n"))
        i += 1
    return found


def every_block() -> list[Block]:
    return [b for path in DOCS for b in blocks(path)]


# --- What each run block needs, and what it must have done ----------------


@dataclass
class Workspace:
    """Where the blocks run: a directory, a registry, the environment they share."""

    root: Path
    registry: RegistryServer
    env: dict[str, str] = field(default_factory=dict)

    def ref(self, repo: str) -> str:
        return self.registry.ref(f"docs/{repo}")

    def artifactd(self, *args: str, cwd: Path | None = None) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "artifactd", *args],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=cwd or self.root,
            timeout=scaled(600),
            check=False,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout

    def harvest_signed(self, repo: str) -> str:
        """Publish a generic cache to ``repo``, signed with the keygen block's key; its fp- tag."""
        tree = make_generic_tree(self.root / "caches" / repo)
        env = {**self.env, "ARTIFACTD_GENERIC_DIR": str(tree)}
        proc = subprocess.run(
            [sys.executable, "-m", "artifactd", "harvest", "--store", self.ref(repo),
             "--family", "generic", "--sign-key", str(self.root / "ci" / "signing.key")],
            capture_output=True, text=True, env=env, cwd=self.root, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-2000:]
        return next(w for w in proc.stdout.split() if w.startswith("fp-"))


Runner = tuple[Callable[[Workspace], dict[str, str]], Callable[[Workspace], None]]


def _registry_setup(ws: Workspace) -> dict[str, str]:
    # The block copies what the demo built into the local default store: make one.
    tree = make_generic_tree(ws.root / "caches" / "local")
    env = {**ws.env, "ARTIFACTD_GENERIC_DIR": str(tree)}
    subprocess.run(
        [sys.executable, "-m", "artifactd", "harvest", "--family", "generic"],
        env=env, cwd=ws.root, check=True, capture_output=True,
    )  # fmt: skip
    return {"registry.example.com/ml/caches": ws.ref("ml-caches"), " /cache": f" {ws.root}/cache"}


#: The demo's declared target, which the tour's restore names.
DEMO_TARGET = ["--gpu-arch", "sm_90a", "--workload", "dtype=float32", "--workload",
               "model=artifactd/cpu-demo"]  # fmt: skip


def _registry_check(ws: Workspace) -> None:
    assert (ws.root / "cache" / "artifactd.env").is_file(), "the restore installed nothing"
    again = str(ws.root / "again")
    ws.artifactd("restore", "--store", ws.ref("ml-caches"), "--target", again, *DEMO_TARGET)
    assert (ws.root / "again" / "artifactd.env").is_file(), "the second restore installed nothing"


def _tour_setup(ws: Workspace) -> dict[str, str]:
    # The tour reads what the demo left in the default store: a cache published
    # there for the demo's declared target stands in for the demo's build.
    tree = make_generic_tree(ws.root / "caches" / "tour")
    env = {**ws.env, "ARTIFACTD_GENERIC_DIR": str(tree)}
    subprocess.run(
        [sys.executable, "-m", "artifactd", "harvest", "--family", "generic", *DEMO_TARGET],
        env=env, cwd=ws.root, check=True, capture_output=True,
    )  # fmt: skip
    return {"/tmp/warm": str(ws.root / "warm")}


def _tour_check(ws: Workspace) -> None:
    env = (ws.root / "warm" / "artifactd.env").read_text()
    assert "ARTIFACTD_GENERIC_DIR=" in env, env


def _gc_setup(ws: Workspace) -> dict[str, str]:
    server = start_registry(ws.root / "gc-registry")
    tree = make_generic_tree(ws.root / "caches" / "gc")
    env = {**ws.env, "ARTIFACTD_GENERIC_DIR": str(tree)}
    subprocess.run(
        [sys.executable, "-m", "artifactd", "harvest", "--store", server.ref("docs/gc"),
         "--family", "generic"],
        env=env, cwd=ws.root, check=True, capture_output=True,
    )  # fmt: skip
    server.stop()  # the collection runs with the registry stopped, as the README says
    return {"/etc/docker/registry/config.yml": str(server.config)}


def _keygen_check(ws: Workspace) -> None:
    key = ws.root / "ci" / "signing.key"
    assert key.is_file() and (ws.root / "ci" / "signing.pub").is_file()
    assert key.stat().st_mode & 0o077 == 0, "the private key is readable by others"
    # In a checkout, .gitignore keeps the private key out of a commit.
    ignored = subprocess.run(["git", "check-ignore", "-q", "ci/signing.key"], cwd=REPO, check=False)
    assert ignored.returncode == 0, "ci/signing.key would be committed"


def _promote_setup(ws: Workspace) -> dict[str, str]:
    staged = ws.harvest_signed("staging-caches")
    ml = ws.harvest_signed("ml-caches")
    assert staged == ml  # the same machine, the same fingerprint
    ws.artifactd("keygen", "--out", str(ws.root / "prod"))
    ws.artifactd("keygen", "--out", str(ws.root / "new"))
    ws.env["PROD_SIGNING_KEY"] = (ws.root / "prod.key").read_text()
    return {
        "registry.example.com/staging/caches": ws.ref("staging-caches"),
        "registry.example.com/prod/caches": ws.ref("prod-caches"),
        "registry.example.com/ml/caches": ws.ref("ml-caches"),
        "fp-<hash>": staged,
    }


def _promote_check(ws: Workspace) -> None:
    listed = ws.artifactd("ls", "--store", ws.ref("prod-caches"))
    assert any(t.startswith("fp-") for t in listed.split()), listed
    assert any(t.endswith(".sig") for t in listed.split()), "the promotion was not signed"


def _enforce_setup(ws: Workspace) -> dict[str, str]:
    return {
        "registry.example.com/ml/caches": ws.ref("ml-caches"),
        "/keys/signing.pub": str(ws.root / "ci" / "signing.pub"),
        " /cache": f" {ws.root}/enforced",
    }


def _enforce_check(ws: Workspace) -> None:
    assert (ws.root / "enforced" / "artifactd.env").is_file()


def _promtool_setup(ws: Workspace) -> dict[str, str]:
    ws.env["DOCS_CWD"] = str(REPO)  # the block names the repository's files
    return {}


def _nodelink_setup(ws: Workspace) -> dict[str, str]:
    tree = make_generic_tree(ws.root / "caches" / "nodelink")
    env = {**ws.env, "ARTIFACTD_GENERIC_DIR": str(tree)}
    subprocess.run(
        [sys.executable, "-m", "artifactd", "harvest", "--store", ws.ref("node-caches"),
         "--family", "generic"],
        env=env, cwd=ws.root, check=True, capture_output=True,
    )  # fmt: skip
    return {
        "registry.example.com/ml/caches": ws.ref("node-caches"),
        "/var/lib/artifactd": str(ws.root / "node-host"),
    }


def _nodelink_check(ws: Workspace) -> None:
    pods = ws.root / "node-host" / "pods"
    linked = pods / "a" / "generic" / "axpy.sm_90a.cubin"
    copied = pods / "b" / "generic" / "axpy.sm_90a.cubin"
    assert linked.stat().st_nlink >= 2, "the first pod did not get a link"
    assert copied.stat().st_nlink == 1 and copied.read_bytes() == linked.read_bytes()


def _fixedcost_setup(ws: Workspace) -> dict[str, str]:
    # The block restores from a local layout holding one generic cache built for sm_90a.
    tree = make_generic_tree(ws.root / "caches" / "fixedcost")
    env = {**ws.env, "ARTIFACTD_GENERIC_DIR": str(tree)}
    store = f"oci:{ws.root}/fixedcost-store"
    subprocess.run(
        [sys.executable, "-m", "artifactd", "harvest", "--store", store, "--family", "generic",
         "--gpu-arch", "sm_90a"],
        env=env, cwd=ws.root, check=True, capture_output=True,
    )  # fmt: skip
    return {"oci:/cache/store": store, "/cache/pod": f"{ws.root}/fixedcost-pod"}


def _fixedcost_check(ws: Workspace) -> None:
    assert (ws.root / "fixedcost-pod" / "artifactd.env").is_file(), "the restore installed nothing"
    imported = (ws.root / "importtime.txt").read_text()
    assert "artifactd.format.light" in imported, "it read no document"
    assert "pydantic" not in imported, "it read the documents with the models"


def _nothing(ws: Workspace) -> None:
    del ws


RUNNERS: dict[str, Runner] = {
    "tour": (_tour_setup, _tour_check),
    "registry": (_registry_setup, _registry_check),
    "gc": (_gc_setup, _nothing),
    "keygen": (lambda ws: {}, _keygen_check),
    "promote": (_promote_setup, _promote_check),
    "enforce": (_enforce_setup, _enforce_check),
    "promtool": (_promtool_setup, _nothing),
    "nodelink": (_nodelink_setup, _nodelink_check),
    "fixedcost": (_fixedcost_setup, _fixedcost_check),
}


def test_every_shell_block_runs_or_says_why_not() -> None:
    found = every_block()
    assert len(found) >= 10, "the scan sees the documents' blocks"
    unmarked = [b.where for b in found if b.kind == "?"]
    assert unmarked == [], f"shell blocks without an <!-- example: ... --> marker: {unmarked}"
    named = [b.name for b in found if b.kind == "run"]
    assert sorted(n for n in named if n) == sorted(RUNNERS), (named, sorted(RUNNERS))
    assert all(named), "a run block without a name"


#: The front page's length: what it is, the two commands, the tour, links.
FRONT_PAGE_LINES = 200


def test_the_readme_is_a_front_page_and_every_page_is_in_the_site() -> None:
    """The guide and the reference live in the site; the README links to them."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= FRONT_PAGE_LINES, "the README grew a guide again"
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [link for link in links if "://" not in link]
    assert [link for link in local if not (REPO / link).is_file()] == []
    site = REPO / "docs"
    nav = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    pages = sorted(str(p.relative_to(site)) for p in site.rglob("*.md"))
    assert [p for p in pages if f": {p}\n" not in nav] == [], "a page the site's nav omits"
    linked = {str(Path(link).relative_to("docs")) for link in local if link.startswith("docs/")}
    guide = [p for p in pages if p.startswith(("guide/", "reference/"))]
    assert [p for p in guide if p not in linked] == [], "a guide page the README omits"


def test_the_command_reference_is_generated_from_the_commands() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "cli_reference.py"), "--check"],
        capture_output=True,
        text=True,
        env=clean_env(),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


def test_the_site_builds_strict(tmp_path: Path) -> None:
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or shutil.which("mkdocs")
    assert mkdocs, "mkdocs is in the dev extra (scripts/setup.sh installs it)"
    proc = subprocess.run(
        [mkdocs, "build", "--strict", "--quiet", "--site-dir", str(tmp_path / "site")],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").is_file()


@pytest.mark.slow
@pytest.mark.torch
def test_the_run_blocks_run(tmp_path: Path, registry: RegistryServer) -> None:
    """Each run block, in document order, as a user pastes it (after the substitutions)."""
    ws = Workspace(tmp_path, registry)
    ws.env = clean_env(
        {
            "HOME": str(tmp_path),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "ARTIFACTD_KEY_PASSWORD": PASSWORD,
        }
    )
    (tmp_path / "warmup_matrices").symlink_to(REPO / "warmup_matrices")
    for block in [b for b in every_block() if b.kind == "run"]:
        assert block.name is not None
        setup, check = RUNNERS[block.name]
        text = block.text
        for old, new in setup(ws).items():
            assert old in text, f"{block.where}: the block no longer says {old!r}"
            text = text.replace(old, new)
        cwd = Path(ws.env.pop("DOCS_CWD", str(tmp_path)))
        proc = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", text],
            capture_output=True,
            text=True,
            env=ws.env,
            cwd=cwd,
            timeout=scaled(900),
            check=False,
        )
        assert proc.returncode == 0, f"{block.where}:\n{text}\n{proc.stderr[-3000:]}"
        check(ws)
