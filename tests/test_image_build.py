"""``artifactd image build`` on a real engine (podman's Docker API) and a real registry.

One podman service and one Debian bookworm + python3 base (mmdebstrap, cached
under ``.artifactd/cache/``) serve the whole session (``tests/engine.py``);
the base is pushed to the loopback registry so that it can be named by
digest. The init image is built once per module from this checkout's wheels;
a container of it restores an artifact from the registry into a bind-mounted
volume. The runtime image is built onto the base, pushed and read back with
skopeo. No mocks: a missing podman fails the tests (scripts/setup.sh installs
it), it never skips them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cachetrees import make_generic_tree
from conftest import (
    DEMO_MATRIX,
    PYTHON,
    REPO,
    WARMUP,
    built_natively,
    clean_env,
    run_artifactd,
)
from engine import Engine, PythonBase, engine, python_base, require_tool
from registry_server import RegistryServer

from artifactd import __version__
from artifactd.errors import UsageError
from artifactd.images.append import LABEL_ARTIFACT, LABEL_FAMILIES, LABEL_FINGERPRINT
from artifactd.images.build import INIT_UID, render_dockerfile
from artifactd.images.wheels import source_ignore
from artifactd.restore.envfile import parse_env_file

# The session fixtures of tests/engine.py, used here by name.
__all__ = ["engine", "python_base"]

#: Timings measured here, printed at the end of the module (pytest -s, or -rA).
TIMINGS: dict[str, float] = {}


def docker_client(engine: Engine) -> Any:
    """A docker SDK client of the session's engine (the SDK is installed by scripts/setup.sh)."""
    try:
        # lazy: the docker SDK is optional (the docker extra); a clear failure without it
        import docker  # noqa: PLC0415
    except ImportError:
        pytest.fail("the docker SDK is not installed: run scripts/setup.sh", pytrace=False)
    return docker.DockerClient(base_url=engine.base_url, timeout=600)


def engine_env(engine: Engine, home: Path) -> dict[str, str]:
    """The CLI's environment: this engine as DOCKER_HOST, a home of its own."""
    return clean_env({"DOCKER_HOST": engine.base_url, "HOME": str(home)})


