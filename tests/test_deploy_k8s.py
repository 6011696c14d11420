"""The Kubernetes manifests in ``deploy/k8s/`` stay true to Kubernetes, to restore and to the CLI.

Rendering. :func:`kustomize` runs ``kubectl kustomize`` (the kustomize
kubectl embeds, v4 or later: ``patches`` entries) on the overlay and on the
base, and fails on any warning (a deprecated field) as on an error.

Checks on the rendered overlay (and the base): every document goes through
the ``kubernetes`` client's API models unchanged (a misspelled or misplaced
key is dropped by them, so the round trip differs); images are pinned by
digest; the restore init container and the engine mount one cache volume,
and every path the env file of a restore into it names (each family's
``restore_env`` and ``restore_dirs``, for the consumer user the pod gives)
is the same file of that volume in the engine, whose ``artifactd exec``
loads that env file; no mount covers a whole ``~/.cache``; the node store is
one hostPath, at the same path in the Deployment and the DaemonSet, written
only as the init image's user; the restore takes its store from the
ConfigMap, its software from an artifact of that store, the workload and the
pod's GPUs; the engine serves the warm-up matrix's command line, workload,
env and GPU count; the DaemonSet prefetches the release (the engine's image
and digest, the restore's workload and store) on the Deployment's nodes and
collects garbage in a loop, then publishes its node store as NFD local
features (a hostPath at nfd-worker's features.d) whose fingerprint label the
overlay's preferred node affinity names; and every ``artifactd`` command line (commands,
args, probes, hooks; an init-image container without ``command`` runs the
image's ENTRYPOINT) runs ``--help`` and lists every option it uses. The
helpers are ``test_fanout_examples.py``'s and ``test_ci_examples.py``'s.

End to end (podman, the loopback registry, the init image built as
``test_image_build.py`` builds it): the rendered init container's own
arguments and environment (store and software reference pointed at the
loopback registry) restore a generic-family artifact, harvested in a
container of the init image, through a bind-mounted node store into a
bind-mounted cache volume; then the engine container's own ``artifactd exec``
prefix starts ``python3`` in a container of the init image (standing in for
the runtime image, which must hold artifactd), which sees the env file's
variables pointing into the volume and the restored files there; and the
readiness probe's command exits 0, then 13 once a file is written there.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import click
import pytest
import yaml
from cachetrees import make_generic_tree
from conftest import REPO
from engine import Engine, engine, python_base
from registry_server import RegistryServer
from test_ci_examples import artifactd_argv, listed_options, run_help, split_path, used_options
from test_fanout_examples import PINNED, container_env, container_lines
from test_image_build import (
    base,
    container_output,
    docker_client,
    init_image,
    run_in,
    tree_digests,
)

from artifactd import __version__
from artifactd.bounds import SIZE
from artifactd.build.matrix import expand, load_matrix
from artifactd.cli import cli
from artifactd.families import FAMILIES, get_family
from artifactd.images.build import INIT_UID
from artifactd.pod.nodefeatures import (
    LABEL_PREFIX,
    LABEL_VALUE,
    fingerprint_label,
    valid_label_key,
)
from artifactd.restore.envfile import parse_env_file

# The session fixtures of tests/engine.py and the init image of test_image_build.py, by name.
__all__ = ["base", "engine", "init_image", "python_base"]

DEPLOY = REPO / "deploy" / "k8s"
BASE = DEPLOY / "base"
OVERLAY = DEPLOY / "overlays" / "vllm"
#: The init image's Dockerfile template: its ENTRYPOINT is what a container of
#: it without ``command`` runs.
INIT_DOCKERFILE = REPO / "dockerfiles" / "init.Dockerfile.j2"
#: The annotation that names the warm-up matrix that built the caches.
MATRIX_ANNOTATION = "artifactd.io/warmup-matrix"
GPU = "nvidia.com/gpu"
#: Where nfd-worker reads local feature files, on the node.
NFD_FEATURES_DIR = PurePosixPath("/etc/kubernetes/node-feature-discovery/features.d")
#: Exit code of ``status --fail-on-compile`` when a family compiled anyway.
COMPILED_ANYWAY = 13

# --------------------------------------------------------------------------
# Rendering: the real kustomize, as kubectl embeds it
# --------------------------------------------------------------------------

#: The oldest kustomize that renders the manifests: ``patches: [{path: ...}]``
#: (kubectl 1.21 and later embed it; Debian bookworm's kubectl 1.20 has v2).
MIN_KUSTOMIZE = (4, 0)


def kubectl() -> str:
    """The ``kubectl`` on PATH, its embedded kustomize checked (a clear failure, never a skip)."""
    found = shutil.which("kubectl")
    assert found, "no kubectl on PATH: scripts/setup.sh installs kubernetes-client"
    proc = subprocess.run(
        [found, "version", "--client"], capture_output=True, text=True, timeout=120, check=False
    )
    version = re.search(r"Kustomize Version: v(\d+)\.(\d+)", proc.stdout)
    assert version and tuple(map(int, version.groups())) >= MIN_KUSTOMIZE, (
        f"{found}: kustomize {version.group(0) if version else 'unknown'} is older than "
        f"v{'.'.join(map(str, MIN_KUSTOMIZE))}: {proc.stdout.strip()} {proc.stderr.strip()}"
    )
    return found


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """Render the kustomization in ``directory`` with ``kubectl kustomize``, as documents."""
    proc = subprocess.run(
        [kubectl(), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"kubectl kustomize {directory}: {proc.stderr.strip()}"
    # A deprecated field renders with a warning: keep the manifests free of them.
    assert not proc.stderr.strip(), f"kubectl kustomize {directory}: {proc.stderr.strip()}"
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d is not None]
    assert docs and all(isinstance(d, dict) for d in docs), proc.stdout[:300]
    return docs


# --------------------------------------------------------------------------
# The rendered documents, their containers and their artifactd command lines
# --------------------------------------------------------------------------

RENDERED = kustomize(OVERLAY)
BASE_RENDERED = kustomize(BASE)
ALL_DOCS = [("overlay", d) for d in RENDERED] + [("base", d) for d in BASE_RENDERED]
DOC_IDS = [f"{where}:{d['kind']}/{d['metadata']['name']}" for where, d in ALL_DOCS]


def ident(doc: Mapping[str, Any]) -> tuple[str, str, str]:
    """``(apiVersion, kind, metadata.name)``: how a patch names its target."""
    return (doc.get("apiVersion", ""), doc.get("kind", ""), doc.get("metadata", {}).get("name", ""))


def the(kind: str) -> dict[str, Any]:
    """The one rendered document of ``kind``."""
    found = [d for d in RENDERED if d.get("kind") == kind]
    assert len(found) == 1, f"{len(found)} {kind} documents in the overlay"
    return found[0]


DEPLOYMENT = the("Deployment")
DAEMONSET = the("DaemonSet")
CONFIGMAPS = {d["metadata"]["name"]: d for d in RENDERED if d["kind"] == "ConfigMap"}


def pod(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The pod spec of a workload's template."""
    spec = doc["spec"]["template"]["spec"]
    assert isinstance(spec, dict)
    return spec


