"""The options of the pod-start commands, declared once as data (no click here).

``fingerprint`` and ``restore`` run at every pod start and in probes, so they
must start fast, and importing click alone costs about as much as starting
Python. Their options are therefore declared here, as plain data, and read by
two parsers: :mod:`artifactd.cli.options` turns each :class:`Opt` into a click
option (the ``--help`` text, errors, and every unusual command line), and
:mod:`artifactd.cli.fast` parses the ordinary command lines of those two
commands without importing click, handing anything else to click. A test runs
both parsers over the same command lines and environments and requires the
same answers.
"""

from __future__ import annotations

from artifactd import bounds as B  # noqa: N812
from artifactd import constants as C  # noqa: N812
from artifactd.errors import UsageError
from artifactd.records import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Literal

#: Values a boolean may take, as click reads a flag's environment variable.
TRUE = frozenset({"1", "true", "t", "yes", "y", "on"})
FALSE = frozenset({"", "0", "false", "f", "no", "n", "off"})


class Opt(Record):
    """One long option: its flag, parameter name, help and how its value is read.

    ``kind`` is how a value is converted (``path``: a :class:`pathlib.Path`);
    a ``bound`` makes it a number, read and checked by
    :meth:`artifactd.bounds.Range.read` (out of range: exit 2, stating the
    range). ``multiple`` options collect every occurrence, and their
    environment variable holds several values separated by whitespace (as
    click reads it).
    """

    flag: str
    dest: str
    help: str
    envvar: str | None = None
    metavar: str | None = None
    is_flag: bool = False
    multiple: bool = False
    kind: Literal["str", "path"] = "str"
    default: str | None = None
    show_default: bool = False
    required: bool = False
    bound: B.Range | None = None


