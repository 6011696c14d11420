"""The command line's contract, end to end through the real entry point.

Every command is listed and has ``--json``; every ``--json`` document carries
``schema_version``; the documented exit codes (1, 2, 5, 7, 11) are what a
process actually exits with; ``lint``, ``schema``, ``copy`` and
``restore --dry-run`` run through the CLI; boolean environment variables are
read strictly.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
from cachetrees import make_generic_tree
from conftest import clean_env, run_artifactd

from artifactd.build.harvest import HarvestResult
from artifactd.cli import cli, render
from artifactd.families import FAMILIES
from artifactd.reports import REPORT_SCHEMA_VERSION

COMMANDS = {
    "absorb",
    "build",
    "contribute",
    "copy",
    "demo",
    "diff",
    "du",
    "exec",
    "fingerprint",
    "gc",
    "harvest",
    "image append",
    "image build",
    "inspect",
    "keygen",
    "lint",
    "ls",
    "matrix cells",
    "matrix shapes",
    "merge",
    "mirrors",
    "node-features",
    "predict",
    "prefetch",
    "prune",
    "quarantine ls",
    "quarantine rm",
    "restore",
    "schema",
    "sign",
    "status",
    "verify",
}


def run(
    *args: str, cwd: Path, env: dict[str, str] | None = None, prelude: str = ""
) -> subprocess.CompletedProcess[str]:
    """``artifactd ARGS`` as a new process in ``cwd`` (HOME there too, unless ``env``)."""
    env = env if env is not None else clean_env({"HOME": str(cwd)})
    return run_artifactd(*args, cwd=cwd, env=env, prelude=prelude)


def document(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The one JSON document a ``--json`` run printed, with its schema version checked."""
    doc = json.loads(proc.stdout)
    assert doc["schema_version"] == REPORT_SCHEMA_VERSION, doc
    return doc  # type: ignore[no-any-return]


#: A long command's stage line on stderr (``[cell] start cell=0``), before any error.
STAGE_LINE = re.compile(r"^\[[a-z-]+\] ")


def one_error(proc: subprocess.CompletedProcess[str], code: int, text: str) -> None:
    """Exit ``code``, one ``artifactd: error:`` line naming ``text`` (plus hints), no traceback.

    The stage lines a long command prints before it fails are progress, not errors.
    """
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if not STAGE_LINE.match(line)]
    assert lines[0].startswith("artifactd: error:"), proc.stderr
    assert text in lines[0], proc.stderr
    assert all(line.startswith("  hint:") for line in lines[1:]), proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.fixture
def published(tmp_path: Path) -> tuple[str, Path]:
    """A local store holding one harvested generic cache: (store ref, the tree)."""
    tree = make_generic_tree(tmp_path / "gen")
    store = f"oci:{tmp_path / 'store'}"
    proc = run(
        "harvest",
        "--store",
        store,
        "--family",
        "generic",
        "--json",
        cwd=tmp_path,
        env=clean_env({"HOME": str(tmp_path), "ARTIFACTD_GENERIC_DIR": str(tree)}),
    )
    assert proc.returncode == 0, proc.stderr
    assert document(proc)["families"][0]["family"] == "generic"
    return store, tree


def _commands(group: click.Group, prefix: str = "") -> dict[str, click.Command]:
    """Every leaf command, named as typed (``image append``)."""
    out: dict[str, click.Command] = {}
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            out.update(_commands(command, f"{prefix}{name} "))
        else:
            out[prefix + name] = command
    return out


def test_every_command_is_listed_with_json() -> None:
    commands = _commands(cli)
    assert set(commands) == COMMANDS
    for name, command in commands.items():
        assert any("--json" in p.opts for p in command.params), name