def all_containers(doc: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(initContainers|containers, container)``, init containers first."""
    for key in ("initContainers", "containers"):
        for container in pod(doc).get(key) or []:
            yield key, container


def container(doc: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The container (or init container) ``name`` of ``doc``'s pod."""
    found = [c for _, c in all_containers(doc) if c["name"] == name]
    assert len(found) == 1, f"{doc['metadata']['name']}: {len(found)} containers {name}"
    return found[0]


def init_entrypoint() -> list[str]:
    """The init image's ENTRYPOINT, from its Dockerfile template."""
    found = re.search(r"^ENTRYPOINT (\[.*\])\s*$", INIT_DOCKERFILE.read_text(), re.MULTILINE)
    assert found, f"no ENTRYPOINT in {INIT_DOCKERFILE}"
    entrypoint: list[str] = json.loads(found.group(1))
    return entrypoint


def is_init_image(image: str) -> bool:
    """Whether ``image`` is the init image (repository ``.../artifactd-init``)."""
    return re.split(r"[:@]", image.rsplit("/", 1)[-1])[0] == "artifactd-init"


def exec_arrays(c: Mapping[str, Any]) -> Iterator[tuple[str, list[str]]]:
    """``(what, argv)``: what the container runs, and every exec probe and hook."""
    run = [str(w) for w in c.get("command") or []]
    if not run and is_init_image(c.get("image", "")):
        run = init_entrypoint()
    run += [str(w) for w in c.get("args") or []]
    if run:
        yield "run", run
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        command = ((c.get(probe) or {}).get("exec") or {}).get("command")
        if command:
            yield probe, [str(w) for w in command]
    for hook in ("postStart", "preStop"):
        command = (((c.get("lifecycle") or {}).get(hook) or {}).get("exec") or {}).get("command")
        if command:
            yield hook, [str(w) for w in command]


def calls(doc: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any], list[str]]]:
    """``(what, container, artifactd argv)`` for every artifactd command line of ``doc``."""
    for _, c in all_containers(doc):
        for what, argv in exec_arrays(c):
            for line in container_lines({"command": argv}):
                yield what, c, line


def calls_of(doc: Mapping[str, Any], command: str) -> list[tuple[str, dict[str, Any], list[str]]]:
    """The ``artifactd COMMAND`` lines of ``doc``."""
    return [x for x in calls(doc) if split_path(x[2])[0] == (command,)]


def one_call(doc: Mapping[str, Any], command: str) -> tuple[str, dict[str, Any], list[str]]:
    """The one ``artifactd COMMAND`` line of ``doc``."""
    found = calls_of(doc, command)
    assert len(found) == 1, f"{doc['metadata']['name']}: {len(found)} `artifactd {command}` lines"
    return found[0]


def env_value(c: Mapping[str, Any], name: str) -> str | None:
    """The value ``name`` has in the container: a literal, or from a rendered ConfigMap."""
    entry = container_env(c).get(name)
    if entry is None:
        return None
    if "value" in entry:
        return str(entry["value"])
    ref = (entry.get("valueFrom") or {}).get("configMapKeyRef")
    assert ref, f"{c['name']}: {name} is neither a literal nor from a ConfigMap"
    data = CONFIGMAPS.get(ref["name"], {}).get("data") or {}
    assert ref["key"] in data, f"{c['name']}: {name}: no ConfigMap {ref['name']} key {ref['key']}"
    return str(data[ref["key"]])


