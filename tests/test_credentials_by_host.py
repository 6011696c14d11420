"""Registry credentials go to the registry they belong to, and to no other.

Two real ``docker-registry`` servers on loopback, "staging" and "prod", each
behind htpasswd with its own user and password, and each behind a recording
proxy (tests/faultproxy.py) that logs every ``Authorization`` header it is
sent. The environment pair is bound to one of them with
``ARTIFACTD_REGISTRY_HOST``; the other's login is in a Docker config. Each
command that talks to both (``copy``, ``image append``, a restore through a
node store, ``build``) must send each registry its own pair only, and no
output may name a password. A token-auth registry (tests/token_server.py)
shows the same for the token realm, which is on another host than its
registry. A pair without a host still works for one registry, and is refused
(exit 2, before any request) by a command that talks to two.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cachetrees import build_caches, harvest_environ, make_generic_tree
from conftest import clean_env, run_artifactd
from faultproxy import FaultProxy
from images import make_base
from registry_server import RegistryServer, start_registry
from token_server import TokenServer, running_token_registry

from artifactd.errors import ConfigError
from artifactd.stores.credentials import (
    Credentials,
    bound_host,
    check_unbound_pair,
    find_credentials,
)

STAGING_USER, STAGING_PW = "staging-ci", "stag1ng-s3cret-AAA"
PROD_USER, PROD_PW = "prod-ci", "pr0d-s3cret-BBB"
TOKEN_USER, TOKEN_PW = "token-ci", "t0ken-s3cret-CCC"
SECRETS = (STAGING_PW, PROD_PW, TOKEN_PW)
HOST_VAR = "ARTIFACTD_REGISTRY_HOST"
USER_VAR, PASSWORD_VAR = "ARTIFACTD_REGISTRY_USERNAME", "ARTIFACTD_REGISTRY_PASSWORD"
TIMEOUT = 120


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def decoded(header: str) -> str:
    """A Basic header's ``user:password``, else the header itself."""
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        return header
    return base64.b64decode(value).decode(errors="replace")


@dataclass
class Guarded:
    """A registry with its own login, behind a proxy that records what it is sent."""

    registry: RegistryServer
    proxy: FaultProxy
    user: str
    password: str

    @property
    def host(self) -> str:
        return self.proxy.host

    def ref(self, repo: str) -> str:
        return self.proxy.ref(repo)

    def headers(self) -> list[str]:
        """Every Authorization header the registry was sent since the last reset."""
        return [r.authorization for r in self.proxy.records() if r.authorization]

    def env(self) -> dict[str, str]:
        """The environment pair, bound to this registry."""
        return {HOST_VAR: self.host, USER_VAR: self.user, PASSWORD_VAR: self.password}

    def login(self) -> tuple[str, str, str]:
        return self.host, self.user, self.password


def _guarded(tmp: Path, user: str, password: str) -> Iterator[Guarded]:
    server = start_registry(tmp, user=user, password=password)
    proxy = FaultProxy(server.host)
    try:
        yield Guarded(server, proxy, user, password)
    finally:
        proxy.close()
        server.stop()


@pytest.fixture(scope="module")
def staging(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guarded]:
    yield from _guarded(tmp_path_factory.mktemp("staging"), STAGING_USER, STAGING_PW)


@pytest.fixture(scope="module")
def prod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guarded]:
    yield from _guarded(tmp_path_factory.mktemp("prod"), PROD_USER, PROD_PW)


@pytest.fixture(scope="module")
def token_registry(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[TokenServer, RegistryServer]]:
    with running_token_registry(
        tmp_path_factory.mktemp("token"), user=TOKEN_USER, password=TOKEN_PW
    ) as pair:
        yield pair


