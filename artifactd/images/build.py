"""Build images with a container engine: the derived runtime image and the init image.

``artifactd image build --kind runtime|init`` renders a template of
``dockerfiles/`` (shipped in the wheel as ``artifactd/dockerfiles/``), prepares
its build context in a temp dir, and builds it through the Docker Engine API
(the docker SDK, an extra: ``pip install 'artifactd[docker]'``), which dockerd
and ``podman system service`` both serve:

* **runtime**: the base runtime image, always by digest (a tag is resolved on
  the registry first), plus the artifact as an OCI layout tagged
  ``fp-<hash>`` at ``/opt/prebuilt-cache/<hash>/``, with the labels and the
  ``ARTIFACTD_PREBUILT`` variable that ``image append`` writes. The same image
  ``image append`` writes without an engine, for registries or pipelines that
  want a ``docker build``.
* **init**: artifactd's core alone (no torch, no triton) in a venv on a
  Python base, installed from wheels in the context (built from the source
  checkout with ``pip wheel``, or given), running ``artifactd restore`` as a
  non-root user. The engine's build needs no network.

The build log streams as events; a failed build raises :class:`BuildError`
with the engine's message and the last lines of the log. ``push`` pushes the
built image and reports the registry's manifest digest; the push stream is
scanned for errors (the SDK does not raise on them).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import jinja2
import jinja2.meta
import requests

from artifactd.constants import DOCKER_HOST, current_environ
from artifactd.errors import BuildError, ConfigError, NotFoundError, StoreError, UsageError
from artifactd.events import EventSink, discard
from artifactd.images.append import write_layout
from artifactd.images.wheels import artifactd_version, default_source, pip_wheel
from artifactd.stores.artifacts import open_artifact
from artifactd.stores.credentials import check_unbound_pair
from artifactd.stores.reference import parse_registry_ref
from artifactd.stores.registry import IMAGE_ACCEPT, RegistryRef, RegistryStore
from artifactd.trust.policy import Basis, checked_basis

if TYPE_CHECKING:
    import docker

#: Which image is built: the engine's runtime image or the init container's.
ImageKind = Literal["runtime", "init"]
KINDS: tuple[ImageKind, ...] = ("runtime", "init")
TEMPLATES: dict[str, str] = {"runtime": "runtime.Dockerfile.j2", "init": "init.Dockerfile.j2"}
DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"
DOCKER_EXTRA = "pip install 'artifactd[docker]'"
#: Lines of the build log a failure reports.
LOG_TAIL = 30
#: The init image's user and group (numeric, no passwd entry; distroless's "nonroot").
INIT_UID = 65532
#: Every template value: no quotes, spaces, ``$`` or newlines can reach the Dockerfile.
_SAFE_VALUE = re.compile(r"^[A-Za-z0-9._:/@+,=-]*$")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_TAG_CHARS = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True)
class ImageBuildResult:
    """What ``image build`` built (and pushed)."""

    kind: str
    #: The engine's image ID (``sha256:...`` of the image config).
    image_id: str
    #: The names the image was tagged with, the push reference included.
    tags: tuple[str, ...]
    #: The image's size in bytes, as the engine's image inspect reports it.
    size: int
    #: The pushed manifest's digest (``--push``), else None.
    digest: str | None
    #: The reference pushed to, else None.
    pushed: str | None
    #: The base as given, and as the template's FROM names it.
    base: str
    base_ref: str
    base_digest: str | None
    #: runtime: the artifact baked in; None for init.
    fingerprint_hash: str | None
    artifact: str | None
    families: tuple[str, ...]
    #: init: the artifactd version installed (from its wheel); None for runtime.
    version: str | None
    #: The rendered Dockerfile.
    dockerfile: str
    seconds: float


# --------------------------------------------------------------------------
# Templates
# --------------------------------------------------------------------------


def template_text(kind: str) -> str:
    """Return the Jinja source of ``kind``'s template.

    From the installed package (``artifactd/dockerfiles/``, in a wheel), else
    from the source checkout's ``dockerfiles/`` (an editable install).
    """
    name = _template_name(kind)

    packaged = files("artifactd") / "dockerfiles" / name
    if packaged.is_file():
        return packaged.read_text(encoding="utf-8")
    checkout = Path(__file__).resolve().parents[2] / "dockerfiles" / name
    if checkout.is_file():
        return checkout.read_text(encoding="utf-8")
    raise ConfigError(
        f"the template {name} is missing from this installation",
        hint="reinstall artifactd (the wheel ships artifactd/dockerfiles/*.j2)",
    )


def _template_name(kind: str) -> str:
    try:
        return TEMPLATES[kind]
    except KeyError:
        raise UsageError(f"no image kind {kind!r}", hint=f"one of: {', '.join(KINDS)}") from None


def render_dockerfile(kind: str, **variables: str) -> str:
    """Render ``kind``'s Dockerfile template with ``variables``.

    Every variable the template uses must be given, and nothing else (a typo is
    an error, not an ignored value); undefined names raise rather than render
    empty (``StrictUndefined``). Values are limited to the characters of image
    references, digests and versions, so none can add a Dockerfile instruction.
    """
    name = _template_name(kind)
    env = jinja2.Environment(
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # noqa: S701 - a Dockerfile, not HTML; values are checked below
        keep_trailing_newline=True,
    )
    source = template_text(kind)
    try:
        needed = jinja2.meta.find_undeclared_variables(env.parse(source))
        template = env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(
            f"template {name} line {exc.lineno}: {exc.message}",
            hint="fix the template in dockerfiles/",
        ) from None
    missing, extra = sorted(needed - variables.keys()), sorted(variables.keys() - needed)
    if missing:
        raise UsageError(
            f"template {name} needs the variable(s) {', '.join(missing)}",
            hint=f"it takes: {', '.join(sorted(needed))}",
        )
    if extra:
        raise UsageError(
            f"template {name} has no variable(s) {', '.join(extra)}",
            hint=f"it takes: {', '.join(sorted(needed))}",
        )
    for key, value in variables.items():
        if not isinstance(value, str) or not _SAFE_VALUE.match(value):
            raise UsageError(
                f"template {name}: {key}={value!r} is not a plain reference, digest or version",
                hint="letters, digits and . _ : / @ + , = - only",
            )
    try:
        return template.render(**variables)
    except jinja2.UndefinedError as exc:  # a name the template reaches indirectly
        raise UsageError(
            f"template {name}: {exc.message}", hint="give every variable the template uses"
        ) from None


# --------------------------------------------------------------------------
# The build
# --------------------------------------------------------------------------


def docker_host(environ: Mapping[str, str] | None = None) -> str:
    """Return the engine's address: ``DOCKER_HOST``, else the local Docker socket."""
    env = current_environ() if environ is None else environ
    return env.get(DOCKER_HOST) or DEFAULT_DOCKER_HOST


