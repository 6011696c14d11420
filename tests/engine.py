"""A real container engine for the image-build tests: podman's Docker-compatible API.

The recipe is the one measured in ``docs/dev/podman-engine.md``: a private root
(its own containers.conf, storage.conf and registries.conf, given to the
service and the podman CLI through their environment only, never to this
process), runc with lowered ulimits, plain HTTP to loopback registries, and
``podman system reset -f`` before the root is removed, so that no overlay
mount outlives the session.

Fixtures (session-scoped: one service and one base image for every test):

* ``engine``: a running ``podman system service``; :class:`Engine` gives its
  ``base_url`` (for ``docker.DockerClient`` and ``artifactd image build
  --docker-host``) and :meth:`Engine.podman` to run the podman CLI against it.
* ``python_base``: a Debian bookworm root filesystem with ``python3`` and
  ``python3-venv``, built with mmdebstrap once and cached under
  ``.artifactd/cache/`` (keyed by the command line), imported into the engine
  and pushed to the session's loopback registry, so that it can be named by
  digest.

Missing tools fail the tests (naming ``scripts/setup.sh``), never skip them.
The module also serves the benches, which start an engine the same way.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from registry_server import RegistryServer

REPO = Path(__file__).resolve().parent.parent
#: Where built base root filesystems are kept between sessions (gitignored).
CACHE = REPO / ".artifactd" / "cache" / "python-base"
#: The smallest mmdebstrap run whose image still makes a venv (measured: see
#: dockerfiles/README.md): Essential packages only (no apt), python3 and its
#: venv module, without docs, man pages and translations.
MMDEBSTRAP = (
    "mmdebstrap",
    "--quiet",
    "--variant=essential",
    "--format=tar",
    "--include=python3,python3-venv",
    "--dpkgopt=path-exclude=/usr/share/doc/*",
    "--dpkgopt=path-exclude=/usr/share/man/*",
    "--dpkgopt=path-exclude=/usr/share/info/*",
    "--dpkgopt=path-exclude=/usr/share/locale/*",
    "bookworm",
)
#: The base's PATH (an imported rootfs has no environment of its own).
DEBIAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SETUP = "run scripts/setup.sh (apt-get install --no-install-recommends podman runc mmdebstrap)"


def require_tool(name: str) -> str:
    """The path of ``name``, or fail (not skip) the test: CI installs every tool."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: {SETUP}", pytrace=False)
    return path


def _conf(root: Path) -> dict[str, str]:
    """Write the private config files under ``root``; return the env that points at them."""
    cfg = root / "cfg"
    for sub in ("cfg/networks", "tmp/libpod", "tmp/var", "storage/root", "storage/runroot"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (cfg / "containers.conf").write_text(
        "[containers]\n"
        # The sandbox forbids raising the hard limits podman asks for by default.
        'default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]\n'
        'netns = "host"\n'
        "[engine]\n"
        'runtime = "runc"\n'
        f'tmp_dir = "{root}/tmp/libpod"\n'
        'events_logger = "file"\n'
        f'image_copy_tmp_dir = "{root}/tmp/var"\n'
        "[network]\n"
        f'network_config_dir = "{root}/cfg/networks"\n'
    )
    (cfg / "storage.conf").write_text(
        "[storage]\n"
        'driver = "overlay"\n'
        f'graphroot = "{root}/storage/root"\n'
        f'runroot = "{root}/storage/runroot"\n'
    )
    (cfg / "registries.conf").write_text(
        "unqualified-search-registries = []\n"
        "[[registry]]\n"
        # No port: every port of the loopback address (the test registry's is random).
        'location = "127.0.0.1"\n'
        "insecure = true\n"
    )
    return {
        "CONTAINERS_CONF": str(cfg / "containers.conf"),
        "CONTAINERS_STORAGE_CONF": str(cfg / "storage.conf"),
        "CONTAINERS_REGISTRIES_CONF": str(cfg / "registries.conf"),
        "TMPDIR": str(root / "tmp" / "var"),
    }


def mounts_under(root: Path) -> list[str]:
    """Mount points at or below ``root`` (from /proc/self/mountinfo)."""
    prefix = str(root)
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].replace("\\040", " ")
            if point == prefix or point.startswith(prefix + "/"):
                found.append(point)
    return found


