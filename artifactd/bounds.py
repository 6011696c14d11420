"""The range of every number a user gives artifactd, and the one check of it.

A number from a user (a command-line option, the environment variable behind
it, a field of a warm-up matrix) is hostile until it is bounded. NaN compares
false with everything, so a check written as ``value < 0`` lets it through
(click's ``FloatRange`` did: ``prune --grace nan`` kept nothing); infinity and
``1e308`` pass a lower bound and then hang a loop or overflow a conversion.
So each number has a :class:`Range` here, stated once, and every reader goes
through it:

* the click option type :class:`artifactd.cli.options.Number`, for every
  numeric option and the ``ARTIFACTD_*`` variable behind it (out of range:
  exit 2, with the range in the message);
* the pod-start fast path (:mod:`artifactd.cli.fast`), which parses the same
  options without click and leaves a value out of range to click's error;
* the warm-up matrix schema (:mod:`artifactd.build.matrix`), whose pydantic
  fields take their bounds from :meth:`Range.field` (so the JSON Schema in
  ``registry-schema/`` shows them, and NaN and infinities are refused).

The docs' table "Bounds of every input" (docs/reference/bounds.md) lists these with the size and
count caps of the files and documents artifactd reads. Light on purpose: the
fast path imports this module at every pod start (nothing of the standard
library, not even ``math``: see :data:`artifactd.cli.fast.FLOOR`).
"""

from __future__ import annotations

from artifactd.records import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

#: Most cells a matrix may expand to (the product of its axes' lengths).
MAX_CELLS = 10_000
#: The default cap on a delta's files (bytes, unpacked): ``contribute`` and
#: ``absorb --max-bytes``. Here, not in :mod:`artifactd.pod.contribute`, so that the
#: command line reads it without loading what contributing needs.
DELTA_MAX_BYTES = 2 << 30

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}


def _finite(value: float) -> bool:
    """``math.isfinite``, without loading the ``math`` extension at every pod start."""
    return value - value == 0  # inf - inf and nan - nan are nan


class Range(Record):
    """A closed range of numbers (``lo_open``: ``lo`` itself excluded), finite at both ends.

    ``kind`` is how text is read: ``int`` (a whole number), ``float``, or
    ``size`` (bytes: a whole number, or with a binary unit, ``500M``,
    ``20G``, ``1.5GiB``; read as a whole number of bytes). ``unit`` names
    what is counted, for messages (``seconds``, ``GPUs``).
    """

    lo: float
    hi: float
    unit: str = ""
    kind: str = "float"
    lo_open: bool = False

    def span(self) -> str:
        """Return the ends in words: ``0 to 600``, ``more than 0, at most 1``."""
        lo, hi = self._show(self.lo), self._show(self.hi)
        return f"more than {lo}, at most {hi}" if self.lo_open else f"{lo} to {hi}"

    def describe(self) -> str:
        """Return the range in words, as every refusal states it."""
        what = {"int": "a whole number", "float": "a number", "size": "a size"}[self.kind]
        if self.unit:
            what += f" of {self.unit}"
        span = f"{what} {self.span()}" if self.lo_open else f"{what} from {self.span()}"
        if self.kind == "size":
            span += " (bytes, or with a unit: 500M, 20G)"
        return span

    def _show(self, value: float) -> str:
        """Show an end as a user types it: ``600``, ``0.5``, ``1P`` (a size in its largest unit)."""
        if self.kind == "size" and value:
            unit = next(u for u in reversed(_UNITS) if int(value) % _UNITS[u] == 0)
            return f"{int(value) // _UNITS[unit]}{unit}"
        return str(int(value)) if float(value).is_integer() else repr(float(value))

    def contains(self, value: float) -> bool:
        """Whether ``value`` is finite and in the range."""
        if not _finite(value):
            return False
        above = value > self.lo if self.lo_open else value >= self.lo
        return above and value <= self.hi

    def read(self, text: Any) -> Any:
        """Return ``text`` (or a number) read as the range's kind, or None when out of range.

        An ``int`` for ``int`` and ``size`` ranges, a ``float`` otherwise; None
        for anything that is not such a number, NaN, an infinity, or a value
        past either end.
        """
        value = self._number(text)
        if value is None or not self.contains(value):
            return None
        return int(value) if self.kind != "float" else float(value)

    def _number(self, text: Any) -> float | None:
        """Return the number ``text`` holds, as the range's kind reads it; None if none."""
        if isinstance(text, bool) or not isinstance(text, (int, float, str)):
            return None
        if not isinstance(text, str):
            whole = isinstance(text, int) or text.is_integer()
            return text if whole or self.kind == "float" else None
        word = text.strip()
        read: Callable[[str], float] = int if self.kind == "int" else _size
        if self.kind == "float":
            read = float
        try:
            return read(word)
        except (ValueError, OverflowError):
            return None

    def field(self) -> dict[str, Any]:
        """Return the range as pydantic ``Field`` keywords: its JSON Schema shows the bounds."""
        low = "gt" if self.lo_open else "ge"
        bounds: dict[str, Any] = {low: self.lo, "le": self.hi}
        if self.kind == "float":
            bounds["allow_inf_nan"] = False
        return bounds


