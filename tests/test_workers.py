"""The restore's worker pool and thread primitives: order, errors, dropping, no thread left."""

from __future__ import annotations

import _thread
import threading
import time

import pytest

from artifactd.workers import Condition, Flag, Pool, Semaphore, Thread


def test_map_returns_results_in_order_on_at_most_n_threads() -> None:
    seen: set[int] = set()
    lock = threading.Lock()

    def work(i: int) -> int:
        with lock:
            seen.add(threading.get_ident())
        return i * i

    with Pool(3, "sq") as pool:
        assert pool.map(work, range(200)) == [i * i for i in range(200)]
        names = [t.name for t in pool._threads]
    assert seen and len(seen) <= 3
    assert threading.get_ident() not in seen  # on the pool's threads, not the caller's
    assert names == [f"sq-{i}" for i in range(len(names))]


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
    before = _thread._count()
    with Pool(4, "gone") as pool:
        pool.map(lambda x: x, range(50))
        threads = list(pool._threads)
    assert threads
    assert not any(t._running.locked() for t in threads)  # each one's work has returned
    # ...and the interpreter ends each thread right after (its count drops back).
    deadline = time.monotonic() + 60
    while _thread._count() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _thread._count() == before


def test_a_thread_joins_once_its_target_returns() -> None:
    gate, ran = threading.Event(), []

    def work() -> None:
        gate.wait(60)
        ran.append(1)

    thread = Thread(work, "t")
    thread.join()  # never started: nothing to wait for
    thread.start()
    with pytest.raises(RuntimeError, match="started twice"):
        thread.start()
    assert ran == []
    gate.set()
    thread.join()
    assert ran == [1]


def test_the_condition_wakes_a_waiter_and_times_out_without_one() -> None:
    cond, flag = Condition(), list[int]()
    with cond:
        assert cond.wait(0.01) is False  # nobody notifies: it times out, lock held again
        assert cond.wait(0) is False
        assert not cond._waiters
    thread = Thread(lambda: cond.wait_for(lambda: flag) and None, "w")
    with cond:
        thread.start()
    with cond:
        flag.append(1)
        cond.notify_all()
    thread.join()  # woken by the notify: join returns
    event = Flag()
    assert event.wait(0.01) is False
    event.set()
    assert event.is_set() and event.wait() is True


def test_the_semaphore_bounds_its_holders() -> None:
    sem = Semaphore(2)
    sem.acquire()
    sem.acquire()
    took = Flag()

    def take() -> None:
        sem.acquire()
        took.set()

    thread = Thread(take, "s")
    thread.start()
    assert not took.wait(0.05)  # both held: the third waits
    sem.release()
    thread.join()
    assert took.is_set()
    sem.release()
    sem.release()
    with pytest.raises(ValueError, match="too many"):
        sem.release()


def test_a_pool_needs_a_worker() -> None:
    with pytest.raises(ValueError, match="at least one"):
        Pool(0)