def setting(c: Mapping[str, Any], argv: list[str], option: str) -> str | None:
    """What ``artifactd ...`` in ``c`` gets for ``option``: its flag, else its env variable."""
    path, rest = split_path(argv)
    rest = rest[: rest.index("--")] if "--" in rest else rest
    for i, word in enumerate(rest):
        if word == option and i + 1 < len(rest):
            return rest[i + 1]
        if word.startswith(option + "="):
            return word.split("=", 1)[1]
    command: click.Command = cli
    for name in path:
        assert isinstance(command, click.Group) and name in command.commands, (
            f"artifactd has no command {' '.join(path)}"
        )
        command = command.commands[name]
    params = [p for p in command.params if option in p.opts]
    assert params, f"artifactd {' '.join(path)} has no {option}"
    envvar = params[0].envvar
    return env_value(c, envvar) if isinstance(envvar, str) else None


def run_as(doc: Mapping[str, Any], c: Mapping[str, Any]) -> int | None:
    """The uid the container runs as, as written (container, else pod securityContext)."""
    for context in (c.get("securityContext"), pod(doc).get("securityContext")):
        if context and "runAsUser" in context:
            return int(context["runAsUser"])
    return None


def gpu_limit(c: Mapping[str, Any]) -> int:
    """The container's ``nvidia.com/gpu`` limit (0 without)."""
    return int(((c.get("resources") or {}).get("limits") or {}).get(GPU, 0))


def mount_of(c: Mapping[str, Any], path: str) -> tuple[dict[str, Any], PurePosixPath] | None:
    """The deepest volume mount covering ``path`` in ``c``, and ``path`` inside that volume."""
    target = PurePosixPath(os.path.normpath(path))
    best: dict[str, Any] | None = None
    for m in c.get("volumeMounts") or []:
        point = PurePosixPath(m["mountPath"])
        if (target == point or point in target.parents) and (
            best is None or len(point.parts) > len(PurePosixPath(best["mountPath"]).parts)
        ):
            best = m
    if best is None:
        return None
    inside = PurePosixPath(best.get("subPath") or ".") / target.relative_to(best["mountPath"])
    return best, PurePosixPath(os.path.normpath(inside))


def volume(doc: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The pod's volume ``name``."""
    found: list[dict[str, Any]] = [v for v in pod(doc).get("volumes") or [] if v["name"] == name]
    assert len(found) == 1, f"{doc['metadata']['name']}: {len(found)} volumes {name}"
    return found[0]


def workload_fields(value: str | None) -> dict[str, str]:
    """``model=x,tp=8`` as a dict."""
    assert value, "no workload"
    return dict(item.split("=", 1) for item in value.split(","))


def image_digest(image: str) -> str:
    """The ``sha256:...`` an image reference is pinned to."""
    assert PINNED.match(image), f"{image}: not pinned by digest"
    return image.rsplit("@", 1)[1]


RESTORE = one_call(DEPLOYMENT, "restore")
RESTORE_C, RESTORE_ARGV = RESTORE[1], RESTORE[2]
ENGINE = container(DEPLOYMENT, "engine")

# --------------------------------------------------------------------------
# Tests: the renderer itself
# --------------------------------------------------------------------------


def test_kubectl_kustomize_refuses_a_patch_without_its_target(tmp_path: Path) -> None:
    (tmp_path / "cm.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n")
    (tmp_path / "p.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: other}\n")
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        "resources: [cm.yaml]\npatches: [{path: p.yaml}]\n"
    )
    with pytest.raises(AssertionError, match="kubectl kustomize"):
        kustomize(tmp_path)


# --------------------------------------------------------------------------
# Tests: Kubernetes
# --------------------------------------------------------------------------


def test_the_overlay_renders_the_store_the_daemonset_and_the_deployment() -> None:
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in RENDERED)
    assert kinds == [
        ("ConfigMap", "artifactd"),
        ("DaemonSet", "artifactd-node"),
        ("Deployment", "llm-server"),
    ], kinds
    assert sorted(ident(d) for d in BASE_RENDERED) == sorted(ident(d) for d in RENDERED)
    # The overlay patched the engine in: the base has none to run.
    base_engine = container(next(d for d in BASE_RENDERED if d["kind"] == "Deployment"), "engine")
    assert "image" not in base_engine and "image" in ENGINE


@pytest.mark.parametrize(("where", "doc"), ALL_DOCS, ids=DOC_IDS)
def test_every_document_round_trips_through_the_api_models(where: str, doc: dict[str, Any]) -> None:
    try:
        # lazy: the kubernetes client is in the dev extra; a clear failure without it
        import kubernetes  # noqa: PLC0415
    except ImportError:  # the dev extra installs it: scripts/setup.sh
        pytest.fail("the kubernetes client is not installed: run scripts/setup.sh", pytrace=False)
    version = doc["apiVersion"].rsplit("/", 1)[-1]
    model = f"{version.capitalize()}{doc['kind']}"
    assert hasattr(kubernetes.client, model), f"{where}: no model {model}"
    with kubernetes.client.ApiClient() as api:
        back = api.sanitize_for_serialization(api._ApiClient__deserialize(doc, model))
    # A key the models do not know (misspelled, or in the wrong place) is dropped.
    assert back == doc, f"{where}: the {model} models do not read it back as written"