def _size(word: str) -> float:
    """Bytes from ``500M``, ``20G``, ``1.5GiB`` or a plain count; ValueError when not a size."""
    value = word.upper().removesuffix("B").removesuffix("I")
    unit = value[-1:] if value[-1:] in _UNITS else ""
    number = float(value[: len(value) - len(unit)]) * _UNITS[unit]
    if _finite(number) and not number.is_integer():
        number = float(int(number))  # 1.5K is 1536 bytes; 0.3K rounds down
    return number


# --- the command line (and the variables behind it) ---------------------------
#: ``restore --lock-timeout`` / ``exec --lock-timeout`` (``ARTIFACTD_LOCK_TIMEOUT``).
LOCK_TIMEOUT_S = Range(0, 86_400, "seconds")
#: Every ``--max-bytes``: ``restore``, ``exec``, ``gc`` (``ARTIFACTD_MAX_BYTES``),
#: ``contribute``, ``absorb``. 1 PiB: far past any disk, short of float rounding.
SIZE = Range(0, 1 << 50, kind="size")
#: ``build --cell`` (``JOB_COMPLETION_INDEX``): an index into at most :data:`MAX_CELLS`.
CELL_INDEX = Range(0, MAX_CELLS - 1, kind="int")
#: ``build --jobs`` / ``verify --jobs``: CPU-only cells at once.
JOBS = Range(1, 256, "cells", kind="int")
#: ``matrix shapes --coverage``: the fraction of observed traffic to cover.
COVERAGE = Range(0, 1, lo_open=True)
#: ``matrix shapes --timeout``: how long one metrics URL may take.
SCRAPE_TIMEOUT_S = Range(0, 3_600, "seconds", lo_open=True)
#: ``status --prewarm-timeout``: every warm-up request together (an hour).
PREWARM_TIMEOUT_S = Range(0, 3_600, "seconds", lo_open=True)
#: ``gc --min-free``: percent of the node store's filesystem to keep free.
MIN_FREE_PCT = Range(0, 100, "percent")
#: ``node-features --max-labels``.
MAX_LABELS = Range(0, 1_024, "labels", kind="int")
#: ``prune --keep-last``: the newest artifacts kept per family.
KEEP_LAST = Range(0, 100_000, "artifacts", kind="int")
#: ``prune --older-than``: a century.
OLDER_THAN_DAYS = Range(0, 36_500, "days")
#: ``prune --grace``: a year.
GRACE_S = Range(0, 31_536_000, "seconds")

# --- mirror configuration (stores/mirrors.py): files read, never written -------
#: Largest ``hosts.toml`` or ``registries.conf`` (and each ``registries.conf.d`` file).
MAX_MIRROR_CONFIG_BYTES = 1 << 20
#: Most ``*.conf`` files read from ``registries.conf.d`` (the rest are named and skipped).
MAX_REGISTRIES_CONF_FILES = 64
#: Most ``[[registry]]`` tables of all the ``registries.conf`` files together.
MAX_REGISTRY_ENTRIES = 1_024
#: Most mirrors one reference may use (``--mirror``, hosts, registry mirrors).
MAX_MIRRORS = 16
#: Most ``[header]`` values sent to one mirror.
MAX_MIRROR_HEADERS = 32

