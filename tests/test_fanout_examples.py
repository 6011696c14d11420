"""The fan-out examples stay true to Kubernetes' API, to their matrices and to the CLI.

``examples/k8s/``: every YAML document is a ``batch/v1`` Job that goes through
the Kubernetes API models of the ``kubernetes`` client unchanged (the models
drop a key they do not know, silently, so a misspelled or misplaced key makes
the round trip differ), and the checks that matter hold: the warm-up Job is
Indexed with one completion per cell of the matrix it names, every container
that runs cells has the largest cell's GPUs, images are pinned by digest,
registry credentials come from a Secret, every ``$(VAR)`` resolves, and the
merge Job merges (in an init container) before it verifies and promotes,
with the build's run id and store.

``examples/ci/github-fanout.yml``: the structure GitHub Actions needs (the
checks of ``test_ci_examples.py``) and the fan-out's shape: plan, one job
per cell from the plan's ``.include``, merge, verify.

Every ``artifactd`` command line in both names a command whose ``--help``
lists each ``--option`` it uses. The extractor and helpers are
``test_ci_examples.py``'s.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO
from test_ci_examples import (
    EXPR,
    Invocation,
    _check_github,
    _needs,
    artifactd_argv,
    artifactd_lines,
    invocations,
    listed_options,
    load,
    run_help,
    split_path,
    used_options,
)

from artifactd.build.matrix import Cell, expand, load_matrix

K8S = REPO / "examples" / "k8s"
FANOUT = REPO / "examples" / "ci" / "github-fanout.yml"
MATRICES = REPO / "warmup_matrices"
GPU = "nvidia.com/gpu"
#: An image reference pinned by digest: ``HOST/REPO@sha256:<64 hex>``.
PINNED = re.compile(r"^[^@\s]+@sha256:[0-9a-f]{64}$")
#: A Kubernetes ``$(VAR)`` reference in a command or argument.
K8S_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
SHELLS = {"sh", "bash", "dash", "ash"}
#: Commands that run the matrix's cells, so need the largest cell's GPUs.
RUNS_CELLS = {("build",), ("verify",)}
CREDENTIALS = ("ARTIFACTD_REGISTRY_USERNAME", "ARTIFACTD_REGISTRY_PASSWORD")

# --------------------------------------------------------------------------
# Kubernetes documents, containers and their artifactd lines
# --------------------------------------------------------------------------


def k8s_files() -> list[Path]:
    """Every YAML file under ``examples/k8s/``."""
    return sorted(p for p in K8S.rglob("*") if p.suffix in (".yml", ".yaml"))


def k8s_documents() -> list[tuple[str, dict[str, Any]]]:
    """``(file#n, document)`` for every non-empty YAML document under ``examples/k8s/``."""
    out: list[tuple[str, dict[str, Any]]] = []
    for path in k8s_files():
        for n, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if doc is None:
                continue
            assert isinstance(doc, dict), f"{path.name}#{n}: not a mapping"
            out.append((f"{path.name}#{n}", doc))
    return out


DOCUMENTS = k8s_documents()
DOC_IDS = [where for where, _ in DOCUMENTS]


def _pod_spec(doc: Mapping[str, Any]) -> dict[str, Any]:
    spec = doc.get("spec", {}).get("template", {}).get("spec")
    assert isinstance(spec, dict), f"{doc.get('kind')}: no spec.template.spec"
    return spec


def containers(doc: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(initContainers|containers, container)`` of a Job's pod, init containers first."""
    spec = _pod_spec(doc)
    for key in ("initContainers", "containers"):
        for container in spec.get(key) or []:
            yield key, container


def container_env(container: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The container's env entries by name."""
    return {e["name"]: e for e in container.get("env") or []}


def container_lines(container: Mapping[str, Any]) -> list[list[str]]:
    """The argv of every artifactd invocation a container runs.

    Exec form (``command`` + ``args``) is one argv; a shell's ``-c SCRIPT`` is
    split with ``test_ci_examples``' extractor.
    """
    argv = [str(w) for w in [*(container.get("command") or []), *(container.get("args") or [])]]
    if argv and argv[0].rsplit("/", 1)[-1] in SHELLS and "-c" in argv[1:]:
        return artifactd_lines(argv[argv.index("-c") + 1])
    found = artifactd_argv(shlex.join(argv)) if argv else None
    return [found] if found is not None else []


def k8s_invocations() -> list[Invocation]:
    """Every artifactd command line of every container under ``examples/k8s/``."""
    out: list[Invocation] = []
    for where, doc in DOCUMENTS:
        name = doc.get("metadata", {}).get("name", "?")
        for _, container in containers(doc):
            for argv in container_lines(container):
                path, rest = split_path(argv)
                out.append(
                    Invocation(where, f"{name}/{container['name']}", path, used_options(rest))
                )
    return out


K8S_INVOCATIONS = k8s_invocations()


def _after(argv: list[str], option: str) -> str | None:
    """The value that follows ``option`` in ``argv`` (``--opt VALUE`` or ``--opt=VALUE``)."""
    for i, word in enumerate(argv):
        if word == option and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith(option + "="):
            return word.split("=", 1)[1]
    return None


def _resolve(value: str, env: Mapping[str, Mapping[str, Any]]) -> str:
    """``value`` with each ``$(VAR)`` replaced by the env's literal value."""
    return K8S_VAR.sub(lambda m: str(env[m.group(1)].get("value")), value)


def _matrix_cells(argv: list[str]) -> tuple[Path, list[Cell]]:
    """The repository matrix a command line names (by file name), and its cells."""
    _, rest = split_path(argv)
    positional = [w for w in rest if not w.startswith("-")]
    assert positional, f"no matrix file in {argv}"
    path = MATRICES / Path(positional[0]).name
    assert path.is_file(), f"{positional[0]}: no {path.relative_to(REPO)} in the repository"
    return path, expand(load_matrix(path), path)


def _gpu_limit(container: Mapping[str, Any]) -> int:
    limits = (container.get("resources") or {}).get("limits") or {}
    return int(limits.get(GPU, 0))


def _jobs_running(command: str) -> list[tuple[str, dict[str, Any], dict[str, Any], list[str]]]:
    """``(where, job, container, argv)`` for every container that runs ``artifactd COMMAND``."""
    found = []
    for where, doc in DOCUMENTS:
        for _, container in containers(doc):
            for argv in container_lines(container):
                if split_path(argv)[0] == (command,):
                    found.append((where, doc, container, argv))
    return found


# --------------------------------------------------------------------------
# Tests: Kubernetes
# --------------------------------------------------------------------------


def test_k8s_examples_exist_and_have_the_fanout_commands() -> None:
    assert "indexed-job.yaml" in {p.name for p in k8s_files()}
    assert len(DOCUMENTS) >= 2, DOC_IDS
    commands = {" ".join(inv.path) for inv in K8S_INVOCATIONS}
    assert {"build", "merge", "verify"} <= commands, commands


@pytest.mark.parametrize(("where", "doc"), DOCUMENTS, ids=DOC_IDS)
def test_k8s_document_round_trips_through_the_api_models(where: str, doc: dict[str, Any]) -> None:
    try:
        # lazy: the kubernetes client is in the dev extra; a clear failure without it
        import kubernetes  # noqa: PLC0415
    except ImportError:  # the dev extra installs it: scripts/setup.sh
        pytest.fail("the kubernetes client is not installed: run scripts/setup.sh", pytrace=False)
    assert doc.get("apiVersion") == "batch/v1", f"{where}: apiVersion {doc.get('apiVersion')}"
    assert doc.get("kind") == "Job", f"{where}: kind {doc.get('kind')}"
    with kubernetes.client.ApiClient() as api:
        model = api._ApiClient__deserialize(doc, "V1Job")
        back = api.sanitize_for_serialization(model)
    # A key the models do not know (misspelled, or in the wrong place) is dropped.
    assert back == doc, f"{where}: the V1Job models do not read it back as written"


@pytest.mark.parametrize(("where", "doc"), DOCUMENTS, ids=DOC_IDS)
def test_k8s_images_pinned_and_variables_resolved(where: str, doc: dict[str, Any]) -> None:
    pod = _pod_spec(doc)
    assert pod.get("restartPolicy") in ("Never", "OnFailure"), f"{where}: a Job's pods"
    for key, container in containers(doc):
        name = f"{where}:{key}/{container['name']}"
        assert PINNED.match(container.get("image", "")), f"{name}: image not pinned by digest"
        env = container_env(container)
        # Kubernetes leaves an unknown $(VAR) as it is: the command would get it literally.
        for word in [*(container.get("command") or []), *(container.get("args") or [])]:
            for var in K8S_VAR.findall(str(word)):
                assert var in env, f"{name}: $({var}) is not in its env"
                assert "value" in env[var], f"{name}: $({var}) needs a literal value"
        for argv in container_lines(container):
            if _after(argv, "--store") is None:
                continue
            for var in CREDENTIALS:
                ref = (env.get(var) or {}).get("valueFrom", {}).get("secretKeyRef")
                assert ref, f"{name}: {var} must come from a Secret (secretKeyRef)"


def test_indexed_job_has_one_completion_per_cell() -> None:
    builds = _jobs_running("build")
    assert builds, "no container runs artifactd build"
    for where, job, container, argv in builds:
        spec = job["spec"]
        assert spec.get("completionMode") == "Indexed", f"{where}: not an Indexed Job"
        path, cells = _matrix_cells(argv)
        assert spec.get("completions") == len(cells), (
            f"{where}: completions {spec.get('completions')}, {path.name} has {len(cells)} cells"
        )
        assert 1 <= spec.get("parallelism", 1) <= len(cells), f"{where}: parallelism"
        if "backoffLimitPerIndex" in spec:
            assert _pod_spec(job)["restartPolicy"] == "Never", f"{where}: backoffLimitPerIndex"
        # The cell comes from JOB_COMPLETION_INDEX, which Kubernetes sets.
        assert "--cell" not in used_options(split_path(argv)[1]), f"{where}: --cell given"
        assert "JOB_COMPLETION_INDEX" not in container_env(container), where
        assert _after(argv, "--run-id") is not None, f"{where}: no --run-id"
        assert _after(argv, "--store") is not None, f"{where}: no --store"


@pytest.mark.parametrize("command", sorted(c[0] for c in RUNS_CELLS))
def test_containers_that_run_cells_have_the_largest_cells_gpus(command: str) -> None:
    found = _jobs_running(command)
    assert found, f"no container runs artifactd {command}"
    for where, job, container, argv in found:
        path, cells = _matrix_cells(argv)
        most = max(cell.gpus for cell in cells)
        assert _gpu_limit(container) == most, (
            f"{where}/{container['name']}: {GPU} limit {_gpu_limit(container)}, "
            f"the largest cell of {path.name} needs {most}"
        )
        # The matrix file is where the container looks for it: a mounted volume.
        mounts = {m["mountPath"] for m in container.get("volumeMounts") or []}
        matrix = next(w for w in split_path(argv)[1] if not w.startswith("-"))
        assert str(Path(matrix).parent) in mounts, f"{where}: {matrix} is on no volume"
        assert job["spec"]["template"]["spec"].get("nodeSelector"), f"{where}: any node"


def test_merge_job_merges_then_verifies_with_the_builds_run_and_store() -> None:
    builds = _jobs_running("build")
    merges = _jobs_running("merge")
    verifies = _jobs_running("verify")
    assert builds and merges and verifies
    _, _, b_container, b_argv = builds[0]
    b_env = container_env(b_container)
    run_id = _resolve(_after(b_argv, "--run-id") or "", b_env)
    store = _resolve(_after(b_argv, "--store") or "", b_env)
    digest = _resolve(_after(b_argv, "--image-digest") or "", b_env)
    for where, job, container, argv in merges:
        env = container_env(container)
        assert _resolve(_after(argv, "--run-id") or "", env) == run_id, f"{where}: run id"
        assert _resolve(_after(argv, "--store") or "", env) == store, f"{where}: store"
        assert _matrix_cells(argv)[0] == _matrix_cells(b_argv)[0], f"{where}: matrix"
        # In an init container, so the verify of the same pod starts only after it.
        kinds = {key for key, c in containers(job) if c is container}
        assert kinds == {"initContainers"}, f"{where}: merge runs in {kinds}"
        verify = [c for key, c in containers(job) if key == "containers"]
        assert any(
            split_path(line)[0] == ("verify",) for c in verify for line in container_lines(c)
        ), f"{where}: merges but does not verify"
    for where, _, container, argv in verifies:
        env = container_env(container)
        assert _after(argv, "--promote"), f"{where}: verify without --promote"
        assert _resolve(_after(argv, "--store") or "", env) == store, f"{where}: store"
        if digest:
            assert _resolve(_after(argv, "--image-digest") or "", env) == digest, where
        assert _matrix_cells(argv)[0] == _matrix_cells(b_argv)[0], f"{where}: matrix"


def test_build_image_digest_is_the_images_own() -> None:
    for where, _, container, argv in _jobs_running("build"):
        digest = _after(argv, "--image-digest")
        if digest is None:
            continue
        resolved = _resolve(digest, container_env(container))
        assert container["image"].endswith("@" + resolved), (
            f"{where}: --image-digest {resolved} but the pod runs {container['image']}"
        )


# --------------------------------------------------------------------------
# Tests: GitHub Actions
# --------------------------------------------------------------------------


def _fanout_lines(job: str) -> list[list[str]]:
    steps = load(FANOUT)["jobs"][job]["steps"]
    return [
        argv for s in steps if isinstance(s.get("run"), str) for argv in artifactd_lines(s["run"])
    ]


def test_github_fanout_has_the_structure_github_needs() -> None:
    _check_github(load(FANOUT))


def test_github_fanout_plans_fans_out_merges_and_verifies() -> None:
    jobs = load(FANOUT)["jobs"]
    assert {"plan", "cell", "merge", "verify"} <= set(jobs), set(jobs)
    # plan: the cells as a job output, from `matrix cells --json`.
    assert "cells" in jobs["plan"].get("outputs", {}), "plan exposes no cells output"
    assert any(
        split_path(a)[0] == ("matrix", "cells") and "--json" in a for a in _fanout_lines("plan")
    ), "plan does not run `artifactd matrix cells FILE --json`"
    # cell: one job per cell, straight from the plan's .include, on GPU runners.
    cell = jobs["cell"]
    assert _needs(cell.get("needs")) == ["plan"]
    include = cell["strategy"]["matrix"]["include"]
    assert re.fullmatch(r"\$\{\{\s*fromJSON\(needs\.plan\.outputs\.cells\)\s*\}\}", include)
    assert "gpu" in str(cell["runs-on"]), "cells need GPU runners"
    builds = [a for a in _fanout_lines("cell") if split_path(a)[0] == ("build",)]
    assert len(builds) == 1, builds
    assert _after(builds[0], "--cell") == EXPR  # ${{ matrix.index }}
    assert _after(builds[0], "--run-id") == EXPR  # ${{ github.run_id }}
    assert _after(builds[0], "--store")
    assert re.search(r"--cell \$\{\{\s*matrix\.index\s*\}\}", str(cell["steps"]))
    # merge after every cell, verify (on a GPU) after merge, promoting.
    assert _needs(jobs["merge"].get("needs")) == ["cell"]
    merges = [a for a in _fanout_lines("merge") if split_path(a)[0] == ("merge",)]
    assert merges and all(_after(a, "--run-id") == EXPR for a in merges)
    assert _needs(jobs["verify"].get("needs")) == ["merge"]
    assert "gpu" in str(jobs["verify"]["runs-on"]), "verify re-runs cells: GPU runner"
    verifies = [a for a in _fanout_lines("verify") if split_path(a)[0] == ("verify",)]
    assert verifies and all(_after(a, "--promote") for a in verifies)


# --------------------------------------------------------------------------
# Tests: every command line against --help
# --------------------------------------------------------------------------

ALL_INVOCATIONS = [*K8S_INVOCATIONS, *invocations(FANOUT)]


@pytest.mark.parametrize("inv", ALL_INVOCATIONS, ids=[inv.id for inv in ALL_INVOCATIONS])
def test_fanout_command_and_its_options_exist(inv: Invocation) -> None:
    code, text = run_help(inv.path)
    shown = " ".join(["artifactd", *inv.path, "--help"])
    assert code == 0, f"{shown} exited {code}: {text.strip()[-300:]}"
    missing = sorted(set(inv.options) - listed_options(text))
    assert not missing, f"{inv.id}: {shown} lists no {', '.join(missing)}"
