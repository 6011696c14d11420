"""Pack a matrix's cells onto one node's GPUs, in a deterministic order.

Each cell needs ``cell.gpus`` devices (0 for a CPU-only cell). Cells start
strictly in index order: the next cell waits until it fits (enough free
devices, or a free CPU slot out of ``jobs``), and no later cell jumps ahead
of it, so two builds of one matrix start their cells in the same order. A
cell gets the first free devices in the node's order, as
``CUDA_VISIBLE_DEVICES`` spells them. The first failure stops new cells from starting; the cells
already running finish (their logs stay), then the failure is raised.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from artifactd.build.matrix import Cell
from artifactd.constants import CUDA_VISIBLE_DEVICES
from artifactd.errors import BuildError, UsageError
from artifactd.events import EventSink, discard
from artifactd.fingerprint.probe import probe_gpu_nvml

R = TypeVar("R")


def parse_gpus(spec: str) -> list[str]:
    """Parse ``--gpus 0,1,2,3`` into device ids; an empty string means no GPU."""
    devices = [d.strip() for d in spec.split(",") if d.strip()]
    if len(set(devices)) != len(devices) or not all(d.isdigit() for d in devices):
        raise UsageError(
            f"--gpus {spec!r} is not a list of distinct device numbers",
            hint="e.g. --gpus 0,1,2,3 (as CUDA_VISIBLE_DEVICES spells them)",
        )
    return devices


def node_devices(environ: Mapping[str, str]) -> list[str]:
    """Return the GPUs this node gives a build: ``CUDA_VISIBLE_DEVICES``, else all NVML sees."""
    visible = environ.get(CUDA_VISIBLE_DEVICES)
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip()]

    found = probe_gpu_nvml()
    count = int(found[0]["count"] or 0) if found is not None else 0
    return [str(i) for i in range(count)]


def check_fits(cells: Sequence[Cell], devices: Sequence[str]) -> None:
    """Refuse, before anything runs, a cell that needs more GPUs than the node has."""
    for cell in cells:
        if cell.gpus > len(devices):
            raise BuildError(
                f"cell {cell.id} needs {cell.gpus} GPU(s); this node has {len(devices)}"
                + (f" ({','.join(devices)})" if devices else ""),
                hint="run it on a bigger node (build --cell I there), or pass --gpus",
            )


def run_packed(
    cells: Sequence[Cell],
    devices: Sequence[str],
    run: Callable[[Cell, tuple[str, ...]], R],
    *,
    jobs: int = 1,
    on_event: EventSink = discard,
) -> list[R]:
    """Run ``run(cell, its devices)`` for every cell, as many at once as fit; results in order."""
    if jobs < 1:
        raise UsageError(f"--jobs {jobs}: at least 1")
    check_fits(cells, devices)
    cond = threading.Condition()
    rank = {device: i for i, device in enumerate(devices)}
    free = list(devices)
    cpu_busy = 0
    results: dict[int, R] = {}
    errors: list[BaseException] = []
    threads: list[threading.Thread] = []
    for cell in cells:
        on_event({"stage": "cell", "event": "queued", "cell": cell.id, "gpus": cell.gpus})

    def fits(cell: Cell) -> bool:
        return len(free) >= cell.gpus if cell.gpus else cpu_busy < jobs

    def worker(cell: Cell, taken: tuple[str, ...], start: float) -> None:
        nonlocal cpu_busy
        try:
            results[cell.index] = run(cell, taken)
            on_event(
                {
                    "stage": "cell",
                    "event": "done",
                    "cell": cell.id,
                    "elapsed_ms": round((time.monotonic() - start) * 1000, 1),
                }
            )
        except BaseException as exc:  # raised on the caller's thread below
            on_event({"stage": "cell", "event": "failed", "cell": cell.id})
            errors.append(exc)
        finally:
            with cond:
                if cell.gpus:
                    free.extend(taken)
                    free.sort(key=rank.__getitem__)
                else:
                    cpu_busy -= 1
                cond.notify_all()

    queued_at = time.monotonic()
    for cell in cells:
        with cond:
            cond.wait_for(lambda c=cell: bool(errors) or fits(c))  # type: ignore[misc]
            if errors:
                break
            taken: tuple[str, ...] = ()
            if cell.gpus:
                taken, free[:] = tuple(free[: cell.gpus]), free[cell.gpus :]
            else:
                cpu_busy += 1
        start = time.monotonic()
        # Said here, not by the worker: cells start in the order they were given.
        on_event(
            {
                "stage": "cell",
                "event": "start",
                "cell": cell.id,
                "devices": list(taken),
                "waited_ms": round((start - queued_at) * 1000, 1),
            }
        )
        thread = threading.Thread(
            target=worker, args=(cell, taken, start), name=f"cell-{cell.index}", daemon=True
        )
        threads.append(thread)
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return [results[c.index] for c in cells]