def build_image(
    kind: str,
    *,
    base: str,
    artifact: str | None = None,
    tags: Iterable[str] = (),
    push: str | None = None,
    source: Path | None = None,
    wheels: Path | None = None,
    host: str | None = None,
    insecure: bool = False,
    trust: Basis | None = None,
    on_event: EventSink = discard,
) -> ImageBuildResult:
    """Build (and with ``push``, push) a ``runtime`` or ``init`` image; see the module doc.

    ``artifact`` (any store's ``STORE:TAG`` or ``STORE@sha256:...``) is for
    runtime only; ``source`` (a checkout to ``pip wheel``, default the one
    artifactd runs from) or ``wheels`` (a directory of prebuilt wheels) for
    init only. ``host`` is the engine's address (default :func:`docker_host`);
    ``insecure`` allows plain HTTP to the registries artifactd itself reads
    (the engine's own pushes follow its configuration). ``trust`` is what the
    artifact must verify under before it is baked (runtime only, required there:
    a :class:`~artifactd.trust.policy.TrustPolicy` or
    :data:`~artifactd.trust.policy.UNSAFE_NO_VERIFICATION`).
    """
    t0 = time.monotonic()
    _check_args(kind, artifact=artifact, source=source, wheels=wheels, push=push)
    # The engine pulls and pushes with its own credentials; these are the ones artifactd reads.
    check_unbound_pair([base, artifact, push])
    names = list(dict.fromkeys(tags))
    for name in [*names, *([push] if push else [])]:
        _split_name(name)
    client = _client(host)
    try:
        with tempfile.TemporaryDirectory(prefix="artifactd-image-") as tmp:
            work = Path(tmp)
            ctx = work / "context"
            ctx.mkdir()
            if kind == "runtime":
                job = _runtime_context(
                    base=base,
                    artifact=artifact or "",
                    ctx=ctx,
                    work=work,
                    insecure=insecure,
                    trust=checked_basis(trust, "build_image('runtime')"),
                    on_event=on_event,
                )
            else:
                job = _init_context(
                    base=base, ctx=ctx, work=work, source=source, wheels=wheels, on_event=on_event
                )
            if not names:
                names = [job.default_tag]
            dockerfile = render_dockerfile(kind, **job.variables)
            (ctx / "Dockerfile").write_text(dockerfile)
            on_event({"stage": "image", "event": "context", "kind": kind, "base": job.base_ref})
            image_id = _engine_build(client, ctx, names[0], kind, on_event)
        image = _get_image(client, image_id)
        for name in [*names[1:], *([push] if push else [])]:
            _tag(image, name)
        pushed_digest = _push(client, push, insecure, on_event) if push else None
        if job.base_digest is None:
            job.base_digest = _local_digest(client, base)
        size = int(image.attrs.get("Size") or 0)
    finally:
        client.close()
    on_event({"stage": "image", "event": "done", "image_id": image.id, "size": size})
    return ImageBuildResult(
        kind=kind,
        image_id=image.id,
        tags=tuple(dict.fromkeys([*names, *([push] if push else [])])),
        size=size,
        digest=pushed_digest,
        pushed=push,
        base=base,
        base_ref=job.base_ref,
        base_digest=job.base_digest,
        fingerprint_hash=job.fingerprint_hash,
        artifact=job.artifact,
        families=job.families,
        version=job.version,
        dockerfile=dockerfile,
        seconds=round(time.monotonic() - t0, 3),
    )