def test_every_json_document_is_versioned(tmp_path: Path, published: tuple[str, Path]) -> None:
    store, _ = published
    tag = document(run("ls", store, "--json", cwd=tmp_path))["tags"][0]
    docs = {
        "fingerprint": run("fingerprint", "--gpu-arch", "sm_90a", "--json", cwd=tmp_path),
        "diff": run("diff", "local", "local", "--json", cwd=tmp_path),
        "inspect": run("inspect", f"{store}:{tag}", "--json", cwd=tmp_path),
        "restore": run(
            "restore",
            "--store",
            store,
            "--target",
            "t",
            "--family",
            "generic",
            "--json",
            cwd=tmp_path,
        ),
        "lint": run("lint", str(tmp_path / "t"), "--json", cwd=tmp_path),
        "copy": run("copy", store, f"oci:{tmp_path / 'copy'}", "--json", cwd=tmp_path),
        "schema": run("schema", "--out", str(tmp_path / "schemas"), "--json", cwd=tmp_path),
        "node-features": run(
            "node-features",
            "--store",
            f"oci:{tmp_path / 'node'}",
            "--out",
            "f",
            "--json",
            cwd=tmp_path,
        ),
    }
    for name, proc in docs.items():
        assert proc.returncode == 0, (name, proc.stderr)
        document(proc)
    assert document(docs["restore"])["restored"] == ["generic"]
    assert document(docs["diff"])["identical"] is True


def test_schema_writes_and_lists_the_schemas(tmp_path: Path) -> None:
    out = tmp_path / "schemas"
    doc = document(run("schema", "--out", str(out), "--json", cwd=tmp_path))
    written = sorted(Path(p).name for p in doc["written"])
    assert "fingerprint.schema.json" in written
    assert written == sorted(p.name for p in out.iterdir())
    for path in out.iterdir():
        assert json.loads(path.read_text())["$schema"]
    plain = run("schema", "--out", str(out), cwd=tmp_path)
    assert sorted(Path(line).name for line in plain.stdout.splitlines()) == written


def test_copy_then_ls_shows_the_same_tags(tmp_path: Path, published: tuple[str, Path]) -> None:
    store, _ = published
    dest = f"oci:{tmp_path / 'copy'}"
    doc = document(run("copy", store, dest, "--json", cwd=tmp_path))
    assert doc["manifests"] >= 1
    assert doc["bytes_uploaded"] > 0
    src_tags = document(run("ls", store, "--json", cwd=tmp_path))["tags"]
    assert document(run("ls", dest, "--json", cwd=tmp_path))["tags"] == src_tags
    again = document(run("copy", store, dest, "--json", cwd=tmp_path))
    assert again["bytes_uploaded"] == 0
    # Each blob counts once, though whole and family artifacts share layers:
    # nothing was already present in an empty destination, everything the second time.
    assert doc["bytes_skipped"] == 0
    assert again["bytes_skipped"] == doc["bytes_uploaded"]


def test_restore_dry_run_changes_nothing(tmp_path: Path, published: tuple[str, Path]) -> None:
    store, _ = published
    target = tmp_path / "target"
    proc = run(
        "restore", "--store", store, "--target", str(target), "--dry-run", "--json", cwd=tmp_path
    )
    doc = document(proc)
    assert proc.returncode == 0, proc.stderr
    assert doc["status"] == "dry_run"
    assert doc["bytes_to_fetch"] > 0
    assert not target.exists()
    text = run("restore", "--store", store, "--target", str(target), "--dry-run", cwd=tmp_path)
    assert "dry run: would fetch" in text.stdout
    assert not target.exists()


