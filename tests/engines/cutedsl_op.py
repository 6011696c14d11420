"""One CuTe DSL kernel, compiled by the DSL's own JIT: the producer of the ``cutedsl`` tests.

Run as ``python cutedsl_op.py``; it prints one JSON line last:
``{"cutedsl_op": {"module_hash", "file_cache", "arch", "launch", "dsl_site",
"load_failures"}}``.

The kernel is one op (each thread adds ``step`` to its index and prints only
when the sum passes ``limit``, which it never does for the launch below), and
it touches no memory, so launching it is harmless on a real GPU. The call
goes through ``@cute.jit`` (not ``cute.compile``, which never uses the file
cache in nvidia-cutlass-dsl 4.8.1: it passes ``no_cache=True``), so the DSL
looks the module up in its file cache and writes ``cute_dsl_<hash>.mlir``
there on a miss, all before it launches.

``file_cache`` is what the DSL itself logged: ``hit`` for its "JIT cache hit
IN-FILE" line, ``miss`` for "JIT cache miss"; ``load_failures`` counts its
"failed with loading generated IR cache" warnings (a file it found and
discarded, such as one failing its CRC32). ``launch`` is ``ok``, or the
name of the CUDA error the launch raised: on a machine without a driver
(``cudaErrorInsufficientDriver``) the compile and the cache write happen and
only the launch fails, which is what the tests expect there. ``dsl_site`` is
the dir holding ``nvidia_cutlass_dsl``, where the runtime library whose path
the DSL keys on lies.

The DSL may live outside site-packages (``pip install --target DIR``): its
``.pth`` file, which puts ``cutlass`` on the path, is then read by
:func:`site.addsitedir` from the dir that holds ``nvidia_cutlass_dsl``.
"""

# No `from __future__ import annotations`: the DSL evaluates the kernels' annotations.
import importlib.util
import json
import logging
import os
import re
import site
import sys
from typing import Any

from cutlass import cute
from cutlass.base_dsl.common import DSLCudaRuntimeError


def dsl_site() -> str | None:
    """Return the dir holding ``nvidia_cutlass_dsl`` (the DSL's site dir), or None."""
    spec = importlib.util.find_spec("nvidia_cutlass_dsl")
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.dirname(os.path.abspath(next(iter(spec.submodule_search_locations))))


class _DSLLog(logging.Handler):
    """Keeps the DSL's own cache lines: the evidence of a hit or a miss."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.hits: list[str] = []
        self.misses: list[str] = []
        self.load_failures: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except (TypeError, ValueError):
            # The DSL's "failed with loading generated IR cache" warning passes the
            # exception as an argument without a placeholder: keep the bare message.
            text = str(record.msg)
        if "failed with loading generated IR cache" in text:
            self.load_failures.append(text)
        found = re.search(r"module_hash=\[([0-9a-f]+)\]", text)
        if found and "JIT cache hit IN-FILE" in text:
            self.hits.append(found.group(1))
        elif found and "JIT cache miss" in text:
            self.misses.append(found.group(1))


def main() -> dict[str, Any]:
    """Compile and call the kernel once; return what the DSL did."""
    try:
        # lazy: CuTe DSL is optional (the producers extra)
        import cutlass  # noqa: PLC0415
    except ImportError:
        where = dsl_site()
        if where is None:
            raise
        site.addsitedir(where)
        # lazy: CuTe DSL is optional (the producers extra)
        import cutlass  # noqa: PLC0415

    # The DSL's logger is named after its env prefix and is off unless asked for.
    logger = logging.getLogger("CUTE_DSL")
    logger.setLevel(logging.INFO)
    seen = _DSLLog()
    logger.addHandler(seen)

    @cute.kernel  # type: ignore[untyped-decorator]
    def step_kernel(step: cutlass.Int32, limit: cutlass.Int32) -> None:
        tidx, _, _ = cute.arch.thread_idx()
        if tidx + step > limit:
            cute.printf("thread %d passed %d\n", tidx + step, limit)

    @cute.jit  # type: ignore[untyped-decorator]
    def step_all(step: cutlass.Int32, limit: cutlass.Int32) -> None:
        step_kernel(step, limit).launch(grid=(1, 1, 1), block=(32, 1, 1))

    launch = "ok"
    try:
        step_all(cutlass.Int32(1), cutlass.Int32(1 << 20))
    except DSLCudaRuntimeError as exc:
        named = re.search(r"\b(cuda[A-Za-z]+|CUDA_ERROR_[A-Z_]+)\b", str(exc))
        launch = named.group(1) if named else type(exc).__name__
    hashes = seen.hits + seen.misses
    return {
        "module_hash": hashes[0] if len(hashes) == 1 else None,
        "file_cache": "hit" if seen.hits and not seen.misses else "miss",
        "arch": os.environ.get("CUTE_DSL_ARCH"),
        "launch": launch,
        "dsl_site": dsl_site(),
        "load_failures": len(seen.load_failures),
    }


if __name__ == "__main__":
    report = main()
    sys.stdout.write(json.dumps({"cutedsl_op": report}) + "\n")
