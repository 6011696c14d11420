"""Run Debian's docker-registry (CNCF distribution) on a free loopback port.

The tests install nothing: `.ci/run` (scripts/setup.sh) installs the package,
and this module only writes a config bound to 127.0.0.1 (the Debian default
listens on every interface), starts the server with storage in a temp dir,
waits until it answers, and stops it by PID.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import bcrypt  # distribution's htpasswd accepts only bcrypt hashes

BINARY = "docker-registry"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RegistryServer:
    """A running registry: its address, storage dir and process."""

    host: str
    root: Path
    process: subprocess.Popen[bytes] | None
    config: Path
    log: Path
    user: str | None = None
    password: str | None = None

    def ref(self, repo: str) -> str:
        return f"{self.host}/{repo}"

    def blob_stored(self, digest: str) -> bool:
        """Whether the registry's own storage holds the blob (not via our client)."""
        algo, hexd = digest.split(":")
        data = self.root / "docker/registry/v2/blobs" / algo / hexd[:2] / hexd / "data"
        return data.is_file()

    def start(self) -> None:
        log = self.log.open("ab")
        self.process = subprocess.Popen(
            [BINARY, "serve", str(self.config)], stdout=log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{BINARY} exited: {self.log.read_text()[-2000:]}")
            try:
                urllib.request.urlopen(f"http://{self.host}/v2/", timeout=1)
                return
            except urllib.error.HTTPError:
                return  # 401 from an auth-enabled registry: it is up
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"{BINARY} did not answer on {self.host}")

    def kill(self) -> None:
        """Stop abruptly (SIGKILL): connections in flight are cut."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None


def start_registry(
    workdir: Path,
    *,
    user: str | None = None,
    password: str | None = None,
    auth: list[str] | None = None,
    delete: bool = True,
    proxy: str | None = None,
) -> RegistryServer:
    """Start a registry; with ``user``/``password`` and no ``auth``, behind htpasswd.

    ``delete=False`` refuses manifest deletes (405), distribution's own default.

    ``proxy`` (``HOST:PORT``) makes it a pull-through cache of that registry
    (``proxy: remoteurl:``): the mirror of the mirror tests.

    ``auth`` replaces the config's ``auth:`` section (its YAML lines), e.g. for
    a token-auth registry; ``user``/``password`` are then only recorded.
    """
    if shutil.which(BINARY) is None:
        raise RuntimeError(
            f"{BINARY} is not installed: run scripts/setup.sh (apt-get install docker-registry)"
        )
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    root = workdir / "storage"
    lines = [
        "version: 0.1",
        "log:",
        "  level: warn",
        "storage:",
        "  filesystem:",
        f"    rootdirectory: {root}",
        "  delete:",
        f"    enabled: {'true' if delete else 'false'}",
        "http:",
        f"  addr: 127.0.0.1:{port}",
    ]
    if proxy is not None:
        lines += ["proxy:", f"  remoteurl: http://{proxy}"]
    if auth is not None:
        lines += auth
    elif user and password:
        htpasswd = workdir / "htpasswd"
        hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
        htpasswd.write_text(f"{user}:{hashed}\n")
        lines += ["auth:", "  htpasswd:", "    realm: artifactd-test", f"    path: {htpasswd}"]
    config = workdir / "config.yml"
    config.write_text("\n".join(lines) + "\n")
    server = RegistryServer(
        f"127.0.0.1:{port}", root, None, config, workdir / "registry.log", user, password
    )
    server.start()
    return server