JSON = Opt(
    "--json", "as_json", "Print one JSON document instead of text.", C.ENV_JSON, is_flag=True
)
INSECURE = Opt(
    "--insecure",
    "insecure",
    "Allow plain HTTP to a registry off loopback (loopback registries always use it).",
    C.ENV_INSECURE,
    is_flag=True,
)
STORE = Opt(
    "--store",
    "store",
    "Store: oci:PATH (local OCI layout directory) or HOST[:PORT]/REPO (registry).",
    C.ENV_STORE,
    default=C.DEFAULT_STORE,
    show_default=True,
)
#: ``restore --store``: unset means the baked store for this fingerprint, else the local one.
RESTORE_STORE = Opt(
    "--store",
    "store",
    "Store: oci:PATH (local OCI layout directory) or HOST[:PORT]/REPO (registry). "
    "Default: the store baked into this image for this fingerprint "
    "(ARTIFACTD_PREBUILT/<hash>, /opt/prebuilt-cache/<hash>), else oci:.artifactd/store.",
    C.ENV_STORE,
)
FROM_DIR = Opt(
    "--from-dir",
    "from_dir",
    "Restore from this directory instead of a store: an artifact mounted as a "
    "Kubernetes image volume, or a derived image's /opt/prebuilt-cache (or its root).",
    C.ENV_FROM_DIR,
    metavar="PATH",
    kind="path",
)
NODE_STORE = Opt(
    "--node-store",
    "node_store",
    "A local OCI layout on the node's disk (oci:PATH, a hostPath): restore from it, and "
    "fetch into it first what it lacks (one pod per node fetches; the others wait, then read).",
    C.ENV_NODE_STORE,
    metavar="oci:PATH",
)
NODE_LINK = Opt(
    "--node-link",
    "node_link",
    "How a pod gets the node store's files: auto (a reflink where the filesystem can, else "
    "a hard link to the node store's read-only copy for files the family never writes, else "
    "a copy) or copy (a reflink or a copy: never the node store's own inode).",
    C.ENV_NODE_LINK,
    metavar="auto|copy",
    default="auto",
    show_default=True,
)
METRICS_FILE = Opt(
    "--metrics-file",
    "metrics_file",
    "Write Prometheus metrics here (node-exporter's textfile format, atomically).",
    C.ENV_METRICS_FILE,
    metavar="PATH",
    kind="path",
)
SOFTWARE_FROM = Opt(
    "--software-from",
    "software_from",
    "Take the runtime image's software fields (Python, libraries, compilers, CUDA, "
    "image digest) from this artifact's fingerprint (STORE:TAG): for an init image, "
    "which runs beside the runtime image and cannot see them. GPU, driver, CPU and "
    "workload are still this pod's.",
    C.ENV_SOFTWARE_FROM,
    metavar="REF",
)
VERIFY_KEY = Opt(
    "--verify-key",
    "verify_keys",
    "Install only manifests signed (cosign's key-based format) by one of these public "
    "keys: a PEM file, or env://NAME. Repeatable, for key rotation. Unsigned or wrongly "
    "signed: nothing is installed, exit 0 (14 with --require).",
    C.ENV_VERIFY_KEY,
    metavar="KEY",
    multiple=True,
)
MIRROR = Opt(
    "--mirror",
    "mirrors",
    "Pull content by digest through this mirror first (repeatable, in order; tags and "
    "signatures still come from the registry). Replaces the hosts.toml and registries.conf "
    "mirrors; see `artifactd mirrors REF`.",
    C.ENV_MIRRORS,
    metavar="URL",
    multiple=True,
)
HOSTS_DIR = Opt(
    "--hosts-dir",
    "hosts_dir",
    "containerd's hosts directory, read for <host>/hosts.toml mirrors "
    f"[default: {C.DEFAULT_HOSTS_DIR}].",
    C.ENV_HOSTS_DIR,
    metavar="DIR",
    kind="path",
)
REGISTRIES_CONF = Opt(
    "--registries-conf",
    "registries_conf",
    "registries.conf v2 file (its registries.conf.d beside it), read for mirrors when "
    f"no hosts.toml matches [default: {C.DEFAULT_REGISTRIES_CONF}].",
    C.ENV_REGISTRIES_CONF,
    metavar="PATH",
    kind="path",
)
#: Where a pull finds its mirrors (:mod:`artifactd.stores.mirrors`).
MIRRORS = (MIRROR, HOSTS_DIR, REGISTRIES_CONF)
SIGN_KEY = Opt(
    "--sign-key",
    "sign_key",
    "Sign every manifest published with this ECDSA P-256 private key (a PEM file, or "
    "env://NAME; encrypted keys read ARTIFACTD_KEY_PASSWORD), in cosign's format.",
    C.ENV_SIGN_KEY,
    metavar="KEY",
)
FAMILY = Opt(
    "--family",
    "families",
    "Only these families (repeatable or comma-separated). Default: all.",
    C.ENV_FAMILIES,
    metavar="NAME",
    multiple=True,
)
GPU_ARCH = Opt(
    "--gpu-arch",
    "gpu_arch",
    "Declared GPU target (sm_90a) for machines without that GPU.",
    C.ENV_GPU_ARCH,
    metavar="ARCH",
)
IMAGE_DIGEST = Opt(
    "--image-digest",
    "image_digest",
    "Digest of the runtime image the caches are for.",
    C.ENV_IMAGE_DIGEST,
    metavar="DIGEST",
)
SET = Opt(
    "--set",
    "overrides",
    "Override a fingerprint field, dotted as in the JSON Schema "
    "(gpu.arch=sm_100a, driver.version=575.51). Repeatable.",
    C.ENV_SET,
    metavar="PATH=VALUE",
    multiple=True,
)
WORKLOAD = Opt(
    "--workload",
    "workload",
    "Workload field (model, revision, dtype, tp...). Repeatable or comma-separated.",
    C.ENV_WORKLOAD,
    metavar="KEY=VALUE",
    multiple=True,
)
#: The options that shape the probed fingerprint, in ``--help`` order.
FINGERPRINT = (WORKLOAD, SET, IMAGE_DIGEST, GPU_ARCH)

HASH = Opt("--hash", "hash_only", "Print only the fingerprint hash.", is_flag=True)

TARGET = Opt(
    "--target",
    "target",
    "Cache volume to restore into; each family gets a subdirectory.",
    C.ENV_TARGET,
    kind="path",
    required=True,
)
ENV_FILE = Opt(
    "--env-file",
    "env_file",
    "Where to write KEY=VALUE lines for the engine [TARGET/artifactd.env].",
    C.ENV_ENV_FILE,
    kind="path",
)
CONSUMER_USER = Opt(
    "--consumer-user",
    "consumer_user",
    "User the engine runs as (names Inductor's header dir). Default: this user.",
    C.ENV_CONSUMER_USER,
    metavar="USER",
)
REQUIRE = Opt(
    "--require",
    "require",
    "Fail (exit 6 on a miss, or the failure's code) instead of exiting 0.",
    C.ENV_REQUIRE,
    is_flag=True,
)
DRY_RUN = Opt(
    "--dry-run",
    "dry_run",
    "Print the plan (per-family verdicts, bytes, dirs) and change nothing.",
    C.ENV_DRY_RUN,
    is_flag=True,
)
MAX_BYTES = Opt(
    "--max-bytes",
    "max_bytes",
    "Refuse to unpack more than SIZE (bytes, or 500M, 20G) into TARGET.",
    C.ENV_MAX_BYTES,
    metavar="SIZE",
    bound=B.SIZE,
)
LOCK_TIMEOUT = Opt(
    "--lock-timeout",
    "lock_timeout",
    "How long to wait for another restore into TARGET to finish, in seconds "
    "(0: do not wait) [600].",
    C.ENV_LOCK_TIMEOUT,
    metavar="SECONDS",
    bound=B.LOCK_TIMEOUT_S,
)