def test_images_are_pinned_and_the_init_image_is_this_version() -> None:
    for doc in (DEPLOYMENT, DAEMONSET):
        for key, c in all_containers(doc):
            name = f"{doc['kind']}:{key}/{c['name']}"
            assert PINNED.match(c.get("image", "")), f"{name}: image not pinned by digest"
            if is_init_image(c["image"]):
                tag = c["image"].rsplit("@", 1)[0].rsplit(":", 1)[-1]
                assert tag == __version__, f"{name}: init image {tag}, artifactd is {__version__}"
    assert is_init_image(RESTORE_C["image"]), "the restore runs in the init image"
    assert "command" not in RESTORE_C, "the init image's entrypoint is `artifactd restore`"


def test_the_restore_and_the_engine_share_one_writable_cache_volume() -> None:
    target = setting(RESTORE_C, RESTORE_ARGV, "--target")
    assert target, "restore without --target"
    found = mount_of(RESTORE_C, target)
    assert found, f"the restore's target {target} is on no volume"
    mount, _ = found
    assert "emptyDir" in volume(DEPLOYMENT, mount["name"]), "the caches: one emptyDir per pod"
    assert not mount.get("readOnly")
    engine_mounts = [m for m in ENGINE.get("volumeMounts") or [] if m["name"] == mount["name"]]
    assert engine_mounts, f"the engine does not mount {mount['name']}"
    assert not any(m.get("readOnly") for m in engine_mounts), "the engine writes its caches"


def test_the_env_file_points_inside_the_engines_cache_mount() -> None:
    target = setting(RESTORE_C, RESTORE_ARGV, "--target")
    assert target
    user = setting(RESTORE_C, RESTORE_ARGV, "--consumer-user")
    assert user, "name the engine's user: the init container runs as another"
    families = setting(RESTORE_C, RESTORE_ARGV, "--family")
    names = [n.strip() for n in families.split(",")] if families else list(FAMILIES)
    env_file = setting(RESTORE_C, RESTORE_ARGV, "--env-file") or f"{target}/artifactd.env"
    # The engine loads the env file the restore wrote, from its own view of the volume.
    _, exec_c, exec_argv = one_call(DEPLOYMENT, "exec")
    assert exec_c is ENGINE, "the engine is started through `artifactd exec`"
    exec_target = setting(ENGINE, exec_argv, "--target")
    assert exec_target
    exec_env = setting(ENGINE, exec_argv, "--env-file") or f"{exec_target}/artifactd.env"
    restored, loaded = mount_of(RESTORE_C, env_file), mount_of(ENGINE, exec_env)
    assert restored and loaded, f"env file {env_file} / {exec_env} on no volume"
    assert (restored[0]["name"], restored[1]) == (loaded[0]["name"], loaded[1]), (
        f"exec loads {exec_env}, not the file the restore writes ({env_file})"
    )
    checked = 0
    for name in names:
        family = get_family(name)
        paths = {f"{name} {k}": v for k, v in family.restore_env(Path(target), user=user).items()}
        dirs = family.restore_dirs(Path(target), user=user).items()
        paths.update({f"{name} dir {k}": str(v) for k, v in dirs})
        for what, value in paths.items():
            if not value.startswith("/"):
                continue  # a switch (FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1), not a path
            checked += 1
            written, seen = mount_of(RESTORE_C, value), mount_of(ENGINE, value)
            assert written and written[0]["name"] == restored[0]["name"], (
                f"{what}={value}: not on the restore's cache volume"
            )
            assert seen and (seen[0]["name"], seen[1]) == (written[0]["name"], written[1]), (
                f"{what}={value}: the engine does not see the restored {value} there"
            )
    assert checked >= len(names), "no path checked"


def test_no_mount_covers_a_whole_home_cache() -> None:
    for doc in RENDERED:
        if doc["kind"] == "ConfigMap":
            continue
        for key, c in all_containers(doc):
            for m in c.get("volumeMounts") or []:
                point = PurePosixPath(m["mountPath"])
                assert point.name != ".cache" and point not in (
                    PurePosixPath("/root"),
                    PurePosixPath("/home"),
                ), f"{doc['kind']}:{key}/{c['name']}: a volume over {point}"
                assert point.parent != PurePosixPath("/home"), f"{c['name']}: over a home"