def docker_config(tmp: Path, *logins: tuple[str, str, str]) -> dict[str, str]:
    """A Docker config holding ``(host, user, password)`` logins; the env that points at it."""
    home = tmp / "docker-config"
    home.mkdir(parents=True, exist_ok=True)
    auths = {
        host: {"auth": base64.b64encode(f"{user}:{pw}".encode()).decode()}
        for host, user, pw in logins
    }
    (home / "config.json").write_text(json.dumps({"auths": auths}))
    return {"DOCKER_CONFIG": str(home)}


def env_with(tmp: Path, *extra: dict[str, str], caches: bool = False) -> dict[str, str]:
    """A clean env with its own HOME (and no Docker login unless ``extra`` gives one)."""
    base: dict[str, str] = {"HOME": str(tmp / "home"), "DOCKER_CONFIG": str(tmp / "no-config")}
    if caches:
        made = (tmp / "caches").exists()
        base.update(harvest_environ(tmp / "caches") if made else build_caches(tmp / "caches"))
    for e in extra:
        base.update(e)
    return clean_env(base)


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    proc = run_artifactd(*args, env=env, timeout=TIMEOUT)
    for secret in SECRETS:
        assert secret not in proc.stdout + proc.stderr, "a password reached the output"
    assert "Traceback" not in proc.stderr and "this is a bug" not in proc.stderr, proc.stderr
    return proc


