"""A small pool of worker threads, and the thread primitives the restore path uses.

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

The primitives (:class:`Thread`, :class:`Condition`, :class:`Flag`,
:class:`Semaphore`) are :mod:`threading`'s, cut to what the restore calls and
built on the interpreter's own :mod:`_thread`, as :mod:`threading` builds
them: importing :mod:`threading` loads :mod:`functools`, :mod:`collections`
and :mod:`_weakrefset` (with Python 3.11, about a third of a bare start, at
every restore that installs). A :class:`Thread` is unknown to
:mod:`threading` (``threading.enumerate()`` does not list it), runs as a
daemon, and is always joined by its owner.
"""

from __future__ import annotations

import _thread

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections import deque
    from collections.abc import Callable, Iterable
    from typing import Generic, TypeVar

    T = TypeVar("T")
    R = TypeVar("R")
else:
    from _collections import deque  # collections' own: importing that package loads more

    class Generic:
        """typing's ``Generic`` at run time, where ``Job[R]`` is only ever an annotation."""

        def __class_getitem__(cls, _item: object) -> type:
            return cls

    R = None


class Thread:
    """Runs ``target()`` on a new thread from :meth:`start`; :meth:`join` waits for it.

    The target's exception, if any, is the interpreter's to report (every
    target here catches its own and hands it over).
    """

    def __init__(self, target: Callable[[], object], name: str) -> None:
        self.name = name
        self._target = target
        self._running = _thread.allocate_lock()
        self._started = False

    def start(self) -> None:
        """Start the thread (once)."""
        if self._started:
            raise RuntimeError(f"thread {self.name} started twice")
        self._started = True
        self._running.acquire()
        try:
            _thread.start_new_thread(self._run, ())
        except BaseException:
            self._running.release()
            raise

    def _run(self) -> None:
        try:
            self._target()
        finally:
            self._running.release()

    def join(self) -> None:
        """Wait until the target has returned (at once if it was never started)."""
        with self._running:
            pass


class Condition:
    """:class:`threading.Condition` on its own lock: ``with``, wait, wait_for, notify."""

    def __init__(self) -> None:
        self._lock = _thread.allocate_lock()
        self._waiters: deque[_thread.LockType] = deque()

    def __enter__(self) -> Condition:
        self._lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    def wait(self, timeout: float | None = None) -> bool:
        """Release the lock until notified (or ``timeout`` seconds); False when it timed out.

        Called with the lock held, which it holds again when it returns.
        """
        waiter = _thread.allocate_lock()
        waiter.acquire()
        self._waiters.append(waiter)
        self._lock.release()
        woken = False
        try:
            if timeout is None:
                woken = waiter.acquire()
            elif timeout > 0:
                woken = waiter.acquire(True, timeout)
            else:
                woken = waiter.acquire(False)
            return woken
        finally:
            self._lock.acquire()
            if not woken and waiter in self._waiters:  # else a notify took it meanwhile
                self._waiters.remove(waiter)

    def wait_for(self, predicate: Callable[[], object]) -> object:
        """Wait until ``predicate()`` is true; return its value."""
        result = predicate()
        while not result:
            self.wait()
            result = predicate()
        return result

    def notify(self, n: int = 1) -> None:
        """Wake up to ``n`` of the threads waiting (call with the lock held)."""
        waiters = self._waiters
        while waiters and n > 0:
            waiters.popleft().release()
            n -= 1

    def notify_all(self) -> None:
        """Wake every thread waiting (call with the lock held)."""
        self.notify(len(self._waiters))


class Flag:
    """:class:`threading.Event`: a flag threads wait for."""

    def __init__(self) -> None:
        self._cond = Condition()
        self._flag = False

    def is_set(self) -> bool:
        """Whether the flag is set."""
        return self._flag

    def set(self) -> None:
        """Set the flag; wake every waiter."""
        with self._cond:
            self._flag = True
            self._cond.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the flag is set (or ``timeout`` seconds pass); return the flag."""
        with self._cond:
            if not self._flag:
                self._cond.wait(timeout)
            return self._flag


class Semaphore:
    """:class:`threading.BoundedSemaphore`: at most ``value`` holders at once."""

    def __init__(self, value: int) -> None:
        self._cond = Condition()
        self._value = value
        self._initial = value

    def acquire(self) -> None:
        """Wait for a free place, and take it."""
        with self._cond:
            self._cond.wait_for(lambda: self._value > 0)
            self._value -= 1

    def release(self) -> None:
        """Give a place back; more releases than acquires raise ValueError."""
        with self._cond:
            if self._value >= self._initial:
                raise ValueError("semaphore released too many times")
            self._value += 1
            self._cond.notify()


class Job(Generic[R]):
    """One call handed to a :class:`Pool`: wait for its result with :meth:`result`."""

    def __init__(self, fn: Callable[[], R]) -> None:
        self._fn = fn
        self._done = Flag()
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
        self._ready = Condition()
        self._threads: list[Thread] = []
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
                thread = Thread(self._work, f"{self._name}-{len(self._threads)}")
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