def _check_args(
    kind: str,
    *,
    artifact: str | None,
    source: Path | None,
    wheels: Path | None,
    push: str | None,
) -> None:
    """Refuse option combinations that cannot make sense, before anything runs."""
    _template_name(kind)
    if kind == "runtime" and not artifact:
        raise UsageError(
            "--kind runtime needs --artifact: the artifact to bake into the image",
            hint="e.g. --artifact registry:5000/ml/caches:fp-<hash> (any store, by tag or digest)",
        )
    if kind == "init" and artifact:
        raise UsageError(
            "--artifact is for --kind runtime: the init image holds no caches",
            hint="it restores them at pod start: artifactd restore --store ... --target /cache",
        )
    if kind == "runtime" and (source or wheels):
        raise UsageError(
            "--source and --wheels are for --kind init (the wheels it installs)",
            hint="a runtime image takes --base and --artifact",
        )
    if source and wheels:
        raise UsageError(
            "give --source (a checkout to build wheels from) or --wheels, not both",
            hint="--wheels DIR skips pip wheel; --source DIR builds them",
        )
    if push:
        ref = parse_registry_ref(push)
        if ref.reference is None or ref.reference.startswith("sha256:"):
            raise UsageError(
                f"--push {push!r} needs a tag: HOST/REPO:TAG",
                hint="e.g. --push registry:5000/ml/vllm:0.8-warm",
            )


