"""Where per-rank and per-file tasks run: processes on this machine, or a Dask cluster.

One seam for every command that runs one task per input (merge's two
phases, batch runs of compact, relink and attribute): a
:class:`concurrent.futures.Executor`, either a pool of forked processes
here (``-j N``) or ``dask.distributed``'s executor on a cluster
(``--dask ADDRESS`` or ``$STREAMTRACE_DASK``).  Tasks receive paths and
small options and return small facts and file names: trace data never goes
through the executor, so a cluster's scheduler carries kilobytes per rank.
On a cluster the tasks' files go to a fresh directory under ``--spool-dir``,
which every worker and this process must see (a shared filesystem), or, for
a command that can keep them as objects (merge), to a fresh prefix under a
bucket URL (:class:`~streamtrace.io.objectstore.RunStore`).  Before any task,
the workers are asked which streamtrace they run and whether they reach
that prefix, so a mismatched cluster is one line, not a task's traceback.

The range workers of one file (pass 1 by ranges, pass 2 by blocks) are not
tasks of this seam: they share the parent's memory by fork and stream
through ordered pipes, which a cluster cannot offer.

Every run has a directory of its own, made before any task starts: tasks
keep their files there (spools, parked state, fragments) and it is removed
whole at the end, so a run that stops for any reason (a task failing,
Ctrl-C or SIGTERM to this process or to its whole process group, a worker
killed) leaves nothing behind, whatever the command.  Local workers leave
signals to this process, which stops them at once (they are ended, not
waited for) before removing the directory.  A worker that dies mid-task
here stops the run; on a cluster it is Dask's to handle (it reschedules the
task on another worker).
"""
from __future__ import annotations

import gc
import multiprocessing
import os
import shutil
import struct
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, Executor, Future, InvalidStateError, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from importlib import metadata
from typing import Any, Callable, Iterator, NamedTuple, Sequence

from ..errors import TraceError
from ..io.objectstore import RunStore, reachable
from ..io.progress import BAR_INTERVAL, Progress, Share, Wanted
from ..io.scratch import check_local_spool_dir, spool_writes
from ..resources import forking, frozen_heap
from .jobs import die_with_parent
from .parallel import can_fork
from .parseproc import leave_signals_to_parent

DASK_ENVIRONMENT = "STREAMTRACE_DASK"
CONNECT_TIMEOUT = "30s"
REMOVE_ATTEMPTS = 50
_DONE = struct.Struct("<qq")  # a task's bytes and events done, in its progress file


def dask_address(address: str | None) -> str | None:
    """The scheduler to run on: ``address``, else ``$STREAMTRACE_DASK``, else None (this machine)."""
    return address or os.environ.get(DASK_ENVIRONMENT) or None


def shared_path(path: str) -> str:
    """A path as a worker elsewhere can open it: absolute (URLs and ``-`` as they are)."""
    if path == "-" or "://" in path:
        return path
    return os.path.abspath(path)