def test_the_restore_gets_its_store_software_workload_and_gpus() -> None:
    store_entry = container_env(RESTORE_C).get("ARTIFACTD_STORE") or {}
    assert "configMapKeyRef" in (store_entry.get("valueFrom") or {}), "store: from the ConfigMap"
    store = setting(RESTORE_C, RESTORE_ARGV, "--store")
    assert store and not store.startswith("oci:"), f"store {store}: a registry"
    software = setting(RESTORE_C, RESTORE_ARGV, "--software-from")
    assert software and re.fullmatch(re.escape(store) + r":fp-[0-9a-f]{64}", software), (
        f"--software-from {software}: an artifact of {store}, by its fingerprint tag"
    )
    assert workload_fields(setting(RESTORE_C, RESTORE_ARGV, "--workload")).get("model")
    assert setting(RESTORE_C, RESTORE_ARGV, "--gpu-arch") is None, "it sees the pod's GPUs"
    assert gpu_limit(RESTORE_C) == gpu_limit(ENGINE) > 0, "the probe must see the pod's GPUs"
    assert run_as(DEPLOYMENT, RESTORE_C) == INIT_UID
    for var in ("ARTIFACTD_REGISTRY_USERNAME", "ARTIFACTD_REGISTRY_PASSWORD"):
        assert (container_env(RESTORE_C).get(var) or {}).get("valueFrom", {}).get("secretKeyRef")


def test_the_node_store_and_the_metrics_are_one_hostpath_each() -> None:
    stores: dict[str, set[str]] = {}
    metrics: dict[str, set[str]] = {}
    files: list[str] = []
    for doc in (DEPLOYMENT, DAEMONSET):
        for _, c, argv in calls(doc):
            command = split_path(argv)[0]
            option = "--store" if command in (("gc",), ("node-features",)) else "--node-store"
            if command in (("restore",), ("prefetch",), ("gc",), ("node-features",)):
                ref = setting(c, argv, option)
                assert ref and ref.startswith("oci:"), f"{c['name']}: node store {ref}"
                found = mount_of(c, ref[4:])
                assert found, f"{c['name']}: {ref} is on no volume"
                host = volume(doc, found[0]["name"]).get("hostPath")
                assert host, f"{c['name']}: the node store is not a hostPath"
                # The same path inside and on the node: one name in logs, metrics, `ls`.
                assert host["path"] == ref[4:] and found[1] == PurePosixPath("."), ref
                stores.setdefault(host["path"], set()).add(doc["kind"])
                # Every writer is the init image's user: a root-owned file locks the others out.
                assert run_as(doc, c) == INIT_UID, f"{c['name']} writes the node store"
            if command in (("restore",), ("gc",)):
                path = setting(c, argv, "--metrics-file")
                assert path, f"{c['name']}: no --metrics-file"
                found = mount_of(c, path)
                assert found and "hostPath" in volume(doc, found[0]["name"]), path
                host = volume(doc, found[0]["name"])["hostPath"]["path"]
                metrics.setdefault(host, set()).add(doc["kind"])
                files.append(str(PurePosixPath(host) / found[1]))
    assert stores and all(kinds == {"Deployment", "DaemonSet"} for kinds in stores.values())
    assert len(stores) == 1, f"node stores: {sorted(stores)}"
    assert len(metrics) == 1 and len(set(files)) == len(files), (metrics, files)
    # The DaemonSet hands the node store and the textfile directory to that user.
    setup = " ".join(w for _, argv in exec_arrays(container(DAEMONSET, "node-dirs")) for w in argv)
    for path in stores:
        assert f"chown {INIT_UID}:{INIT_UID} {path}" in setup, setup


def test_the_engine_starts_through_exec_and_status_gates_its_readiness() -> None:
    target = setting(RESTORE_C, RESTORE_ARGV, "--target")
    runs = dict(exec_arrays(ENGINE))
    argv = runs["run"]
    assert argv[:2] == ["artifactd", "exec"] and "--" in argv, argv
    assert setting(ENGINE, argv[1:], "--target") == target
    assert argv[argv.index("--") + 1 :][:2] == ["vllm", "serve"], "the engine after --"
    probe = runs.get("readinessProbe")
    assert probe, "no readiness probe"
    line = artifactd_argv(" ".join(probe))
    assert line and split_path(line)[0] == ("status",), probe
    assert "--fail-on-compile" in line and setting(ENGINE, line, "--target") == target
    # Readiness runs once the engine answers: the startup probe holds it back.
    assert ENGINE.get("startupProbe"), "readiness would judge an engine still starting"
    for hook in ("postStart", "preStop"):
        assert hook not in runs, f"{hook}: the gate is the readiness probe (see the comments)"


def test_readiness_asks_the_engine_on_its_port_and_reads_the_log_exec_writes() -> None:
    """``status --ready serviceable`` probes the engine's own port; ``exec`` keeps a log."""
    probe = dict(exec_arrays(ENGINE))["readinessProbe"]
    line = artifactd_argv(" ".join(probe))
    assert line and setting(ENGINE, line, "--ready") == "serviceable", probe
    url = setting(ENGINE, line, "--engine-url")
    assert url, "--ready needs --engine-url"
    ports = {p["containerPort"] for p in ENGINE.get("ports") or []}
    assert urlsplit(url).port in ports and urlsplit(url).hostname == "127.0.0.1", (url, ports)
    # `exec` keeps the stamped log in the caches' volume; the probe, which must
    # stay fast, does not read it (status reads a log whole).
    run = dict(exec_arrays(ENGINE))["run"]
    log = setting(ENGINE, run[1:], "--engine-log")
    assert log and log.startswith("/cache/"), log
    assert setting(ENGINE, line, "--engine-log") is None