def _split_name(name: str) -> tuple[str, str]:
    """``REPO[:TAG]`` as (repository, tag); the tag defaults to ``latest``."""
    if "@" in name or not name or any(c.isspace() for c in name):
        raise UsageError(
            f"not an image name: {name!r}", hint="use NAME[:TAG], e.g. registry:5000/ml/app:1"
        )
    slash, colon = name.rfind("/"), name.rfind(":")
    if colon > slash:
        return name[:colon], name[colon + 1 :]
    return name, "latest"


@dataclass
class _Job:
    """A prepared build: the template's variables and what the result reports."""

    variables: dict[str, str]
    default_tag: str
    base_ref: str
    base_digest: str | None
    fingerprint_hash: str | None = None
    artifact: str | None = None
    families: tuple[str, ...] = ()
    version: str | None = None


def _runtime_context(
    *,
    base: str,
    artifact: str,
    ctx: Path,
    work: Path,
    insecure: bool,
    trust: Basis,
    on_event: EventSink,
) -> _Job:
    """Resolve the base to a digest; write the artifact as ``ctx/prebuilt/`` (an OCI layout)."""
    base_ref, base_digest = resolve_base(base, insecure=insecure)
    on_event({"stage": "image", "event": "resolved", "base": base_ref})
    art = open_artifact(artifact, trust=trust, insecure=insecure)
    prebuilt = ctx / "prebuilt"
    write_layout(artifact, art, prebuilt, work, insecure)
    _normalize(prebuilt)
    fp_hash = art.config.fingerprint_hash
    families = tuple(sorted(r.family for r in art.config.layers))
    return _Job(
        variables={
            "base": base_ref,
            "fingerprint_hash": fp_hash,
            "artifact": art.digest,
            "families": ",".join(families),
            "image_digest": art.config.fingerprint.image.digest or "",
        },
        default_tag=f"artifactd-runtime:{fp_hash[:12]}",
        base_ref=base_ref,
        base_digest=base_digest,
        fingerprint_hash=fp_hash,
        artifact=art.digest,
        families=families,
    )


def resolve_base(base: str, *, insecure: bool = False) -> tuple[str, str]:
    """``HOST/REPO:TAG`` or ``HOST/REPO@sha256:...`` as (``HOST/REPO@sha256:...``, digest).

    A tag is looked up on the registry (the manifest it names, in any image
    format, its digest verified); a digest is taken as given.
    """
    ref = parse_registry_ref(base)
    if ref.reference is None:
        raise UsageError(
            f"--base {base!r} needs a tag or digest (HOST/REPO:TAG or HOST/REPO@sha256:...)",
            hint="the runtime image is built FROM its digest: name the image to start from",
        )
    if ref.reference.startswith("sha256:"):
        return f"{ref.store}@{ref.reference}", ref.reference
    store = RegistryStore(RegistryRef(ref.host, ref.repo), insecure=insecure)
    try:
        found = store.get_manifest(ref.reference, accept=IMAGE_ACCEPT)
    finally:
        store.close()
    if found is None:
        raise NotFoundError(
            f"{ref.store} has no image {ref.reference}",
            hint="push the base image first, or name it by digest",
        )
    return f"{ref.store}@{found.digest}", found.digest


def _normalize(root: Path) -> None:
    """Modes 0755 (directories) and 0644 (files), mtime 0: what ``image append`` writes."""
    for dirpath, _dirnames, filenames in os.walk(root):
        os.chmod(dirpath, 0o755)  # noqa: S103 - directories of an image layer: 0755
        for name in filenames:
            path = os.path.join(dirpath, name)
            os.chmod(path, 0o644)
            os.utime(path, (0, 0))
    for dirpath, _dirnames, _filenames in os.walk(root, topdown=False):
        os.utime(dirpath, (0, 0))