def image_build(*args: str, env: dict[str, str]) -> dict[str, Any]:
    """Run ``artifactd image build ARGS --json``; require exit 0; the result document."""
    t0 = time.monotonic()
    proc = run_artifactd("image", "build", *args, "--json", env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc: dict[str, Any] = json.loads(proc.stdout)
    TIMINGS[f"image build --kind {doc['kind']}"] = time.monotonic() - t0
    return doc


def container_output(client: Any, image: str, command: list[str], **kwargs: Any) -> bytes:
    """Run a throwaway container of ``image`` to its end; return its stdout, whole.

    Not ``containers.run(remove=True)``: the docker SDK opens the log stream
    before the container starts and reads it only after removing the
    container, and podman ends that stream at the removal, so a long output
    came back cut (5,001 lines as 4,196, on a loaded machine). Here the logs
    are read once the container has exited, before it is removed. A nonzero
    exit raises the SDK's ``ContainerError``, as ``containers.run`` does.
    """
    container = client.containers.run(image, command, detach=True, **kwargs)
    try:
        status = container.wait()["StatusCode"]
        if status != 0:
            # lazy: the docker SDK is optional (docker_client says so when it is missing)
            from docker.errors import ContainerError  # noqa: PLC0415

            err = container.logs(stdout=False, stderr=True)
            raise ContainerError(container, status, command, image, err)
        return bytes(container.logs(stdout=True, stderr=False))
    finally:
        container.remove(force=True)


def run_in(client: Any, image: str, *argv: str, entrypoint: str, **kwargs: Any) -> str:
    """Run ``entrypoint ARGV`` in a throwaway container of ``image``; its stdout."""
    out = container_output(
        client, image, list(argv), entrypoint=[entrypoint], network_mode="host", **kwargs
    )
    return out.decode()


def skopeo(*args: str) -> str:
    """skopeo against the plain-HTTP loopback registry; its stdout."""
    proc = subprocess.run(
        [require_tool("skopeo"), *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def tree_digests(root: Path) -> dict[str, str]:
    """Every file under ``root``: relative path -> sha256."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module", autouse=True)
def _print_timings() -> Iterator[None]:
    yield
    if TIMINGS:
        print("\nimage build timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in TIMINGS.items()))


@pytest.fixture(scope="module")
def base(python_base: PythonBase) -> PythonBase:
    """The session's python base, its preparation timed once."""
    TIMINGS.setdefault("base: mmdebstrap (0 = cached)", python_base.built_s)
    TIMINGS.setdefault("base: podman import", python_base.import_s)
    TIMINGS.setdefault("base: push", python_base.push_s)
    return python_base


@pytest.fixture(scope="module")
def init_image(
    engine: Engine, base: PythonBase, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """The init image, built from this checkout (pip wheel) onto the base by digest."""
    home = tmp_path_factory.mktemp("init-home")
    return image_build("--kind", "init", "--base", base.pinned, env=engine_env(engine, home))


# --------------------------------------------------------------------------
# Templates (no engine)
# --------------------------------------------------------------------------


def test_templates_render_and_name_what_is_missing() -> None:
    text = render_dockerfile(
        "runtime",
        base="registry:5000/ml/vllm@sha256:" + "a" * 64,
        fingerprint_hash="b" * 64,
        artifact="sha256:" + "c" * 64,
        families="generic,triton",
        image_digest="",
    )
    assert text.startswith("FROM registry:5000/ml/vllm@sha256:")
    assert "ARTIFACTD_IMAGE_DIGEST" not in text  # the artifact names no image
    pinned = render_dockerfile(
        "runtime",
        base="registry:5000/ml/vllm@sha256:" + "a" * 64,
        fingerprint_hash="b" * 64,
        artifact="sha256:" + "c" * 64,
        families="generic,triton",
        image_digest="sha256:" + "d" * 64,
    )
    assert f"\nENV ARTIFACTD_IMAGE_DIGEST=sha256:{'d' * 64}\n" in pinned
    assert f"/opt/prebuilt-cache/{'b' * 64}/" in text
    assert "RUN" not in text and "USER" not in text and "{#" not in text
    for label in (LABEL_FINGERPRINT, LABEL_ARTIFACT, LABEL_FAMILIES):
        assert label in text
    with pytest.raises(UsageError, match=r"needs the variable.*fingerprint_hash"):
        render_dockerfile("runtime", base="r/x@sha256:" + "a" * 64, artifact="a", families="g")
    with pytest.raises(UsageError, match=r"no variable.*bogus"):
        render_dockerfile("init", base="python:3.11", version="1", bogus="x")
    with pytest.raises(UsageError, match="not a plain reference"):
        render_dockerfile("init", base="python:3.11\nRUN rm -rf /", version="1")
    with pytest.raises(UsageError, match="no image kind"):
        render_dockerfile("nope")


def test_the_wheel_source_copy_keeps_the_build_package(tmp_path: Path) -> None:
    """``build/`` at a checkout's root is setuptools' state; ``artifactd/build/`` is source."""
    src = tmp_path / "checkout"
    # The batch writer an editable install built in place is build state too: the wheel
    # builds its own, for the Python that runs `pip wheel`.
    stale = "artifactd/format/_batchwrite.cpython-311-x86_64-linux-gnu.so"
    source = ("artifactd/build/run.py", "artifactd/format/_batchwrite.c")
    for rel in (*source, "build/lib/stale.py", "dist/x.whl", stale):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text("")
    (src / "artifactd" / "__pycache__").mkdir()
    shutil.copytree(src, tmp_path / "copy", ignore=source_ignore(src))
    copied = sorted(str(p.relative_to(tmp_path / "copy")) for p in (tmp_path / "copy").rglob("*"))
    assert copied == sorted(["artifactd", "artifactd/build", "artifactd/format", *source])


def test_usage_errors_come_before_any_engine(tmp_path: Path) -> None:
    env = clean_env({"HOME": str(tmp_path), "DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    cases = [
        (("--kind", "runtime", "--base", "r:5000/a:1"), "needs --artifact"),
        (("--kind", "init", "--base", "python:3.11", "--artifact", "r:5000/c:x"), "is for --kind"),
        (("--kind", "runtime", "--base", "r:5000/a:1", "--artifact", "x", "--wheels", "."), "init"),
        (
            ("--kind", "init", "--base", "python:3.11", "--push", "r:5000/a@sha256:" + "0" * 64),
            "tag",
        ),
    ]
    for args, text in cases:
        proc = run_artifactd("image", "build", *args, env=env)
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stderr.startswith("artifactd: error:") and text in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr


def test_without_the_docker_sdk_the_error_names_the_extra(tmp_path: Path) -> None:
    proc = run_artifactd(
        "image", "build", "--kind", "init", "--base", "python:3.11",
        env=clean_env({"HOME": str(tmp_path)}),
        prelude="import sys\nsys.modules['docker'] = None",
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "pip install 'artifactd[docker]'" in proc.stderr
    assert "Traceback" not in proc.stderr


# --------------------------------------------------------------------------
# The init image
# --------------------------------------------------------------------------


@pytest.mark.podman
@pytest.mark.image
def test_init_image_holds_artifactd_alone_and_runs_as_non_root(
    engine: Engine, init_image: dict[str, Any], tmp_path: Path
) -> None:
    client = docker_client(engine)
    image = init_image["image_id"]
    assert init_image["version"] == __version__
    assert init_image["tags"] == [f"artifactd-init:{__version__}"]
    assert init_image["base_digest"] is not None
    attrs = client.images.get(image).attrs
    config = attrs["Config"]
    assert config["Entrypoint"] == ["artifactd", "restore"]
    assert config["User"] == f"{INIT_UID}:{INIT_UID}"
    assert any(e.startswith("PATH=/opt/artifactd/bin:") for e in config["Env"])
    assert config["Labels"]["io.artifactd.version"] == __version__
    assert attrs["Size"] == init_image["size"] > 0

    assert run_in(client, image, "--version", entrypoint="artifactd").strip() == (
        f"artifactd, version {__version__}"
    )
    # The command is the launcher the image writes, which imports no re (the base's
    # pip 23 writes one that does: two thirds of a bare start at every pod start).
    # The import lines go to a file on a bind mount: a container this short-lived can end
    # before the engine's log has all of its output.
    script = "/opt/artifactd/bin/artifactd"
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)  # the image runs as INIT_UID
    run_in(
        client, image, "-c", f"python3 -X importtime {script} --version 2>/out/imports.txt",
        entrypoint="sh", volumes={str(out): {"bind": "/out", "mode": "rw"}},
    )  # fmt: skip
    loaded = (out / "imports.txt").read_text()
    modules = {line.rsplit("|", 1)[-1].strip() for line in loaded.splitlines() if "|" in line}
    assert "artifactd.cli.main" in modules
    assert modules & {"re", "typing", "json", "pathlib"} == set()
    probe = (
        "import importlib.util as u, json, os, sys\n"
        "print(json.dumps({m: u.find_spec(m) is not None for m in "
        "('torch', 'triton', 'pip', 'setuptools', 'docker', 'artifactd', 'pydantic')} | "
        "{'uid': os.getuid(), 'gid': os.getgid(), 'wheels': os.path.exists('/wheels'), "
        "'prefix': sys.prefix}))"
    )
    batch = "from artifactd.format import unpack; print(unpack._write_natively is not None)"
    facts = json.loads(run_in(client, image, "-c", probe, entrypoint="python3"))
    assert facts == {
        "torch": False,
        "triton": False,
        "pip": False,  # dropped from the final venv
        "setuptools": False,
        "docker": False,  # core only: no extras
        "artifactd": True,
        "pydantic": True,
        "uid": INIT_UID,
        "gid": INIT_UID,
        "wheels": False,  # the builder stage's context never reaches the final image
        "prefix": "/opt/artifactd",
    }
    # The C batch writer the host's `pip wheel` built loads in the base (same Python, and
    # the base's own libcrypto for SHA-256), so pods restore small files with it.
    loaded = run_in(client, image, "-c", batch, entrypoint="python3").strip()
    assert loaded == str(built_natively())
    # The wheel built from this checkout ships the templates and every package.
    site = "/opt/artifactd/lib/python3.11/site-packages/artifactd"
    listing = run_in(client, image, "-c", f"cd {site} && find . -name '*.py' -o -name '*.j2'",
                     entrypoint="sh")  # fmt: skip
    shipped = {line.removeprefix("./") for line in listing.split()}
    source = {str(p.relative_to(REPO / "artifactd")) for p in (REPO / "artifactd").rglob("*.py")}
    assert source <= shipped, sorted(source - shipped)
    assert {"dockerfiles/runtime.Dockerfile.j2", "dockerfiles/init.Dockerfile.j2"} <= shipped
    rendered = run_in(
        client, image, "-c",
        "from artifactd.images.build import render_dockerfile as r; "
        "print(r('init', base='b:1', version='9'))",
        entrypoint="python3",
    )  # fmt: skip
    assert rendered.startswith("FROM b:1 AS builder")
    sizes = run_in(
        client, image, "-c", "du -sk /opt/artifactd; du -skx /usr /etc /var | paste -sd' '",
        entrypoint="sh",
    )  # fmt: skip
    print(f"\ninit image {init_image['size'] / 2**20:.1f} MiB; du (KiB): {' '.join(sizes.split())}")


@pytest.mark.torch
@pytest.mark.podman
@pytest.mark.image
def test_init_container_restores_the_cpu_demo_and_the_warm_up_compiles_nothing(
    engine: Engine,
    init_image: dict[str, Any],
    registry: RegistryServer,
    repo: str,
    tmp_path: Path,
) -> None:
    """The README's demo, with the restore in a container of the init image.

    The init image has no torch, triton or nvcc, so its probe cannot see the
    software the caches were built with; ``--software-from`` takes those
    fields from the artifact's fingerprint, while the machine's own fields
    (CPU, architecture, the declared GPU target) and the workload are probed
    and given as in any pod. The volume is bind-mounted at the same path in
    the container and here, so the paths the restore wrote (Triton's group
    files, the env file) hold for the warm-up that then runs on this host,
    where the compilers' own counters show what was compiled.
    """
    env = clean_env({"HOME": str(tmp_path / "home")})
    store = registry.ref(f"{repo}-caches")
    built = run_artifactd(
        "build", str(DEMO_MATRIX), "--store", store, "--json", env=env, timeout=900
    )
    assert built.returncode == 0, built.stderr[-3000:]
    fp_hash = json.loads(built.stdout)["harvest"]["fingerprint_hash"]

    client = docker_client(engine)
    volume = tmp_path / "cache"
    volume.mkdir()
    os.chown(volume, INIT_UID, INIT_UID)
    argv = [
        "--store", store, "--target", str(volume), "--gpu-arch", "sm_90a",
        "--workload", "model=artifactd/cpu-demo,dtype=float32", "--consumer-user", "root",
        "--require", "--json",
    ]  # fmt: skip
    blind = container_output(
        client,
        init_image["image_id"],
        [*argv, "--dry-run"],
        network_mode="host",
        volumes={str(volume): {"bind": str(volume), "mode": "rw"}},
    )
    # Without the runtime image's software, only families that do not depend on it could hit.
    assert json.loads(bytes(blind).decode())["match"] != "full"
    t0 = time.monotonic()
    out = container_output(
        client,
        init_image["image_id"],
        [*argv, "--software-from", f"{store}:fp-{fp_hash}"],
        network_mode="host",
        volumes={str(volume): {"bind": str(volume), "mode": "rw"}},
    )
    TIMINGS["init container restore (cpu demo)"] = time.monotonic() - t0
    doc = json.loads(bytes(out).decode())
    assert doc["status"] == "restored", doc
    assert doc["match"] == "full"
    assert sorted(doc["restored"]) == ["generic", "inductor", "triton"]
    assert (volume / "triton").stat().st_uid == INIT_UID

    warm_env = clean_env(parse_env_file(volume / "artifactd.env"))
    proc = subprocess.run(
        [PYTHON, str(WARMUP), "--parts", "inductor,triton,nvcc"],
        capture_output=True, text=True, env=warm_env, timeout=900, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    warm = json.loads(proc.stdout.strip().splitlines()[-1])
    assert warm["inductor"]["compiled"] == 0 and warm["inductor"]["hits"] == 3, warm
    assert warm["triton"]["compiled"] == 0 and warm["triton"]["hits"] == 3, warm
    assert warm["nvcc"]["compiled"] == 0, warm


# --------------------------------------------------------------------------
# The runtime image
# --------------------------------------------------------------------------


@pytest.mark.podman
@pytest.mark.image
def test_runtime_image_bakes_the_artifact_onto_the_base_and_pushes(
    engine: Engine, base: PythonBase, registry: RegistryServer, repo: str, tmp_path: Path
) -> None:
    tree = make_generic_tree(tmp_path / "gen")
    store = registry.ref(f"{repo}-caches")
    harvest = run_artifactd(
        "harvest", "--store", store, "--family", "generic", "--json",
        env=clean_env({"HOME": str(tmp_path), "ARTIFACTD_GENERIC_DIR": str(tree)}),
    )  # fmt: skip
    assert harvest.returncode == 0, harvest.stderr
    fp_hash = json.loads(harvest.stdout)["fingerprint_hash"]
    push = registry.ref(f"{repo}-app:warm")
    doc = image_build(
        "--kind", "runtime", "--base", base.ref, "--artifact", f"{store}:fp-{fp_hash}",
        "--tag", f"localhost/{repo}-app:local", "--push", push,
        env=engine_env(engine, tmp_path),
    )  # fmt: skip

    # The base, given by tag, was built FROM its digest.
    assert doc["base"] == base.ref
    assert doc["base_digest"] == base.digest
    assert doc["base_ref"] == base.pinned
    assert doc["dockerfile"].startswith(f"FROM {base.pinned}\n")
    assert "\nRUN" not in doc["dockerfile"]
    assert doc["fingerprint_hash"] == fp_hash
    assert doc["families"] == ["generic"]
    assert doc["tags"] == [f"localhost/{repo}-app:local", push]

    # Labels and env as `image append` writes them; nothing else of the base changed.
    client = docker_client(engine)
    new, old = client.images.get(doc["image_id"]).attrs, client.images.get(base.local).attrs
    labels = new["Config"]["Labels"]
    assert labels[LABEL_FINGERPRINT] == fp_hash
    assert labels[LABEL_ARTIFACT] == doc["artifact"]
    assert labels[LABEL_FAMILIES] == "generic"
    assert new["Config"]["Env"] == [*old["Config"]["Env"], "ARTIFACTD_PREBUILT=/opt/prebuilt-cache"]
    assert new["Size"] == doc["size"]

    # The baked store: an OCI layout tagged fp-<hash>, root-owned, 0644/0755.
    walk = (
        "import json, os\n"
        f"root = '/opt/prebuilt-cache/{fp_hash}'\n"
        "out = {}\n"
        "for d, dirs, files in os.walk(root):\n"
        "    for n in [d, *(os.path.join(d, f) for f in files)]:\n"
        "        st = os.lstat(n)\n"
        "        out[os.path.relpath(n, root)] = [oct(st.st_mode & 0o7777), st.st_uid, st.st_gid]\n"
        "index = json.load(open(root + '/index.json'))\n"
        "print(json.dumps({'files': out, 'index': index}))\n"
    )
    seen = json.loads(run_in(client, doc["image_id"], "-c", walk, entrypoint="python3"))
    modes = {mode for mode, _, _ in seen["files"].values()}
    assert modes <= {"0o644", "0o755"}, seen["files"]
    assert {(uid, gid) for _, uid, gid in seen["files"].values()} == {(0, 0)}
    assert "oci-layout" in seen["files"]
    tags = {
        e["annotations"]["org.opencontainers.image.ref.name"]: e["digest"]
        for e in seen["index"]["manifests"]
    }
    assert tags[f"fp-{fp_hash}"] == doc["artifact"]
    # The family's scope tag too: a restore for another model still finds these kernels.
    assert [t for t in tags if t != f"fp-{fp_hash}"] == [
        t for t in json.loads(harvest.stdout)["tags"] if t.startswith("generic-")
    ]

    # Pushed: skopeo reads it; the base's layers are the first layers, unchanged.
    inspected = json.loads(skopeo("inspect", "--tls-verify=false", f"docker://{push}"))
    assert inspected["Digest"] == doc["digest"]
    assert inspected["Labels"][LABEL_FINGERPRINT] == fp_hash
    config = json.loads(skopeo("inspect", "--config", "--tls-verify=false", f"docker://{push}"))
    base_config = json.loads(
        skopeo("inspect", "--config", "--tls-verify=false", f"docker://{base.pinned}")
    )
    runtime, base_runtime = config["config"], base_config["config"]
    for key in (set(runtime) | set(base_runtime)) - {"Env", "Labels"}:
        assert runtime.get(key) == base_runtime.get(key), key  # Entrypoint, Cmd, User...
    engine_labels = {"io.buildah.version"}  # podman's builder signs its work
    ours = {LABEL_FINGERPRINT, LABEL_ARTIFACT, LABEL_FAMILIES}
    assert set(runtime["Labels"]) - set(base_runtime.get("Labels") or {}) - engine_labels == ours
    base_ids = base_config["rootfs"]["diff_ids"]
    assert config["rootfs"]["diff_ids"][: len(base_ids)] == base_ids
    assert len(config["rootfs"]["diff_ids"]) == len(base_ids) + 1


@pytest.mark.podman
@pytest.mark.image
def test_an_appended_image_runs_and_restores_its_baked_caches_with_no_network(
    engine: Engine,
    init_image: dict[str, Any],
    registry: RegistryServer,
    repo: str,
    tmp_path: Path,
) -> None:
    """The seed's flow: the init container runs the derived image itself.

    The runtime image here is the init image (it holds artifactd, as a runtime
    image that restores in place must). The caches are harvested in a
    container of it, so the fingerprint is that image's, declaring its digest
    as a CI stage would; ``image append`` (no engine) bakes them in; the
    appended image then runs under podman with no network at all, and its
    ``restore`` without ``--store`` finds the baked store and the image digest
    in the environment the append wrote.
    """
    client = docker_client(engine)
    base = registry.ref(f"{repo}-runtime:1")
    engine.podman("push", "--tls-verify=false", init_image["image_id"], f"docker://{base}")
    base_digest = json.loads(skopeo("inspect", "--tls-verify=false", f"docker://{base}"))["Digest"]
    tree = make_generic_tree(tmp_path / "gen")
    store = registry.ref(f"{repo}-caches")
    harvested = run_in(
        client, init_image["image_id"],
        "harvest", "--store", store, "--family", "generic", "--image-digest", base_digest, "--json",
        entrypoint="artifactd",
        environment={"ARTIFACTD_GENERIC_DIR": "/caches/generic"},
        volumes={str(tree): {"bind": "/caches/generic", "mode": "ro"}},
    )  # fmt: skip
    fp_hash = json.loads(harvested)["fingerprint_hash"]

    warm = registry.ref(f"{repo}-runtime:1-warm")
    t0 = time.monotonic()
    appended = run_artifactd(
        "image", "append", "--base", base, "--artifact", f"{store}:fp-{fp_hash}", "--to", warm,
        "--json", env=clean_env({"HOME": str(tmp_path)}),
    )  # fmt: skip
    TIMINGS["image append"] = time.monotonic() - t0
    assert appended.returncode == 0, appended.stderr
    digest = json.loads(appended.stdout)["digest"]
    assert json.loads(skopeo("inspect", "--tls-verify=false", f"docker://{warm}"))["Digest"] == (
        digest
    )

    volume = tmp_path / "cache"
    volume.mkdir()
    os.chown(volume, INIT_UID, INIT_UID)
    client.images.pull(warm)
    out = container_output(
        client,
        warm,
        ["--target", "/cache", "--require", "--json"],
        network_mode="none",
        volumes={str(volume): {"bind": "/cache", "mode": "rw"}},
    )
    doc = json.loads(bytes(out).decode())
    assert doc["status"] == "restored", doc
    assert doc["match"] == "full"
    assert doc["plan"]["store"] == f"oci:/opt/prebuilt-cache/{fp_hash}"
    assert tree_digests(volume / "generic") == tree_digests(tree)


# --------------------------------------------------------------------------
# Failures
# --------------------------------------------------------------------------


@pytest.mark.podman
@pytest.mark.image
def test_a_failing_build_is_an_artifactd_error_with_the_engines_message(
    engine: Engine, registry: RegistryServer, tmp_path: Path
) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / f"artifactd-{__version__}-py3-none-any.whl").write_bytes(b"never installed")
    missing = registry.ref("nope/python@sha256:" + "0" * 64)
    proc = run_artifactd(
        "image", "build", "--kind", "init", "--base", missing, "--wheels", str(wheels),
        env=engine_env(engine, tmp_path), timeout=300,
    )  # fmt: skip
    assert proc.returncode == 7, proc.stderr  # BuildError: the CLI's table
    # The stage lines a long command prints ("[image] context ...") come before the error.
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("[")]
    assert lines[0].startswith("artifactd: error: the engine failed to build the init image:")
    assert "manifest unknown" in lines[0]
    assert any(line.startswith("  | ") and "Trying to pull" in line for line in lines)
    assert lines[-1].startswith("  hint:")
    assert "Traceback" not in proc.stderr
    # forcerm: no build container is left behind.
    assert engine.podman("ps", "-a", "--external", "-q").stdout.strip() == ""


@pytest.mark.podman
def test_a_base_tag_the_registry_lacks_exits_4(
    engine: Engine, registry: RegistryServer, tmp_path: Path
) -> None:
    proc = run_artifactd(
        "image", "build", "--kind", "runtime", "--base", registry.ref("nope/base:1"),
        "--artifact", f"oci:{tmp_path}/store:x", env=engine_env(engine, tmp_path),
    )  # fmt: skip
    assert proc.returncode == 4, proc.stderr
    assert "has no image 1" in proc.stderr and "Traceback" not in proc.stderr


def test_a_dead_docker_host_is_one_clear_line(tmp_path: Path) -> None:
    dead = f"unix://{tmp_path}/no-engine.sock"
    proc = run_artifactd(
        "image", "build", "--kind", "init", "--base", "python:3.11", "--wheels", str(tmp_path),
        env=clean_env({"HOME": str(tmp_path), "DOCKER_HOST": dead}),
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 2, proc.stderr
    assert lines[0].startswith(f"artifactd: error: no container engine answers at {dead}")
    assert lines[1].startswith("  hint:") and "DOCKER_HOST" in lines[1]
    # --docker-host wins over DOCKER_HOST.
    flag = run_artifactd(
        "image", "build", "--kind", "init", "--base", "python:3.11", "--wheels", str(tmp_path),
        "--docker-host", dead + "2", env=clean_env({"HOME": str(tmp_path)}),
    )  # fmt: skip
    assert flag.returncode == 3 and f"{dead}2" in flag.stderr, flag.stderr