class TaskRunner:
    """Runs one function over many inputs, results handed back in input order.

    ``jobs`` processes on this machine (1: in this process, no executor), or
    the Dask cluster at ``dask``.  Use as a context manager: it holds the
    run's directory under ``spool_dir`` (:attr:`work_dir`, where tasks keep
    their files; removed at the end with whatever is in it) and, on a
    cluster, the client.  With ``objects`` (the command's tasks can keep
    their files as objects), a bucket URL as ``spool_dir`` on a cluster gives
    the run a prefix there instead (:attr:`store`; no :attr:`work_dir`).
    """

    def __init__(self, jobs: int, *, dask: str | None = None, spool_dir: str | None = None,
                 progress: Wanted = False, objects: bool = False) -> None:
        self.jobs = jobs
        self.address = dask_address(dask)
        self.spool_dir = spool_dir
        self.progress = progress
        self.objects = objects
        self.work_dir: str | None = None
        self.store: RunStore | None = None
        self._client: Any = None

    @property
    def distributed(self) -> bool:
        return self.address is not None

    @property
    def inline(self) -> bool:
        """Do the tasks run in this process, one after the other?"""
        return not self.distributed and self.jobs == 1

    def __enter__(self) -> "TaskRunner":
        bucket = self.spool_dir is not None and "://" in self.spool_dir
        if not self.distributed:
            check_local_spool_dir(self.spool_dir)
        if self.distributed:
            if self.spool_dir is None:
                raise TraceError("--dask needs --spool-dir: a directory that every worker and this process share, "
                                 "or (merge) a bucket URL")
            if bucket and not self.objects:
                raise TraceError(f"--spool-dir {self.spool_dir}: this command's tasks keep files; give a shared "
                                 "filesystem path (merge takes a bucket URL)")
            self._client = _connect(self.address)
        try:
            if bucket:
                self.store = RunStore.start(self.spool_dir)
            else:
                with spool_writes(self.spool_dir or tempfile.gettempdir()):
                    self.work_dir = tempfile.mkdtemp(prefix="streamtrace-run-", dir=self.spool_dir)
            if self._client is not None:
                _check_workers(self._client, self.address, self.store)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the cluster's client (its tasks end), then remove the run's
        files and objects: each step runs even when one before it fails."""
        client, self._client = self._client, None
        work_dir, self.work_dir = self.work_dir, None
        store, self.store = self.store, None
        try:
            if client is not None:
                client.close()
        finally:
            try:
                if work_dir is not None:
                    remove_tree(work_dir)
            finally:
                if store is not None:
                    store.remove()

    def ordered(self, function: Callable[..., Any], calls: Sequence[tuple], *, label: str,
                work: Work | None = None) -> Iterator[Any]:
        """``function(*call)`` for every call, yielded in the order of ``calls``.

        The tasks run concurrently; progress (``label: done/total``) follows
        them as they complete, and with ``work`` the bytes or events inside
        the running tasks too: each is then called with a ``progress=``
        keyword to report to.  When a task fails, or the caller stops
        early, or this process is interrupted, the other tasks are stopped
        (their files are the run directory's, removed with it).
        """
        measured = work is not None and self.progress is not False and (self.inline or self.work_dir is not None)
        meter = Progress(sum(work.amounts) if measured and work.unit == "bytes" else None, enabled=self.progress)
        try:
            if self.inline:
                for done, call in enumerate(calls):
                    share = work.share(meter, done, f"{label}: {done}/{len(calls)}") if measured else None
                    yield function(*call, progress=share) if measured else function(*call)
                    meter.count(label, done + 1, len(calls))
                return
            files = ([os.path.join(str(self.work_dir), f"progress-{label.replace(' ', '-')}-{n}") for n in range(len(calls))]
                     if measured else [""] * len(calls))  # (a run keeping its files in a bucket reports counts only)
            with self._executor(len(calls)) as executor:
                with forking():  # local workers are forked at the first submit
                    futures = [executor.submit(function, *call, progress=TaskMeter(path)) if measured
                               else executor.submit(function, *call) for call, path in zip(calls, files)]
                show = (lambda: work.show(meter, futures, files, label)) if measured else None
                yield from _in_order(futures, meter, label, show, min(BAR_INTERVAL, meter.interval))
        finally:
            meter.done()

    @contextmanager
    def _executor(self, tasks: int) -> Iterator[DaskExecutor | WorkerPool]:
        """The executor, stopped (its tasks ended, not waited for) when the block does not end normally."""
        executor = DaskExecutor(self._client) if self._client is not None else WorkerPool(min(self.jobs, tasks))
        try:
            yield executor
        except BaseException:
            executor.stop()
            raise
        finally:
            executor.shutdown(wait=self._client is None)


class WorkerPool(ProcessPoolExecutor):
    """Forked processes on this machine, which leave signals to this process
    and end with it; :meth:`stop` ends them at once."""

    def __init__(self, workers: int) -> None:
        forked = multiprocessing.get_context("fork") if can_fork() else None  # (not Python 3.14's forkserver)
        super().__init__(max_workers=workers, mp_context=forked, initializer=_start_worker, initargs=(os.getpid(),))

    def stop(self) -> None:
        """End every worker now; the futures of tasks not finished fail."""
        for process in list((self._processes or {}).values()):  # (Python 3.14 has terminate_workers for this)
            process.terminate()
        self.shutdown(wait=True)


def _start_worker(parent: int) -> None:
    leave_signals_to_parent()
    die_with_parent(parent)


class DaskExecutor(Executor):
    """``Client.submit`` behind the :class:`~concurrent.futures.Executor` interface.

    Each task gets a plain future, settled from Dask's callback thread when
    the task ends; ``shutdown(wait=False)`` cancels every task not ended, in
    one message to the scheduler.  (Dask's own ``get_executor`` logs
    tracebacks on the terminal for tasks cancelled while their results
    travel, which breaks the one-line error.)
    """

    def __init__(self, client: Any) -> None:
        self._client = client
        self._tasks: list[Any] = []  # Dask forgets a task whose future is dropped

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        task = self._client.submit(_on_worker, fn, *args, pure=False, **kwargs)  # new work, never a cached result
        self._tasks.append(task)
        future: Future = Future()
        task.add_done_callback(lambda ended: _settle(future, ended))
        return future

    def stop(self) -> None:
        """Cancel every task not ended (one that is running is abandoned to its worker)."""
        self.shutdown(wait=False)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Cancel every task not ended: the runner never waits for a cluster's tasks (see ``TaskRunner._executor``)."""
        self._client.cancel([task for task in self._tasks if not task.done()])
        self._tasks.clear()


def _on_worker(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """A task on a Dask worker, with the worker's own objects frozen: the
    task's collections (merge frees each rank's arrays with ``gc.collect``)
    then scan the task's objects, not the worker's large heap (0.2 s each)."""
    with frozen_heap():
        return function(*args, **kwargs)


def _settle(future: Future, task: Any) -> None:
    """Hand a finished Dask task's outcome to its plain future (unless cancelled meanwhile)."""
    if future.cancelled():
        return
    try:
        if task.status == "finished":
            outcome = task.result()
            settle = future.set_result
        elif task.status == "error":
            outcome = task.exception()
            settle = future.set_exception
        else:  # cancelled on the cluster's side (the client closing, a lost scheduler, someone's cancel): a
            # failure, not a cancelled plain future (wait() never counts one cancelled that way as done)
            outcome = TraceError("a task was cancelled on the cluster (its client closed, the scheduler was lost, "
                                 "or it was cancelled there)")
            settle = future.set_exception
    except BaseException as exc:  # the result could not be fetched
        outcome, settle = exc, future.set_exception
    try:
        settle(outcome)
    except InvalidStateError:  # cancelled while the outcome travelled
        pass


class Work(NamedTuple):
    """What the tasks of one :meth:`TaskRunner.ordered` call measure: bytes
    read (pass 1, ``amounts`` the inputs' sizes) or events written (pass 2,
    ``amounts`` each task's events), shown under ``label``."""

    label: str
    unit: str  # "bytes" or "events"
    amounts: Sequence[int]

    @staticmethod
    def reading(paths: Sequence[str]) -> Work | None:
        """Pass 1 over these inputs, measured in bytes; None when a size is
        not known before the reading (a URL, an archive's member)."""
        sizes = [os.path.getsize(path) if os.path.isfile(path) else None for path in paths]
        return None if None in sizes else Work("pass 1", "bytes", sizes)  # type: ignore[arg-type]

    def share(self, meter: Progress, task: int, note: str) -> Share:
        """Task ``task``'s part of ``meter``, run in this process after the ones before it."""
        before = sum(self.amounts[:task])
        return Share(meter, before if self.unit == "bytes" else 0, 0 if self.unit == "bytes" else before,
                     sum(self.amounts) if self.unit == "events" else None, note)

    def show(self, meter: Progress, futures: list[Future], files: list[str], label: str) -> None:
        """The tasks' progress files, added up: a finished task counts whole."""
        done_bytes = events = finished = 0
        for future, path, amount in zip(futures, files, self.amounts):
            task_bytes, task_events = TaskMeter.read(path)
            if future.done():
                finished += 1
                task_bytes, task_events = (amount, task_events) if self.unit == "bytes" else (0, amount)
            done_bytes, events = done_bytes + task_bytes, events + task_events
        total = sum(self.amounts)
        meter.update(self.label, done_bytes if self.unit == "bytes" else None, events,
                     total if self.unit == "events" else None, note=f"{label}: {finished}/{len(futures)}")


class TaskMeter:
    """A task's progress where the runner can read it: bytes and events done,
    in a small file of the run directory (a forked worker and a Dask worker
    alike; the runner shows the sum)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._next = 0.0
        self._last = (0, 0)

    def update(self, label: str, done_bytes: int | None, events: int, total_events: int | None = None) -> None:
        self._last = (done_bytes or 0, events)
        now = time.monotonic()
        if now >= self._next:
            self._next = now + BAR_INTERVAL
            self._write()

    def done(self) -> None:
        self._write()

    def _write(self) -> None:
        try:
            with open(self.path + ".new", "wb") as out:
                out.write(_DONE.pack(*self._last))
            os.replace(self.path + ".new", self.path)  # the reader sees the old numbers or the new, never half
        except OSError:  # progress never fails a task (the run directory may be going: the run is ending)
            pass

    @staticmethod
    def read(path: str) -> tuple[int, int]:
        try:
            with open(path, "rb") as done:
                return _DONE.unpack(done.read())
        except (OSError, struct.error):  # not written yet
            return 0, 0


def _in_order(futures: list[Future], meter: Progress, label: str,
              show: Callable[[], None] | None = None, every: float = BAR_INTERVAL) -> Iterator[Any]:
    """Results in submission order; the first failure (in that order) among
    the finished tasks stops the run without waiting for the others.
    Progress: ``show()`` while tasks run (if given, ``every`` seconds), and
    ``label: done/total`` up to the last task."""
    position = {future: n for n, future in enumerate(futures)}
    pending = set(futures)
    for future in futures:
        while not future.done():
            finished, pending = wait(pending, timeout=every if show else None, return_when=FIRST_COMPLETED)
            if show is not None:
                show()
            for failed in sorted(finished, key=position.__getitem__):
                if not failed.cancelled() and failed.exception() is not None:
                    _raise_failure(failed.exception())
        meter.count(label, sum(1 for each in futures if each.done()), len(futures))
        yield future.result()


def _raise_failure(failure: BaseException) -> None:
    if isinstance(failure, BrokenProcessPool):  # a worker killed (by a user, the OOM killer): no task's own error
        raise TraceError("a worker process stopped unexpectedly") from None
    if failure.__class__.__module__.split(".")[0] == "distributed":  # the cluster's, not the task's (KilledWorker:
        # a task whose workers kept dying, e.g. out of memory)
        raise TraceError(f"the cluster gave up on a task: {failure.__class__.__name__}: {failure}") from None
    raise failure


def remove_tree(path: str) -> None:
    """Remove a directory tasks write in (the run's, a staging one), with the files of abandoned tasks.

    A task still running may create a file while the tree is being removed
    (then its directory is not empty and stays); once the directory is
    gone, no task can create a file there any more.
    """
    for _ in range(REMOVE_ATTEMPTS):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            return
        time.sleep(0.1)


def _check_workers(client: Any, address: str, store: RunStore | None) -> None:
    """Refuse a cluster whose workers run another streamtrace (or none), or
    cannot reach the run's prefix, before any task fails there."""
    try:
        here = metadata.version("streamtrace")
    except metadata.PackageNotFoundError:  # this process runs a source tree, not an installation: nothing to compare
        here = None
    versions = {} if here is None else client.run(metadata.version, "streamtrace", on_error="return")
    for worker, version in versions.items():
        if isinstance(version, BaseException):
            raise TraceError(f"--dask {address}: the worker at {worker} has no streamtrace installed (this process "
                             f"runs {here}); install it on every worker")
        if version != here:
            raise TraceError(f"--dask {address}: the worker at {worker} runs streamtrace {version}, this process "
                             f"{here}; install one version everywhere")
    if store is None:
        return
    for worker, reason in client.run(reachable, store.url, on_error="return").items():
        if reason is not None:
            raise TraceError(f"--spool-dir {store.url.rsplit('/', 1)[0]}: the worker at {worker} cannot use it: "
                             f"{reason}")


def _connect(address: str) -> Any:
    try:
        from distributed import Client
    except ImportError:
        raise TraceError("--dask needs the 'dask' extra: pip install 'streamtrace[dask]'") from None
    collecting = gc.isenabled()
    gc.disable()  # (a Client that failed to start, finalized by the collector while this one starts, waits forever
    #                 on distributed's loop lock: found with two --dask runs in one process)
    try:
        return Client(address, timeout=CONNECT_TIMEOUT, set_as_default=False)
    except (OSError, TimeoutError) as exc:
        raise TraceError(f"--dask {address}: cannot reach the scheduler ({exc})") from None
    except (ValueError, AssertionError) as exc:  # Dask's words for an address it cannot parse
        raise TraceError(f"--dask {address}: not a scheduler address such as tcp://host:8786 "
                         f"({exc or 'bad port'})") from None
    finally:
        if collecting:
            gc.enable()
