"""Shared fixtures: clean environments and synthetic cache trees in real layouts."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from registry_server import RegistryServer, start_registry

from artifactd.constants import CACHE_ENV_VARS
from artifactd.fingerprint import Fingerprint, probe

REPO = Path(__file__).resolve().parent.parent
DEMO_MATRIX = REPO / "warmup_matrices" / "cpu-demo.yaml"
WARMUP = REPO / "warmup_matrices" / "cpu-demo" / "warmup.py"
PYTHON = sys.executable


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The test process's env without any cache variable, plus ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in CACHE_ENV_VARS
        and k not in ("TORCHINDUCTOR_CACHE_DIR", "TMPDIR")
        and not k.startswith("ARTIFACTD_")
    }
    env.update(extra or {})
    return env


@pytest.fixture(scope="session")
def local_fp() -> Fingerprint:
    """This machine's fingerprint with the demo's declared target."""
    return probe(gpu_arch="sm_90a", use_nvml=False)


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryServer]:
    """A real CNCF distribution registry on a free loopback port, for the whole session."""
    server = start_registry(tmp_path_factory.mktemp("registry"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def auth_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryServer]:
    """The same registry with htpasswd (bcrypt) basic auth."""
    server = start_registry(
        tmp_path_factory.mktemp("auth-registry"), user="ci", password="s3cret-pw"
    )
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def repo(request: pytest.FixtureRequest) -> str:
    """A repository name of its own for each test."""
    name = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:60].strip("-")
    return f"t/{name}"
