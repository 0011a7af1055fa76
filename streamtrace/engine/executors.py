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

import multiprocessing
import os
import shutil
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, Executor, Future, InvalidStateError, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from importlib import metadata
from typing import Any, Callable, Iterator, Sequence

from ..errors import TraceError
from ..io.objectstore import RunStore, reachable
from ..io.progress import Progress
from ..io.scratch import spool_writes
from ..resources import forking, frozen_heap
from .jobs import die_with_parent
from .parallel import can_fork
from .parseproc import leave_signals_to_parent

DASK_ENVIRONMENT = "STREAMTRACE_DASK"
CONNECT_TIMEOUT = "30s"
REMOVE_ATTEMPTS = 50


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
                 progress: bool | None = False, objects: bool = False) -> None:
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
        if bucket and not self.distributed:
            raise TraceError(f"--spool-dir {self.spool_dir}: a bucket holds the spool of --dask runs only (merge, "
                             "analyze); here give a local directory")
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
        if self._client is not None:
            self._client.close()
            self._client = None
        if self.work_dir is not None:
            remove_tree(self.work_dir)
            self.work_dir = None
        if self.store is not None:
            self.store.remove()
            self.store = None

    def ordered(self, function: Callable[..., Any], calls: Sequence[tuple], *, label: str) -> Iterator[Any]:
        """``function(*call)`` for every call, yielded in the order of ``calls``.

        The tasks run concurrently; progress (``label: done/total``) follows
        them as they complete.  When a task fails, or the caller stops early,
        or this process is interrupted, the other tasks are stopped (their
        files are the run directory's, removed with it).
        """
        meter = Progress(None, enabled=self.progress)
        try:
            if self.inline:
                for done, call in enumerate(calls, 1):
                    yield function(*call)
                    meter.count(label, done, len(calls))
                return
            with self._executor(len(calls)) as executor:
                with forking():  # local workers are forked at the first submit
                    futures = [executor.submit(function, *call) for call in calls]
                yield from _in_order(futures, meter, label)
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
        if not wait or cancel_futures:
            self._client.cancel([task for task in self._tasks if not task.done()])
        else:
            from distributed import wait as wait_for_tasks

            wait_for_tasks(self._tasks)
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
        else:  # cancelled on the cluster's side (the client closing)
            future.cancel()
            return
    except BaseException as exc:  # the result could not be fetched
        outcome, settle = exc, future.set_exception
    try:
        settle(outcome)
    except InvalidStateError:  # cancelled while the outcome travelled
        pass


def _in_order(futures: list[Future], meter: Progress, label: str) -> Iterator[Any]:
    """Results in submission order; the first failure (in that order) among
    the finished tasks stops the run without waiting for the others."""
    position = {future: n for n, future in enumerate(futures)}
    pending = set(futures)
    for future in futures:
        while not future.done():
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            meter.count(label, len(futures) - len(pending), len(futures))
            for failed in sorted(finished, key=position.__getitem__):
                if not failed.cancelled() and failed.exception() is not None:
                    _raise_failure(failed.exception())
        yield future.result()


def _raise_failure(failure: BaseException) -> None:
    if isinstance(failure, BrokenProcessPool):  # a worker killed (by a user, the OOM killer): no task's own error
        raise TraceError("a worker process stopped unexpectedly") from None
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
    try:
        return Client(address, timeout=CONNECT_TIMEOUT, set_as_default=False)
    except (OSError, TimeoutError) as exc:
        raise TraceError(f"--dask {address}: cannot reach the scheduler ({exc})") from None