def test_the_engine_serves_what_the_warm_up_matrix_built() -> None:
    matrix_file = DEPLOYMENT["metadata"].get("annotations", {}).get(MATRIX_ANNOTATION)
    assert matrix_file, f"no {MATRIX_ANNOTATION} annotation"
    path = REPO / matrix_file
    matrix = load_matrix(path)
    workload = workload_fields(setting(RESTORE_C, RESTORE_ARGV, "--workload"))
    assert workload == {k: str(v) for k, v in matrix.workload.items()}, workload

    def without_address(argv: list[str]) -> list[str]:
        out, skip = [], False
        for word in argv:
            if skip:
                skip = False
            elif word in ("--host", "--port"):
                skip = True
            elif not word.startswith(("--host=", "--port=")):
                out.append(word)
        return out

    run = next(argv for what, argv in exec_arrays(ENGINE) if what == "run")
    served = without_address(run[run.index("--") + 1 :])
    cells = expand(matrix, path)
    same = [c for c in cells if c.serve is not None and without_address(c.serve.argv) == served]
    assert same, f"the engine's flags are no cell's of {matrix_file}: {served}"
    assert gpu_limit(ENGINE) == same[0].gpus, "the cell's GPUs (one per rank)"
    for key, value in matrix.env.items():
        assert env_value(ENGINE, key) == str(value), f"{key}: the matrix sets {value}"


def test_the_daemonset_prefetches_the_release_and_collects_garbage() -> None:
    _, prefetch_c, prefetch = one_call(DAEMONSET, "prefetch")
    assert prefetch_c in pod(DAEMONSET).get("initContainers", []), "prefetch: once per rollout"
    # The runtime image itself: prefetch probes the software it runs in.
    assert prefetch_c["image"] == ENGINE["image"]
    assert setting(prefetch_c, prefetch, "--image-digest") == image_digest(ENGINE["image"])
    for option in ("--workload", "--store", "--gpu-arch", "--family"):
        assert setting(prefetch_c, prefetch, option) == setting(RESTORE_C, RESTORE_ARGV, option), (
            f"prefetch {option} differs from the restore's"
        )
    assert env_value(prefetch_c, "NVIDIA_VISIBLE_DEVICES") == "all", "it must see the GPUs"
    # On the Deployment's nodes.
    for key in ("nodeSelector", "tolerations"):
        assert pod(DAEMONSET).get(key) == pod(DEPLOYMENT).get(key), f"{key} differs"
    _, gc_c, gc = one_call(DAEMONSET, "gc")
    assert gc_c in pod(DAEMONSET)["containers"], "gc runs for the node's life"
    max_bytes = setting(gc_c, gc, "--max-bytes")
    assert max_bytes and SIZE.read(max_bytes)
    assert "--apply" in gc, "gc is a dry run without --apply: the node store would fill"
    script = next(argv for w, argv in exec_arrays(gc_c) if w == "run")[-1]
    assert re.search(r"\bwhile\b", script) and re.search(r"\bsleep \d+", script), script


def test_the_daemonset_publishes_its_node_store_as_nfd_features() -> None:
    _, gc_c, gc = one_call(DAEMONSET, "gc")
    _, nf_c, nf = one_call(DAEMONSET, "node-features")
    assert nf_c is gc_c, "published by the gc loop, after each gc"
    script = next(argv for w, argv in exec_arrays(gc_c) if w == "run")[-1]
    assert script.index("artifactd gc") < script.index("artifactd node-features"), script
    assert setting(nf_c, nf, "--store") == setting(gc_c, gc, "--store")
    out = setting(nf_c, nf, "--out")
    assert out, "no --out"
    found = mount_of(nf_c, out)
    assert found, f"{out} is on no volume"
    host = volume(DAEMONSET, found[0]["name"]).get("hostPath")
    assert host, "the features file must be on the node, where nfd-worker reads it"
    assert (PurePosixPath(host["path"]) / found[1]).parent == NFD_FEATURES_DIR, out
    assert PurePosixPath(out).parent == NFD_FEATURES_DIR, "the same path inside and on the node"
    # node-dirs makes the directory writable for the gc container's user.
    setup = " ".join(w for _, argv in exec_arrays(container(DAEMONSET, "node-dirs")) for w in argv)
    assert f"chgrp {INIT_UID} {NFD_FEATURES_DIR}" in setup and f"g+w {NFD_FEATURES_DIR}" in setup
    assert run_as(DAEMONSET, nf_c) == INIT_UID


def test_the_overlay_prefers_the_nodes_that_hold_its_artifact() -> None:
    _, nf_c, nf = one_call(DAEMONSET, "node-features")
    software = setting(RESTORE_C, RESTORE_ARGV, "--software-from") or ""
    fp_hash = software.rsplit(":fp-", 1)[-1]
    key = fingerprint_label(fp_hash, setting(nf_c, nf, "--prefix") or LABEL_PREFIX)
    assert valid_label_key(key), key
    affinity = (pod(DEPLOYMENT).get("affinity") or {}).get("nodeAffinity") or {}
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in affinity, (
        "a cold node still runs"
    )
    terms = affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or []
    found = [
        term
        for term in terms
        for e in term["preference"].get("matchExpressions") or []
        if e["key"] == key and e["operator"] == "In" and e["values"] == [LABEL_VALUE]
    ]
    assert len(found) == 1 and found[0]["weight"] > 0, f"no preference for {key}: {terms}"