@dataclass
class Engine:
    """A running podman API service in a private root."""

    root: Path
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None

    @property
    def socket(self) -> Path:
        """The service's unix socket."""
        return self.root / "podman.sock"

    @property
    def base_url(self) -> str:
        """The Docker API address: ``docker.DockerClient(base_url=...)``, ``DOCKER_HOST``."""
        return f"unix://{self.socket}"

    def podman(
        self, *args: str, check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        """Run the podman CLI on this engine's storage (its env, not this process's)."""
        proc = subprocess.run(
            ["podman", *args],
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)}: exit {proc.returncode}\n{proc.stderr}")
        return proc

    def start(self) -> None:
        """Start ``podman system service`` and wait until it answers ``/_ping``."""
        log = (self.root / "service.log").open("ab")
        self.process = subprocess.Popen(
            ["podman", "system", "service", "--time=0", self.base_url],
            env={**os.environ, **self.env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"podman system service exited {self.process.returncode}: "
                    f"{(self.root / 'service.log').read_text()[-2000:]}"
                )
            if self.socket.exists() and self.ping():
                return
            time.sleep(0.05)
        raise RuntimeError(f"podman system service did not answer on {self.socket}")

    def ping(self) -> bool:
        """Whether the service answers ``GET /_ping`` with ``OK``."""

        class _Conn(http.client.HTTPConnection):
            def connect(inner) -> None:  # noqa: N805 - the connection, not the engine
                inner.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                inner.sock.settimeout(2)
                inner.sock.connect(str(self.socket))

        conn = _Conn("localhost")
        try:
            conn.request("GET", "/_ping")
            return conn.getresponse().read() == b"OK"
        except OSError:
            return False
        finally:
            conn.close()

    def stop(self) -> None:
        """Reset the storage (unmounting it), stop the service, remove the root.

        Raises when a mount under the root survives: the next session must not
        find one.
        """
        try:
            self.podman("system", "reset", "-f", check=False, timeout=120)
        finally:
            if self.process is not None:
                self.process.send_signal(signal.SIGTERM)
                try:
                    self.process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
                self.process = None
        left = mounts_under(self.root)
        for point in sorted(left, reverse=True):
            subprocess.run(["umount", "-l", point], check=False, capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)
        if left:
            raise AssertionError(f"podman left mounts under {self.root}: {left}")


def start_engine(root: Path) -> Engine:
    """Write a private config under ``root`` and start the service there."""
    require_tool("podman")
    require_tool("runc")
    root.mkdir(parents=True, exist_ok=True)
    engine = Engine(root, _conf(root))
    engine.start()
    return engine


@pytest.fixture(scope="session")
def engine() -> Iterator[Engine]:
    """A podman Docker-API service for the whole session, in a private root."""
    # A short root of its own: the socket path must fit in sun_path (108 bytes).
    root = Path(tempfile.mkdtemp(prefix="artifactd-engine-"))
    eng = start_engine(root)
    try:
        yield eng
    finally:
        eng.stop()


# --------------------------------------------------------------------------
# The Python base image
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class PythonBase:
    """The bookworm+python3 base: in the engine (``local``) and in the registry."""

    local: str
    ref: str
    digest: str
    tar: Path
    #: Seconds spent on mmdebstrap (0 when the cached tar was used), import and push.
    built_s: float
    import_s: float
    push_s: float

    @property
    def pinned(self) -> str:
        """``HOST/REPO@sha256:...``: the base by digest."""
        return f"{self.ref.rsplit(':', 1)[0]}@{self.digest}"


def base_tar(cache: Path = CACHE) -> tuple[Path, float]:
    """The cached rootfs tar for :data:`MMDEBSTRAP`, built when missing; (path, build seconds)."""
    key = hashlib.sha256("\0".join(MMDEBSTRAP).encode()).hexdigest()[:16]
    tar = cache / f"bookworm-python3-{key}.tar"
    if tar.is_file():
        return tar, 0.0
    require_tool("mmdebstrap")
    cache.mkdir(parents=True, exist_ok=True)
    part = cache / f".{tar.stem}.{os.getpid()}.tar"  # a .tar name: mmdebstrap goes by it too
    t0 = time.monotonic()
    proc = subprocess.run(
        [*MMDEBSTRAP, str(part)], capture_output=True, text=True, timeout=900, check=False
    )
    if proc.returncode != 0:
        part.unlink(missing_ok=True)
        raise AssertionError(f"mmdebstrap failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    part.rename(tar)
    return tar, time.monotonic() - t0


def load_python_base(engine: Engine, registry: RegistryServer, repo: str) -> PythonBase:
    """Import the cached rootfs into ``engine`` and push it to ``registry`` as ``repo:bookworm``."""
    tar, built = base_tar()
    local = "localhost/artifactd-test/python-base:bookworm"
    t0 = time.monotonic()
    engine.podman(
        "import",
        *("--change", f"ENV PATH={DEBIAN_PATH}"),
        *("--change", 'CMD ["/bin/bash"]'),
        str(tar),
        local,
        timeout=600,
    )
    t1 = time.monotonic()
    ref = registry.ref(f"{repo}:bookworm")
    digest_file = engine.root / "base.digest"
    engine.podman("push", "--digestfile", str(digest_file), local, f"docker://{ref}", timeout=600)
    t2 = time.monotonic()
    return PythonBase(
        local=local,
        ref=ref,
        digest=digest_file.read_text().strip(),
        tar=tar,
        built_s=built,
        import_s=t1 - t0,
        push_s=t2 - t1,
    )


@pytest.fixture(scope="session")
def python_base(engine: Engine, registry: RegistryServer) -> PythonBase:
    """The bookworm+python3 base, in the engine and in the session's registry (by digest)."""
    return load_python_base(engine, registry, "base/python")