def test_restore_of_a_corrupt_layer_exits_5_only_with_require(
    tmp_path: Path, published: tuple[str, Path]
) -> None:
    store, _ = published
    tag = document(run("ls", store, "--json", cwd=tmp_path))["tags"][0]
    manifest = document(run("inspect", f"{store}:{tag}", "--json", cwd=tmp_path))["manifest"]
    digest = manifest["layers"][0]["digest"].removeprefix("sha256:")
    layer = Path(store.removeprefix("oci:")) / "blobs" / "sha256" / digest
    data = bytearray(layer.read_bytes())
    data[len(data) // 2] ^= 0xFF
    layer.write_bytes(bytes(data))
    args = ("restore", "--store", store, "--target", str(tmp_path / "t"))
    plain = run(*args, cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    assert "restore failed (corrupt)" in plain.stderr
    one_error(run(*args, "--require", cwd=tmp_path), 5, "restore failed (corrupt)")
    assert not (tmp_path / "t" / "generic").exists()


def test_harvest_with_nothing_to_harvest_exits_7(tmp_path: Path) -> None:
    env = clean_env({"HOME": str(tmp_path), "ARTIFACTD_GENERIC_DIR": str(tmp_path / "none")})
    proc = run(
        "harvest", "--store", f"oci:{tmp_path / 's'}", "--family", "generic", cwd=tmp_path, env=env
    )
    one_error(proc, 7, "")


def _dirty_target(root: Path) -> Path:
    """A restore-target layout whose generic cache names this directory: one lint finding."""
    gen = root / "generic"
    gen.mkdir(parents=True)
    (gen / "kernel.cubin").write_bytes(b"\x7fELF built in " + str(root).encode() + b"/x\0")
    return root


def test_lint_strict_exits_11_and_plain_lint_exits_0(tmp_path: Path) -> None:
    target = _dirty_target(tmp_path / "vol")
    plain = run("lint", str(target), "--json", cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    findings = document(plain)["findings"]
    assert findings and findings[0]["family"] == "generic"
    strict = run("lint", str(target), "--strict", cwd=tmp_path)
    one_error(strict, 11, "--strict")
    assert "generic/" in strict.stdout
    clean = tmp_path / "clean"
    make_generic_tree(clean / "generic")
    assert run("lint", str(clean), "--strict", cwd=tmp_path).returncode == 0


def test_build_strict_gives_the_same_code_as_lint_strict(tmp_path: Path) -> None:
    writes_its_path = (
        "import os, pathlib; d = pathlib.Path(os.environ['ARTIFACTD_GENERIC_DIR']); "
        "d.mkdir(parents=True, exist_ok=True); "
        "(d / 'k.cubin').write_bytes(b'ELF ' + str(d).encode() + b'/k.cu')"
    )
    matrix = tmp_path / "m.yaml"
    matrix.write_text(
        "schema_version: 1\nname: strict\ntarget: {gpu_arch: sm_90a}\nfamilies: [generic]\n"
        "gpus: 0\n"
        f"command: {json.dumps(sys.executable + ' -c ' + json.dumps(writes_its_path))}\n"
    )
    args = ("build", str(matrix), "--store", f"oci:{tmp_path / 's'}")
    assert run(*args, cwd=tmp_path).returncode == 0
    one_error(run(*args, "--strict", cwd=tmp_path), 11, "lint found")


BOOM = (
    "import artifactd.fingerprint.probe as _p\n"
    "def _boom(**kw):\n    raise RuntimeError('boom')\n"
    "_p.probe_request = _boom\n"
)


@pytest.mark.parametrize("value", ["", "0", "false", "no", "off"])
def test_an_internal_error_is_one_line_and_exit_1(tmp_path: Path, value: str) -> None:
    """A bug (a library function raising RuntimeError) is exit 1 without a traceback."""
    env = clean_env({"HOME": str(tmp_path), "ARTIFACTD_TRACEBACK": value})
    proc = run("fingerprint", cwd=tmp_path, env=env, prelude=BOOM)
    assert proc.returncode == 1
    assert proc.stderr.startswith("artifactd: internal error: RuntimeError: boom")
    assert "Traceback" not in proc.stderr


def test_traceback_on_request(tmp_path: Path) -> None:
    env = clean_env({"HOME": str(tmp_path), "ARTIFACTD_TRACEBACK": "1"})
    proc = run("fingerprint", cwd=tmp_path, env=env, prelude=BOOM)
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr and "RuntimeError: boom" in proc.stderr


def test_a_boolean_variable_that_is_not_a_boolean_is_a_usage_error(tmp_path: Path) -> None:
    env = clean_env({"HOME": str(tmp_path), "ARTIFACTD_TRACEBACK": "maybe"})
    one_error(run("fingerprint", cwd=tmp_path, env=env), 2, "ARTIFACTD_TRACEBACK")
    env = clean_env({"HOME": str(tmp_path), "ARTIFACTD_REQUIRE": "maybe"})
    proc = run("restore", "--target", "t", cwd=tmp_path, env=env)
    assert proc.returncode == 2
    assert "not a valid boolean" in proc.stderr
    assert not os.path.exists(tmp_path / "t")


def test_the_summary_lines_say_what_was_done(tmp_path: Path, published: tuple[str, Path]) -> None:
    """A restore lists the families it looked for; harvest names the tags it published."""
    store, _ = published
    target = tmp_path / "target"
    text = run("restore", "--store", store, "--target", str(target), cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    rows = [line.split() for line in text.stdout.splitlines() if line.startswith("  ")]
    # The artifact holds generic alone: no family it never had is a "miss" row.
    assert not [r for r in rows if len(r) > 1 and r[1] == "miss"], text.stdout
    absent = next(line for line in text.stdout.splitlines() if "not in the artifact" in line)
    assert set(absent.split(": ", 1)[1].split(", ")) == set(FAMILIES) - {"generic"}

    tree = make_generic_tree(tmp_path / "cell")
    cell = run(
        "harvest",
        "--store",
        f"oci:{tmp_path / 'cells'}",
        "--family",
        "generic",
        cwd=tmp_path,
        env=clean_env({"HOME": str(tmp_path), "ARTIFACTD_GENERIC_DIR": str(tree)}),
    )
    tags = document(run("ls", f"oci:{tmp_path / 'cells'}", "--json", cwd=tmp_path))["tags"]
    shown = next(line.split()[1] for line in cell.stdout.splitlines() if line.startswith("  tag "))
    assert shown in tags and shown.startswith("fp-")
    assert f"(and {len(tags) - 1} family tag(s))" in cell.stdout


def test_a_cell_harvest_shows_the_cell_tag_it_published(capsys: pytest.CaptureFixture[str]) -> None:
    """``build --cell I --run-id R`` publishes run-R-cell-I alone, and says so."""
    render.harvest(
        HarvestResult("oci:s", "sha256:" + "a" * 64, ["run-r1-cell-3"], "f" * 64, [], [], 0, 0, 0.1)
    )
    out = capsys.readouterr().out
    assert "  tag run-r1-cell-3\n" in out and "fp-" not in out


def test_a_miss_names_the_flags_that_would_match_and_they_do(tmp_path: Path) -> None:
    """The CPU path is visible: a miss says which declared fields differ and how to set them."""
    tree = make_generic_tree(tmp_path / "gen")
    store = f"oci:{tmp_path / 'store'}"
    env = clean_env({"HOME": str(tmp_path), "ARTIFACTD_GENERIC_DIR": str(tree)})
    built = run(
        "harvest", "--store", store, "--family", "generic", "--gpu-arch", "sm_90a",
        "--workload", "model=m,dtype=float32", cwd=tmp_path, env=env,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    miss = run("restore", "--store", store, "--target", str(tmp_path / "t1"), cwd=tmp_path)
    assert miss.returncode == 0 and "nothing restored" in miss.stdout
    adds = [
        ln.split("add ", 1)[1].split(" (")[0] for ln in miss.stdout.splitlines() if "add --" in ln
    ]
    assert adds == ["--gpu-arch sm_90a", "--workload dtype=float32,model=m"], miss.stdout
    flags = [part for flag in adds for part in flag.split(" ", 1)]
    hit = run("restore", "--store", store, "--target", str(tmp_path / "t2"), *flags, "--json",
              cwd=tmp_path)  # fmt: skip
    assert document(hit)["match"] == "full"