# --- the warm-up matrix (build/matrix.py's schema) ---------------------------
#: ``gpus`` of a cell, given or rendered from a template.
GPUS_PER_CELL = Range(0, 256, "GPUs", kind="int")
#: ``timeout_s``: one cell's run (a week).
CELL_TIMEOUT_S = Range(0, 604_800, "seconds", lo_open=True)
#: ``check_tolerance``: a relative tolerance.
CHECK_TOLERANCE = Range(0, 1)
#: A number given as an axis value: a template's input, exact as a float.
AXIS_NUMBER = Range(-(10**15), 10**15)
#: ``serve.port``: cell i serves on port + i.
SERVE_PORT = Range(1024, 65_000, kind="int")
#: ``serve.ready_timeout_s``: a day.
READY_TIMEOUT_S = Range(0, 86_400, "seconds", lo_open=True)
#: ``serve.shutdown_grace_s``: between SIGTERM and SIGKILL.
SHUTDOWN_GRACE_S = Range(0, 3_600, "seconds")
#: ``serve.requests[].prompt_tokens[]``: words in one prompt (about one token each).
PROMPT_WORDS = Range(1, 1 << 21, "words", kind="int")
#: ``serve.requests[].max_tokens``: tokens generated per request.
MAX_TOKENS = Range(1, 1 << 21, "tokens", kind="int")
#: ``serve.requests[].concurrency``: requests in flight at once (one thread each;
#: vLLM's largest default ``max_num_seqs`` is 1024).
CONCURRENCY = Range(1, 1_024, "requests", kind="int")
#: ``serve.requests[].repeat``: times the whole group is sent (``matrix shapes``
#: sends its decode group once per request in flight).
REPEAT = Range(1, 1_024, kind="int")
#: Most prompt lengths in one request group.
MAX_PROMPT_LENGTHS = 256
#: Most request groups in ``serve.requests``.
MAX_REQUEST_GROUPS = 64

# --- the canary (``serve.canary`` of a matrix; format/canary.py's document) ----
#: ``serve.canary.count``: fixed prompts the engine's tokenizer turns into ids.
CANARY_COUNT = Range(1, 8, "prompts", kind="int")
#: ``serve.canary.tokens``: tokens generated per canary prompt (greedy).
CANARY_TOKENS = Range(1, 64, "tokens", kind="int")
#: ``serve.canary.top_k``: logprobs kept per generated token.
CANARY_TOP_K = Range(1, 20, kind="int")
#: ``serve.canary.precision``: decimal places the logprobs are rounded to before hashing.
CANARY_PRECISION = Range(0, 8, "decimal places", kind="int")
#: ``serve.canary.seed``: the fixed seed of every canary request.
CANARY_SEED = Range(0, 2**31 - 1, kind="int")
#: ``serve.canary.deadline_s``: the whole canary (every prompt), at build and at replay.
CANARY_DEADLINE_S = Range(0, 600, "seconds", lo_open=True)
#: ``serve.canary.match_rate``: the token match rate the tolerance check needs
#: (a replay on another GPU model, driver or engine version).
CANARY_MATCH_RATE = Range(0, 1, lo_open=True)
#: Most prompts in ``serve.canary.prompts``.
MAX_CANARY_PROMPTS = 8
#: Longest canary prompt, in characters.
MAX_CANARY_PROMPT_CHARS = 2048
#: Most prompt token ids a canary records per prompt.
MAX_CANARY_PROMPT_IDS = 4096
#: Largest canary document read (the restored ``canary.json``: a few KiB per serve cell), in bytes.
MAX_CANARY_BYTES = 16 << 20
#: Most files of one family the restore's record of load-rewritten files
#: (``TARGET/.artifactd/installed.json``, :mod:`artifactd.restore.installed`) holds.
MAX_INSTALLED_RECORD = 100_000
#: Largest such record read, in bytes.
MAX_INSTALLED_BYTES = 64 << 20
