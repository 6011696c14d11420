"""The restore's worker pool: order, errors, dropping what has not started, no thread left."""

from __future__ import annotations

import threading

import pytest

from artifactd.workers import Pool


def test_map_returns_results_in_order_on_at_most_n_threads() -> None:
    seen: set[str] = set()
    lock = threading.Lock()

    def work(i: int) -> int:
        with lock:
            seen.add(threading.current_thread().name)
        return i * i

    with Pool(3, "sq") as pool:
        assert pool.map(work, range(200)) == [i * i for i in range(200)]
    assert seen and len(seen) <= 3
    assert all(name.startswith("sq-") for name in seen)


def test_two_jobs_waiting_on_each_other_run_side_by_side() -> None:
    """A pool of two runs two jobs at once: each waits for the other to start."""
    both = threading.Barrier(2, timeout=60)
    with Pool(2) as pool:
        jobs = [pool.submit(both.wait) for _ in range(2)]
        assert sorted(job.result() for job in jobs) == [0, 1]


def test_an_error_reaches_the_caller_and_jobs_not_started_are_dropped() -> None:
    started, gate = threading.Event(), threading.Event()
    ran: list[int] = []

    def work(i: int) -> int:
        if i == 0:
            started.set()
            gate.wait(60)
            raise OSError(28, "No space left on device")
        ran.append(i)
        return i

    pool = Pool(1)
    first = pool.submit(work, 0)
    later = [pool.submit(work, i) for i in range(1, 5)]
    assert started.wait(60)  # the first job runs: only the later ones wait to be dropped
    pool.shutdown(wait=False, cancel_pending=True)
    gate.set()
    pool.shutdown(wait=True)
    with pytest.raises(OSError, match="No space left"):
        first.result()
    assert ran == []
    for job in later:
        with pytest.raises(RuntimeError, match="dropped"):
            job.result()
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(work, 9)


def test_map_raises_the_first_error_in_order_after_the_running_jobs_end() -> None:
    def work(i: int) -> int:
        if i in (3, 7):
            raise ValueError(f"bad {i}")
        return i

    with Pool(2) as pool, pytest.raises(ValueError, match="bad 3"):
        pool.map(work, range(10))


def test_no_thread_outlives_the_pool() -> None:
    before = set(threading.enumerate())
    with Pool(4, "gone") as pool:
        pool.map(lambda x: x, range(50))
    assert [t.name for t in set(threading.enumerate()) - before] == []


def test_a_pool_needs_a_worker() -> None:
    with pytest.raises(ValueError, match="at least one"):
        Pool(0)