def _init_context(
    *,
    base: str,
    ctx: Path,
    work: Path,
    source: Path | None,
    wheels: Path | None,
    on_event: EventSink,
) -> _Job:
    """Put artifactd's wheel and its dependencies' into ``ctx/wheels/``."""
    if not _SAFE_VALUE.match(base):
        raise UsageError(
            f"--base {base!r} is not an image reference",
            hint="e.g. python:3.11-slim-bookworm or registry:5000/py@sha256:<hex>",
        )
    out = ctx / "wheels"
    out.mkdir()
    if wheels is not None:
        given = sorted(Path(wheels).glob("*.whl"))
        if not given:
            raise UsageError(
                f"--wheels {wheels}: no .whl files there",
                hint="pip wheel --wheel-dir DIR artifactd  (its dependencies come along)",
            )
        for whl in given:
            shutil.copy2(whl, out / whl.name)
    else:
        pip_wheel(source or default_source(), out, work, on_event)
    version = artifactd_version(out)
    base_digest = m.group(0) if (m := _DIGEST.search(base)) and "@" in base else None
    return _Job(
        variables={"base": base, "version": version},
        default_tag=f"artifactd-init:{_TAG_CHARS.sub('-', version)}",
        base_ref=base,
        base_digest=base_digest,
        version=version,
    )


# --------------------------------------------------------------------------
# The engine
# --------------------------------------------------------------------------


def _client(host: str | None) -> docker.DockerClient:
    """Return a client of the engine at ``host``, once it answered a ping.

    Without ``host``, the SDK's own reading of the environment: ``DOCKER_HOST``
    and, for a TCP engine with TLS (GitLab's ``docker:dind``),
    ``DOCKER_TLS_VERIFY`` and ``DOCKER_CERT_PATH``, as the docker CLI reads them.
    """
    try:
        # lazy: the docker SDK is optional (the docker extra)
        import docker  # noqa: PLC0415
        from docker import errors  # noqa: PLC0415
    except ImportError:
        raise UsageError(
            "image build needs the docker SDK, which is not installed", hint=DOCKER_EXTRA
        ) from None

    address = host or docker_host()
    try:
        if host:
            client = docker.DockerClient(base_url=host, timeout=600)
        else:
            client = docker.from_env(timeout=600)
        client.ping()
    except (errors.DockerException, requests.RequestException, OSError) as exc:
        raise StoreError(
            f"no container engine answers at {address}: {_one_line(exc)}",
            hint="start dockerd or `podman system service`, or point --docker-host / "
            "DOCKER_HOST at one",
        ) from None
    return client


def _one_line(exc: BaseException) -> str:
    """Return an exception's message as one line of at most 300 characters."""
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."


def _log_lines(chunk: Mapping[str, Any]) -> Iterator[str]:
    """Yield the log lines of a build or push stream chunk."""
    for key in ("stream", "status"):
        text = chunk.get(key)
        if isinstance(text, str):
            for line in text.splitlines():
                if line.strip():
                    yield line.rstrip()


def _engine_build(
    client: docker.DockerClient, ctx: Path, tag: str, kind: str, on_event: EventSink
) -> str:
    """Build ``ctx`` as ``tag``; return the image ID. Raise with the log's tail on failure."""
    from docker import errors  # noqa: PLC0415  # lazy: the docker extra, optional

    tail: deque[str] = deque(maxlen=LOG_TAIL)
    image_id: str | None = None
    error: str | None = None
    try:
        stream = client.api.build(
            path=str(ctx), tag=tag, rm=True, forcerm=True, decode=True, pull=False
        )
        for chunk in stream:
            for line in _log_lines(chunk):
                tail.append(line)
                on_event({"stage": "image", "event": "log", "line": line})
            if chunk.get("error"):
                detail = chunk.get("errorDetail") or {}
                error = str(detail.get("message") or chunk["error"]).strip()
            aux = chunk.get("aux")
            if isinstance(aux, dict) and isinstance(aux.get("ID"), str):
                image_id = aux["ID"]
    except (errors.DockerException, requests.RequestException) as exc:
        error = _one_line(exc)
    if error is None:
        if image_id is None:  # an engine that only logs it
            found = re.search(r"Successfully built ([0-9a-f]{12,64})", "\n".join(tail))
            image_id = found.group(1) if found else tag
        on_event({"stage": "image", "event": "built", "image_id": image_id, "tag": tag})
        return image_id
    hint = "every line of the build log is an event: --json prints them all on stderr"
    if kind == "init" and "matching distribution" in "\n".join(tail):
        hint = (
            "the wheels were built for this machine's Python: the base's python3 must be "
            "the same version, or pass --wheels built for it"
        )
    raise BuildError(
        f"the engine failed to build the {kind} image: {' '.join(error.split())[:500]}"
        + "".join(f"\n  | {line}" for line in tail),
        hint=hint,
    )