# The pod's side of ``predict`` and ``restore --predict`` (:mod:`artifactd.restore.predict`).
PREDICT = Opt(
    "--predict",
    "predict",
    "Before downloading, predict the engine's own compile-cache hit (vLLM) from the "
    "artifact's config and this pod (see `artifactd predict`): printed, in --json, an event.",
    C.ENV_PREDICT,
    is_flag=True,
)
GPU_NAME = Opt(
    "--gpu-name",
    "gpu_name",
    "The GPU's name (a node label such as nvidia.com/gpu.product); else NVML.",
    C.ENV_GPU_NAME,
    metavar="NAME",
)
MODEL_DIR = Opt(
    "--model-dir",
    "model_dir",
    "The model's local dir: its config.json gives the dtype when --dtype is auto.",
    C.ENV_MODEL_DIR,
    metavar="DIR",
    kind="path",
)
RELOCATE = Opt(
    "--relocate",
    "relocate",
    "OLD=NEW: where a build path (a venv, site-packages) lives in this image; a traced"
    " file found there is reported as moved.",
    C.ENV_RELOCATE,
    metavar="OLD=NEW",
    multiple=True,
)
ENGINE_FACTORS = Opt(
    "--engine-factors",
    "engine_factors",
    "A JSON file of whole factor groups the engine's image computed (config, compiler,"
    " or 0.33's config_hash, compiler_hash): compared whole instead of by leaf.",
    C.ENV_ENGINE_FACTORS,
    metavar="FILE",
    kind="path",
)
ENGINE_PYTHON = Opt(
    "--engine-python",
    "engine_python",
    "The engine's Python, where vLLM and torch are installed (default: the one running artifactd).",
    C.ENV_ENGINE_PYTHON,
    metavar="PATH",
)
ENGINE_ARGS = Opt(
    "--engine-args",
    "engine_args_text",
    "The engine's command line as one string, split as a shell would (for a pod's env:"
    " 'vllm serve /models/m --max-num-batched-tokens 8192').",
    C.ENV_ENGINE_ARGS,
    metavar="ARGS",
)
REQUIRE_HIT = Opt(
    "--require-hit",
    "require_hit",
    "Exit 17 unless the engine will hit (a predicted miss or an unknown); restore then"
    " installs nothing (there it implies --predict).",
    C.ENV_REQUIRE_HIT,
    is_flag=True,
)
#: What the pod gives a prediction, in ``--help`` order (``predict`` and ``restore``).
PREDICT_INPUTS = (
    GPU_NAME,
    MODEL_DIR,
    RELOCATE,
    ENGINE_FACTORS,
    ENGINE_PYTHON,
    ENGINE_ARGS,
    REQUIRE_HIT,
)

#: Every option of each pod-start command, in ``--help`` order.
COMMANDS: dict[str, tuple[Opt, ...]] = {
    "fingerprint": (*FINGERPRINT, JSON, HASH),
    "restore": (
        RESTORE_STORE,
        NODE_STORE,
        NODE_LINK,
        FROM_DIR,
        INSECURE,
        *MIRRORS,
        TARGET,
        FAMILY,
        *FINGERPRINT,
        SOFTWARE_FROM,
        VERIFY_KEY,
        ENV_FILE,
        CONSUMER_USER,
        REQUIRE,
        DRY_RUN,
        MAX_BYTES,
        LOCK_TIMEOUT,
        PREDICT,
        *PREDICT_INPUTS,
        METRICS_FILE,
        JSON,
    ),
}


# --------------------------------------------------------------------------
# Reading values
# --------------------------------------------------------------------------


def env_flag(name: str) -> bool:
    """Read a boolean environment variable strictly, as click reads ``--flag`` variables.

    Unset, empty, ``0``, ``false``, ``no``, ``off`` (and ``f``, ``n``) are off;
    ``1``, ``true``, ``yes``, ``on`` (and ``t``, ``y``) are on; anything else is
    a :class:`UsageError`.
    """
    raw = C.current_environ().get(name, "")
    value = raw.strip().lower()
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise UsageError(
        f"{name}={raw!r} is not a boolean",
        hint="use 1/true/yes/on or 0/false/no/off",
    )


def family_names(values: Sequence[str]) -> list[str] | None:
    """``--family`` values as a list of names, or None (every family) when none were given."""
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    return names or None