def cli_json(*args: str, env: dict[str, str]) -> dict[str, Any]:
    proc = cli(*args, "--json", env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return doc


def seed(tmp: Path, reg: Guarded, repo: str) -> str:
    """Harvest synthetic caches into ``reg`` (its own pair); the ``fp-`` artifact ref."""
    pushed = cli_json(
        "harvest", "--store", reg.ref(repo), env=env_with(tmp, reg.env(), caches=True)
    )
    tag = next(t for t in pushed["tags"] if t.startswith("fp-"))
    return f"{reg.ref(repo)}:{tag}"


def assert_only_own(reg: Guarded, *others: Guarded | str) -> None:
    """``reg`` was sent its own pair (at least once) and nothing of anyone else's."""
    sent = reg.headers()
    pairs = {decoded(h) for h in sent if h.lower().startswith("basic ")}
    assert pairs == {f"{reg.user}:{reg.password}"}, sorted(pairs)
    for other in others:
        secret = other if isinstance(other, str) else other.password
        assert not any(secret in decoded(h) or secret in h for h in sent), "another's password"


def reset(*regs: Guarded) -> None:
    for reg in regs:
        reg.proxy.reset_log()


# --------------------------------------------------------------------------
# copy, restore --node-store, image append, build: two registries, two pairs
# --------------------------------------------------------------------------


@pytest.mark.parametrize("env_side", ["source", "destination"])
def test_copy_sends_each_registry_its_own_pair_only(
    tmp_path: Path, staging: Guarded, prod: Guarded, env_side: str
) -> None:
    """Staging to prod: one pair from the environment (bound), the other from the Docker config."""
    repo = f"creds/copy-{env_side}"
    src = seed(tmp_path, staging, repo)
    reset(staging, prod)
    bound, logged_in = (staging, prod) if env_side == "source" else (prod, staging)
    env = env_with(tmp_path, bound.env(), docker_config(tmp_path, logged_in.login()))
    copied = cli_json("copy", staging.ref(repo), prod.ref(repo), env=env)
    assert copied["bytes_uploaded"] > 0
    assert_only_own(staging, prod)
    assert_only_own(prod, staging)
    tag = src.rpartition(":")[2]
    listing = cli_json("ls", prod.ref(repo), env=env_with(tmp_path, prod.env()))
    assert tag in listing["tags"]


def test_restore_through_a_node_store_sends_only_the_remote_registrys_pair(
    tmp_path: Path, staging: Guarded, prod: Guarded
) -> None:
    """The pair is bound to prod; the restore reads staging (its login in the Docker config)."""
    seed(tmp_path, staging, "creds/restore")
    reset(staging, prod)
    node = tmp_path / "node-store"
    env = env_with(tmp_path, prod.env(), docker_config(tmp_path, staging.login()), caches=True)
    restored = cli_json(
        "restore", "--store", staging.ref("creds/restore"), "--node-store", f"oci:{node}",
        "--target", str(tmp_path / "target"), env=env,
    )  # fmt: skip
    assert restored["cache_hit"] is True and restored["match"] == "full", restored
    assert any((tmp_path / "target").rglob("*.cubin"))
    assert any((node / "blobs" / "sha256").iterdir()), "the node store was not filled"
    assert_only_own(staging, prod)
    assert prod.proxy.log == [], "prod was never part of this restore"


def test_a_pair_without_a_host_still_serves_a_command_with_one_registry(
    tmp_path: Path, staging: Guarded
) -> None:
    """Backward compatible: USERNAME/PASSWORD alone, one registry (restore via a node store)."""
    seed(tmp_path, staging, "creds/unbound-one")
    reset(staging)
    unbound = {USER_VAR: STAGING_USER, PASSWORD_VAR: STAGING_PW}
    restored = cli_json(
        "restore", "--store", staging.ref("creds/unbound-one"), "--node-store",
        f"oci:{tmp_path / 'node'}", "--target", str(tmp_path / "target"),
        env=env_with(tmp_path, unbound, caches=True),
    )  # fmt: skip
    assert restored["cache_hit"] is True, restored
    assert_only_own(staging)


SKOPEO = shutil.which("skopeo")


@pytest.mark.skipif(SKOPEO is None, reason="skopeo not installed (scripts/setup.sh)")
def test_image_append_sends_the_artifacts_registry_and_the_images_registry_their_own_pairs(
    tmp_path: Path, staging: Guarded, prod: Guarded
) -> None:
    """The artifact is read from staging (env pair); the base and the result are in prod."""
    assert SKOPEO is not None
    harvest_env = env_with(
        tmp_path,
        staging.env(),
        {"ARTIFACTD_GENERIC_DIR": str(make_generic_tree(tmp_path / "g"))},
    )
    store = staging.ref("creds/append-caches")
    pushed = cli_json("harvest", "--store", store, "--family", "generic", env=harvest_env)
    artifact = f"{store}:fp-{pushed['fingerprint_hash']}"
    base = prod.ref("creds/runtime:1")
    push = subprocess.run(
        [SKOPEO, "copy", "--format", "oci", "--dest-tls-verify=false",
         f"--dest-creds={PROD_USER}:{PROD_PW}", f"oci:{make_base(tmp_path)}:base",
         f"docker://{base}"],
        capture_output=True, text=True, timeout=TIMEOUT, check=False,
    )  # fmt: skip
    assert push.returncode == 0, push.stderr
    reset(staging, prod)

    env = env_with(tmp_path, staging.env(), docker_config(tmp_path, prod.login()))
    appended = cli_json(
        "image", "append", "--base", base, "--artifact", artifact,
        "--to", prod.ref("creds/runtime:1-warm"), env=env,
    )  # fmt: skip
    assert appended["digest"].startswith("sha256:")
    assert_only_own(staging, prod)
    assert_only_own(prod, staging)


def _tiny_matrix(tmp: Path) -> Path:
    """A one-cell matrix whose command writes one generic-family file: no compiler needed."""
    writes = (
        "import os, pathlib; d = pathlib.Path(os.environ['ARTIFACTD_GENERIC_DIR']); "
        "d.mkdir(parents=True, exist_ok=True); (d / 'k.cubin').write_bytes(b'ELF creds')"
    )
    matrix = tmp / "m.yaml"
    matrix.write_text(
        "schema_version: 1\nname: creds\ntarget: {gpu_arch: sm_90a}\nfamilies: [generic]\n"
        "gpus: 0\n"
        f"command: {json.dumps(sys.executable + ' -c ' + json.dumps(writes))}\n"
    )
    return matrix


def test_build_pushes_with_the_stores_login_not_the_pair_bound_elsewhere(
    tmp_path: Path, staging: Guarded, prod: Guarded
) -> None:
    """The env pair belongs to staging; build pushes to prod with prod's Docker login."""
    reset(staging, prod)
    env = env_with(tmp_path, staging.env(), docker_config(tmp_path, prod.login()))
    built = cli_json(
        "build", str(_tiny_matrix(tmp_path)), "--store", prod.ref("creds/build"), env=env
    )
    assert built["harvest"]["bytes_uploaded"] > 0, built["harvest"]
    assert_only_own(prod, staging)
    assert staging.proxy.log == [], "staging was never part of this build"


# --------------------------------------------------------------------------
# A token realm on another host gets the challenging registry's pair only
# --------------------------------------------------------------------------


def _token_pairs(tokens: TokenServer, since: int) -> set[str]:
    return {decoded(r.authorization) for r in tokens.recorded()[since:] if r.authorization}


@pytest.mark.parametrize("token_login", ["environment", "docker-config"])
def test_token_realm_receives_only_its_registrys_pair(
    tmp_path: Path,
    token_registry: tuple[TokenServer, RegistryServer],
    prod: Guarded,
    token_login: str,
) -> None:
    """Copy between a Bearer-token registry and prod, each direction, each login source.

    The realm (another port: another host) is sent the token registry's pair,
    from the environment or from the Docker config, and never prod's.
    """
    tokens, registry = token_registry
    token_login_tuple = (registry.host, TOKEN_USER, TOKEN_PW)
    token_env = {HOST_VAR: registry.host, USER_VAR: TOKEN_USER, PASSWORD_VAR: TOKEN_PW}
    repo = f"creds/token-{token_login}"
    if token_login == "environment":
        # token registry -> prod: the env pair is the token registry's.
        cli_json(
            "harvest", "--store", registry.ref(repo), env=env_with(tmp_path, token_env, caches=True)
        )
        env = env_with(tmp_path, token_env, docker_config(tmp_path, prod.login()))
        src, dst = registry.ref(repo), prod.ref(repo)
    else:
        # prod -> token registry: the env pair is prod's; the token login is Docker's.
        seed(tmp_path, prod, repo)
        env = env_with(tmp_path, prod.env(), docker_config(tmp_path, token_login_tuple))
        src, dst = prod.ref(repo), registry.ref(repo)
    reset(prod)
    since = len(tokens.recorded())
    cli_json("copy", src, dst, env=env)
    asked = tokens.recorded()[since:]
    assert asked and all(r.status == 200 for r in asked), asked
    assert _token_pairs(tokens, since) == {f"{TOKEN_USER}:{TOKEN_PW}"}
    assert not any(PROD_PW in (r.authorization or "") for r in asked)
    assert_only_own(prod, TOKEN_PW)


# --------------------------------------------------------------------------
# A pair without a host, and a host that is not the registry's
# --------------------------------------------------------------------------


def _two_registry_commands(tmp: Path, staging: Guarded, prod: Guarded) -> dict[str, list[str]]:
    tag = "fp-" + "0" * 64
    software = ["--software-from", staging.ref(f"creds/unbound:{tag}")]
    node = ["--node-store", f"oci:{tmp / 'node'}"]
    return {
        "restore": [
            "restore",
            "--store",
            prod.ref("creds/unbound"),
            *software,
            *node,
            "--target",
            str(tmp / "target"),
        ],
        "prefetch": [
            "prefetch",
            "--store",
            prod.ref("creds/unbound"),
            *software,
            *node,
            "--gpu-arch",
            "sm_90a",
        ],
        "copy": ["copy", staging.ref("creds/unbound"), prod.ref("creds/unbound")],
        "diff": ["diff", staging.ref(f"creds/unbound:{tag}"), prod.ref(f"creds/unbound:{tag}")],
        "image append": [
            "image",
            "append",
            "--base",
            prod.ref("creds/runtime:1"),
            "--artifact",
            staging.ref(f"creds/unbound:{tag}"),
            "--to",
            prod.ref("creds/runtime:x"),
        ],
    }


@pytest.mark.parametrize("command", ["copy", "diff", "image append", "restore", "prefetch"])
def test_a_pair_without_a_host_is_refused_by_a_command_with_two_registries(
    tmp_path: Path, staging: Guarded, prod: Guarded, command: str
) -> None:
    """Which registry the pair is for is the user's to say: exit 2 before any request."""
    reset(staging, prod)
    unbound = {USER_VAR: STAGING_USER, PASSWORD_VAR: STAGING_PW}
    args = _two_registry_commands(tmp_path, staging, prod)[command]
    proc = cli(*args, env=env_with(tmp_path, unbound))
    assert proc.returncode == 2, proc.stderr
    first = proc.stderr.splitlines()[0]
    assert first.startswith("artifactd: error:") and HOST_VAR in first, proc.stderr
    assert staging.host in first and prod.host in first, proc.stderr
    assert staging.proxy.log == [] and prod.proxy.log == [], "a request went out"


def test_a_registry_the_pair_is_not_bound_to_gets_no_credentials(
    tmp_path: Path, staging: Guarded, prod: Guarded
) -> None:
    """Bound to staging, talking to prod with no login for it: prod is sent nothing, exit 3."""
    reset(staging, prod)
    proc = cli("ls", prod.ref("creds/anything"), env=env_with(tmp_path, staging.env()))
    assert proc.returncode == 3, proc.stderr
    assert "requires authentication" in proc.stderr and HOST_VAR in proc.stderr, proc.stderr
    assert prod.headers() == [], "prod was sent staging's pair"
    assert staging.proxy.log == []


@pytest.mark.parametrize("value", ["registry.example.com/team/caches", "a b", "user@host"])
def test_a_host_that_is_not_a_host_is_a_config_error(
    tmp_path: Path, staging: Guarded, value: str
) -> None:
    reset(staging)
    env = env_with(tmp_path, {**staging.env(), HOST_VAR: value})
    proc = cli("ls", staging.ref("creds/anything"), env=env)
    assert proc.returncode == 2, proc.stderr
    assert HOST_VAR in proc.stderr.splitlines()[0], proc.stderr
    assert staging.proxy.log == []


def test_the_bound_host_is_matched_as_references_spell_it(tmp_path: Path) -> None:
    """Case, a pasted scheme and a trailing slash aside; another host falls to Docker's login."""
    pair = {USER_VAR: "alice", PASSWORD_VAR: "pw-env", "DOCKER_CONFIG": str(tmp_path / "none")}
    for spelled in ("Reg.IO:5000", "https://reg.io:5000/", "docker://reg.io:5000"):
        env = {**pair, HOST_VAR: spelled}
        assert bound_host(env) == "reg.io:5000"
        assert find_credentials("reg.io:5000", env) == Credentials("alice", "pw-env")
        assert find_credentials("reg.io", env) is None
        assert find_credentials("other.io:5000", env) is None
    config = docker_config(tmp_path, ("other.io", "bob", "pw-docker"))
    env = {**pair, HOST_VAR: "reg.io:5000", **config}
    assert find_credentials("other.io", env) == Credentials("bob", "pw-docker")
    assert find_credentials("reg.io:5000", env) == Credentials("alice", "pw-env")
    # Without a host the pair is everyone's: one registry only.
    check_unbound_pair(["reg.io/a", "reg.io/b:t", "oci:/x/y:z", None], pair)
    with pytest.raises(ConfigError) as err:
        check_unbound_pair(["reg.io/a", "docker://other.io/b"], pair)
    assert "pw-env" not in str(err.value) and "other.io" in str(err.value)
    check_unbound_pair(["reg.io/a", "other.io/b"], {**pair, HOST_VAR: "reg.io"})