INVOCATIONS = [
    (f"{doc['kind']}/{c['name']}:{what}:{' '.join(split_path(argv)[0])}", argv)
    for doc in (DEPLOYMENT, DAEMONSET)
    for what, c, argv in calls(doc)
]


def test_the_manifests_run_the_commands_a_pod_needs() -> None:
    commands = {" ".join(split_path(argv)[0]) for _, argv in INVOCATIONS}
    assert {"restore", "exec", "status", "prefetch", "gc"} <= commands, commands


@pytest.mark.parametrize(("where", "argv"), INVOCATIONS, ids=[w for w, _ in INVOCATIONS])
def test_every_artifactd_command_line_exists(where: str, argv: list[str]) -> None:
    path, rest = split_path(argv)
    code, text = run_help(path)
    shown = " ".join(["artifactd", *path, "--help"])
    assert code == 0, f"{where}: {shown} exited {code}: {text.strip()[-300:]}"
    missing = sorted(set(used_options(rest)) - listed_options(text))
    assert not missing, f"{where}: {shown} lists no {', '.join(missing)}"


# --------------------------------------------------------------------------
# End to end: the pod's containers on podman
# --------------------------------------------------------------------------


def _binds(c: Mapping[str, Any], root: Path, only: set[str] | None = None) -> dict[str, Any]:
    """docker SDK ``volumes``: each of ``c``'s mounts from ``root/<volume>``, owned by INIT_UID."""
    binds: dict[str, Any] = {}
    for m in c.get("volumeMounts") or []:
        if only is not None and m["name"] not in only:
            continue
        host = root / m["name"]
        host.mkdir(exist_ok=True)
        os.chown(host, INIT_UID, INIT_UID)  # what node-dirs (hostPath) and kubelet (emptyDir) do
        binds[str(host)] = {"bind": m["mountPath"], "mode": "ro" if m.get("readOnly") else "rw"}
    return binds


def _user(doc: Mapping[str, Any], c: Mapping[str, Any]) -> str | None:
    uid = run_as(doc, c)
    return None if uid is None else f"{uid}:{uid}"


