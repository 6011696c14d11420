"""A small pool of worker threads, for the restore path.

:mod:`concurrent.futures` would do, but importing it loads :mod:`logging`
(and through it :mod:`traceback`, :mod:`string`, :mod:`textwrap`): about a
third of a bare Python start, paid by every init container that restores.
The restore needs only this much: run callables on at most N threads, get
each one's result (or its exception) back, wait for all, drop what has not
started.

:class:`Pool` starts a thread only when a job waits and every started thread
is busy, so a pool that runs one job costs one thread. Its threads are
daemons: a pool is always shut down by its owner (``with``, or
:meth:`Pool.shutdown` in a ``finally``); the flag only keeps a bug from
holding the process open.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Job(Generic[R]):
    """One call handed to a :class:`Pool`: wait for its result with :meth:`result`."""

    def __init__(self, fn: Callable[[], R]) -> None:
        self._fn = fn
        self._done = threading.Event()
        self._value: R | None = None
        self._error: BaseException | None = None
        self._cancelled = False

    def _run(self) -> None:
        try:
            self._value = self._fn()
        except BaseException as exc:  # handed to result(), on the caller's thread
            self._error = exc
        finally:
            self._done.set()

    def cancel(self) -> bool:
        """Drop the job if it has not started; return whether it was dropped."""
        if self._done.is_set():
            return False
        self._cancelled = True
        return True

    def result(self) -> R:
        """Wait for the call; return its value or raise its exception."""
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]  # set by _run before _done


class Pool:
    """At most ``workers`` threads named ``name-N`` running the jobs submitted, in order."""

    def __init__(self, workers: int, name: str = "worker") -> None:
        if workers < 1:
            raise ValueError(f"a pool needs at least one worker, not {workers}")
        self._workers = workers
        self._name = name
        self._jobs: deque[Job[object]] = deque()
        self._ready = threading.Condition(threading.Lock())
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._closed = False

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown(wait=True)

    def submit(self, fn: Callable[..., R], *args: object) -> Job[R]:
        """Queue ``fn(*args)``; return its :class:`Job`."""
        job: Job[R] = Job(lambda: fn(*args))
        with self._ready:
            if self._closed:
                raise RuntimeError("submit to a pool that was shut down")
            self._jobs.append(job)  # type: ignore[arg-type]  # the queue holds any result type
            if self._idle:
                self._ready.notify()
            if len(self._jobs) > self._idle and len(self._threads) < self._workers:
                thread = threading.Thread(
                    target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
        return job

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """Return ``[fn(x) for x in items]``, run on the pool; raise the first error, in order.

        On an error, jobs not yet started are dropped and the running ones
        are waited for before it is raised.
        """
        jobs = [self.submit(fn, item) for item in items]
        try:
            return [job.result() for job in jobs]
        except BaseException:
            for job in jobs:
                job.cancel()
            for job in jobs:
                job._done.wait()
            raise

    def shutdown(self, *, wait: bool = True, cancel_pending: bool = False) -> None:
        """Take no more jobs; ``cancel_pending``: drop those not started; ``wait``: join."""
        with self._ready:
            self._closed = True
            if cancel_pending:
                for job in self._jobs:
                    job.cancel()
            self._ready.notify_all()
        if wait:
            for thread in self._threads:
                thread.join()

    def _work(self) -> None:
        while True:
            with self._ready:
                while not self._jobs and not self._closed:
                    self._idle += 1
                    self._ready.wait()
                    self._idle -= 1
                if not self._jobs:
                    return  # closed and drained
                job = self._jobs.popleft()
            if job._cancelled:
                job._error = RuntimeError("the job was dropped before it ran")
                job._done.set()
            else:
                job._run()