def _get_image(client: docker.DockerClient, image_id: str) -> Any:
    """Return the built image, inspected."""
    from docker import errors  # noqa: PLC0415  # lazy: the docker extra, optional

    try:
        return client.images.get(image_id)
    except (errors.DockerException, requests.RequestException) as exc:
        raise BuildError(
            f"the engine built {image_id} but cannot show it: {_one_line(exc)}"
        ) from None


def _tag(image: Any, name: str) -> None:
    """Give the built image one more name."""
    from docker import errors  # noqa: PLC0415  # lazy: the docker extra, optional

    repo, tag = _split_name(name)
    try:
        done = image.tag(repo, tag)
    except (errors.DockerException, requests.RequestException) as exc:
        raise BuildError(
            f"the engine refused the tag {name}: {_one_line(exc)}",
            hint="use NAME[:TAG]: lowercase letters, digits, . _ - and / for the name",
        ) from None
    if not done:
        raise BuildError(f"the engine refused the tag {name}", hint="use NAME[:TAG], lowercase")


def _push(client: docker.DockerClient, ref: str, insecure: bool, on_event: EventSink) -> str:
    """Push ``ref`` (tagged already); return the manifest digest the registry holds."""
    from docker import errors  # noqa: PLC0415  # lazy: the docker extra, optional

    repo, tag = _split_name(ref)
    digest: str | None = None
    try:
        for chunk in client.images.push(repo, tag=tag, stream=True, decode=True):
            if chunk.get("error"):
                detail = chunk.get("errorDetail") or {}
                message = " ".join(str(detail.get("message") or chunk["error"]).split())
                raise StoreError(
                    f"the engine failed to push {ref}: {message[:500]}",
                    hint="a plain-HTTP registry must be insecure in the engine's own "
                    "configuration (podman: registries.conf; dockerd: insecure-registries)",
                )
            for line in _log_lines(chunk):
                on_event({"stage": "image", "event": "push", "line": line})
                if found := re.search(r"digest: (sha256:[0-9a-f]{64})", line):
                    digest = found.group(1)
            aux = chunk.get("aux")
            if isinstance(aux, dict) and isinstance(aux.get("Digest"), str):
                digest = aux["Digest"]
    except (errors.DockerException, requests.RequestException) as exc:
        raise StoreError(
            f"the engine failed to push {ref}: {_one_line(exc)}",
            hint="check that the engine reaches the registry and holds its credentials",
        ) from None
    if digest is None:  # the engine did not say: ask the registry
        digest = resolve_base(ref, insecure=insecure)[1]
    on_event({"stage": "image", "event": "pushed", "ref": ref, "digest": digest})
    return digest


def _local_digest(client: docker.DockerClient, base: str) -> str | None:
    """Return the repo digest the engine records for ``base``, when it has one."""
    from docker import errors  # noqa: PLC0415  # lazy: the docker extra, optional

    repo = _split_name(base)[0] if "@" not in base else base.split("@", 1)[0]
    try:
        digests = client.images.get(base).attrs.get("RepoDigests") or []
    except (errors.DockerException, requests.RequestException):
        return None
    for entry in digests:  # docker.io/library/python@... for "python" too
        name, _, digest = str(entry).partition("@")
        if name == repo or name.endswith("/" + repo):
            return digest
    return None