@pytest.mark.podman
@pytest.mark.image
def test_the_pods_containers_restore_and_start_the_engine_on_podman(
    engine: Engine,
    init_image: dict[str, Any],
    registry: RegistryServer,
    repo: str,
    tmp_path: Path,
) -> None:
    client = docker_client(engine)
    image = init_image["image_id"]
    store = registry.ref(f"{repo}-caches")
    workload = setting(RESTORE_C, RESTORE_ARGV, "--workload")
    assert workload
    # The caches, harvested in a container of the init image: its fingerprint is the restore's.
    tree = make_generic_tree(tmp_path / "gen")
    harvested = run_in(
        client, image,
        "harvest", "--store", store, "--family", "generic", "--workload", workload, "--json",
        entrypoint="artifactd",
        environment={"ARTIFACTD_GENERIC_DIR": "/caches/generic"},
        volumes={str(tree): {"bind": "/caches/generic", "mode": "ro"}},
    )  # fmt: skip
    fp_hash = json.loads(harvested)["fingerprint_hash"]

    # The init container as rendered, its store and software pointed at the loopback registry.
    env: dict[str, str] = {}
    for entry in RESTORE_C.get("env") or []:
        if "value" in entry:
            env[entry["name"]] = str(entry["value"])
    env["ARTIFACTD_STORE"] = store
    env["ARTIFACTD_SOFTWARE_FROM"] = f"{store}:fp-{fp_hash}"
    volumes = tmp_path / "volumes"
    volumes.mkdir()
    reported = container_output(
        client,
        image,
        [*RESTORE_C["args"], "--require", "--json"],
        environment=env,
        user=_user(DEPLOYMENT, RESTORE_C),
        volumes=_binds(RESTORE_C, volumes),
        network_mode="host",
    )
    doc = json.loads(reported.decode())
    assert doc["status"] == "restored" and doc["match"] == "full", doc
    assert doc["restored"] == ["generic"]
    assert doc["node_store"]["outcome"] == "fetched", doc["node_store"]
    target = setting(RESTORE_C, RESTORE_ARGV, "--target") or ""
    node_ref = setting(RESTORE_C, RESTORE_ARGV, "--node-store") or ""
    metrics = setting(RESTORE_C, RESTORE_ARGV, "--metrics-file") or ""
    on_host = {}
    for path in (target, node_ref.removeprefix("oci:"), metrics):
        found = mount_of(RESTORE_C, path)
        assert found, f"{path}: on no volume"
        on_host[path] = volumes / found[0]["name"] / found[1]
    cache_volume = on_host[target].name
    assert (on_host[node_ref[4:]] / "index.json").is_file(), "the node store was not filled"
    assert on_host[metrics].is_file(), "no metrics file"
    env_file = parse_env_file(volumes / cache_volume / "artifactd.env")
    assert env_file["ARTIFACTD_GENERIC_DIR"] == f"{target}/generic", env_file

    # The DaemonSet's gc loop publishes the node store for NFD: its own node-features
    # line, on the same node-store volume, as its user; the file names the label
    # the overlay's affinity prefers, for this artifact.
    _, nf_c, nf = one_call(DAEMONSET, "node-features")
    run_in(
        client, image, *nf, entrypoint="artifactd", user=_user(DAEMONSET, nf_c),
        volumes=_binds(nf_c, volumes),
    )  # fmt: skip
    out = setting(nf_c, nf, "--out") or ""
    found = mount_of(nf_c, out)
    assert found, out
    features = (volumes / found[0]["name"] / found[1]).read_text()
    label = fingerprint_label(fp_hash, setting(nf_c, nf, "--prefix") or LABEL_PREFIX)
    assert f"{label}={LABEL_VALUE}" in features.splitlines(), features
    assert valid_label_key(label)

    # The engine: the rendered `artifactd exec --target ... --`, then python3 for vLLM.
    run = next(argv for what, argv in exec_arrays(ENGINE) if what == "run")
    prefix = run[: run.index("--") + 1]
    # What the engine saw goes to a file on the cache volume. Its stdout is a burst
    # it writes just before it ends, as a crash's traceback is: with --engine-log, exec
    # stays the engine's parent and the container's first process, and waits for the
    # log's copier to pass every line on (were the copier the engine's sibling, the
    # kernel would end it with the container's first process, and the lines with it).
    mount = next(m["mountPath"] for m in ENGINE["volumeMounts"] if m["name"] == cache_volume)
    script = (
        "import hashlib, json, os\n"
        "root = os.environ['ARTIFACTD_GENERIC_DIR']\n"
        "files = {os.path.relpath(os.path.join(d, f), root):\n"
        "         hashlib.sha256(open(os.path.join(d, f), 'rb').read()).hexdigest()\n"
        "         for d, _, names in os.walk(root) for f in names}\n"
        f"with open({mount + '/engine-saw.json'!r}, 'w') as out:\n"
        "    json.dump({'environ': dict(os.environ), 'files': files}, out)\n"
        "burst = b''.join(b'line %05d\\n' % i for i in range(5000)) + b'END\\n'\n"
        "view = memoryview(burst)\n"
        "while view:\n"
        "    view = view[os.write(1, view):]\n"
        "os._exit(0)\n"
    )
    engine_env = {e["name"]: str(e["value"]) for e in ENGINE.get("env") or [] if "value" in e}
    binds = _binds(ENGINE, volumes, only={cache_volume})
    argv = [*prefix[1:], "python3", "-c", script]
    said = run_in(client, image, *argv, entrypoint=prefix[0], environment=engine_env, volumes=binds)
    lines = said.splitlines()
    assert len(lines) == 5001 and lines[-1] == "END", (len(lines), lines[-2:])
    engine_log = setting(ENGINE, run[1:], "--engine-log") or ""
    assert engine_log.startswith(mount + "/"), engine_log
    logged = (volumes / cache_volume / engine_log[len(mount) + 1 :]).read_text().splitlines()
    assert logged[-1].endswith("| END"), logged[-2:]
    saw = volumes / cache_volume / "engine-saw.json"
    seen = json.loads(saw.read_text())
    saw.unlink()
    for key, value in env_file.items():
        assert seen["environ"].get(key) == value, f"the engine's {key}"
        if value.startswith("/"):
            assert mount_of(ENGINE, value), f"{key}={value}: outside the engine's mounts"
    assert seen["files"] == tree_digests(tree), "the engine does not see the restored files"

    # The readiness probe, as written: used (0), then compiled anyway (13). It asks the
    # engine's /health too: a real HTTP server answers it here, on a free port in place
    # of the manifest's 8000 (the probe runs on the host's network).
    probe = next(argv for what, argv in exec_arrays(ENGINE) if what == "readinessProbe")
    engine_url = setting(ENGINE, probe, "--engine-url") or ""
    assert engine_url.startswith("http://127.0.0.1:"), probe
    health = _health_server()
    here = f"http://127.0.0.1:{health.server_address[1]}"
    probe = [here if a == engine_url else a for a in probe]
    mounts = [f"-v={host}:{b['bind']}" for host, b in binds.items()]

    def readiness() -> int:
        proc = engine.podman(
            "run", "--rm", "--network=host", *mounts,
            f"--entrypoint={json.dumps(probe[:1])}", image, *probe[1:],
            check=False,
        )  # fmt: skip
        return proc.returncode

    assert readiness() == 0
    written = volumes / cache_volume / "generic" / "compiled-later.sm_90a.cubin"
    written.write_bytes(b"\x7fELF" + hashlib.sha256(b"later").digest())
    os.chown(written, INIT_UID, INIT_UID)
    assert readiness() == COMPILED_ANYWAY


def _health_server() -> http.server.ThreadingHTTPServer:
    """Start an engine stand-in on a free loopback port: ``/health`` answers 200."""

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/health" else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            del format, args

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
