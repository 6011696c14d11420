"""The env file a restore writes beside the caches: ``KEY=VALUE`` lines for the engine.

A restore writes it (:func:`render_env_file`: one variable a line, quoted only
when the value needs it, loadable by docker, systemd and ``set -a; . FILE``),
checks first that every value can be carried (:func:`check_env_text`), and
``artifactd exec`` and the tests read it back (:func:`parse_env_file`).
"""

from __future__ import annotations

from artifactd.errors import ConfigError, UsageError
from artifactd.fsutil import read_regular, utf8_argument

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path

#: An env file holds a few lines a restore wrote; a larger one is not read.
MAX_ENV_FILE = 1 << 20
#: What an env value may hold and be written unquoted (anything else is quoted).
_SAFE_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./:@%+=,-")


def parse_env_file(path: Path) -> dict[str, str]:
    """Read the ``KEY=VALUE`` lines of an env file a restore wrote (see :func:`render_env_file`).

    The file is opened as :func:`~artifactd.fsutil.read_regular` opens input
    (a FIFO or a device is refused at once, never waited on) and may hold at
    most :data:`MAX_ENV_FILE` bytes: an ``OSError`` otherwise, and a
    ``UnicodeError`` for bytes that are not UTF-8. A line that cannot become an
    environment variable (a NUL byte, no name before ``=``, unbalanced quotes)
    is a :class:`ConfigError` naming the line, never its content.
    """
    # lazy: only reading an env file needs it; a no-op restore never loads shlex
    import shlex  # noqa: PLC0415

    env: dict[str, str] = {}
    text = read_regular(path, MAX_ENV_FILE, follow=True).decode("utf-8")
    # Lines end at "\n" only, as for the shell: a value may hold other line breaks.
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, _, value = line.partition("=")
        key = key.strip()
        problem = (
            "holds a NUL byte"
            if "\0" in line
            else "has no variable name before '='"
            if not key
            else None
        )
        try:
            parts = shlex.split(value) if value else [""]
        except ValueError:
            problem = problem or "has unbalanced quotes"
        if problem is not None:
            raise ConfigError(
                f"env file {path} line {number} {problem}: not a KEY=VALUE line",
                hint="a restore writes this file; restore again, or fix or remove the file",
            )
        env[key] = parts[0] if parts else ""
    return env


def check_env_text(text: str, what: str) -> None:
    """Refuse text an env file cannot carry: it holds one variable a line, so no newline.

    A restore calls it on what ends up in env values (the target, the consumer
    user) before it creates anything, and :func:`render_env_file` on each value.
    The file is UTF-8 text, so a name with bytes that are not UTF-8 is refused too.
    """
    utf8_argument(text, what)
    if "\n" in text or "\0" in text:
        raise UsageError(
            f"{what} {text!r} holds a newline or NUL byte, which the env file cannot carry",
            hint="choose a path (and user name) without control characters",
        )


def render_env_file(env: dict[str, str]) -> str:
    """Render ``KEY=VALUE`` lines (quoted only when needed), for docker/systemd or ``set -a; .``."""
    lines = ["# Written by artifactd restore. Load with: set -a; . THIS_FILE; set +a"]
    for key in sorted(env):
        value = env[key]
        check_env_text(value, f"the env value for {key}")
        if not _SAFE_CHARS.issuperset(value):
            import shlex  # noqa: PLC0415  # only a value with shell syntax in it needs quoting

            value = shlex.quote(value)
        lines.append(f"{key}={value}")
    return "\n".join(lines) + "\n"
