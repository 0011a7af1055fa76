"""How the task runner ends: a cluster's cancelled or abandoned task is a
one-line failure (never a hang or a traceback), and the run's files are
removed whatever fails on the way out.  Fake cluster objects stand in for
Dask here; tests/test_cluster.py runs the real one."""
from __future__ import annotations

import threading
from concurrent.futures import Future, wait

import pytest

from streamtrace.engine import executors
from streamtrace.engine.executors import TaskRunner, _in_order, _raise_failure, _settle
from streamtrace.errors import TraceError
from streamtrace.io.progress import Progress


class EndedTask:
    """What Dask's future tells a done-callback: its status, result and exception."""

    def __init__(self, status: str, result: object = None, exception: BaseException | None = None) -> None:
        self.status, self._result, self._exception = status, result, exception

    def result(self) -> object:
        return self._result

    def exception(self) -> BaseException | None:
        return self._exception


def test_a_task_cancelled_on_the_cluster_fails_the_run_in_one_line():
    finished, cancelled = Future(), Future()
    _settle(finished, EndedTask("finished", result=7))
    _settle(cancelled, EndedTask("cancelled"))
    done, _ = wait([cancelled], timeout=5)
    assert done == {cancelled} and isinstance(cancelled.exception(), TraceError)
    outcome: list = []

    def consume() -> None:
        try:
            outcome.extend(_in_order([finished, cancelled], Progress(None, enabled=False), "ranks written"))
        except TraceError as exc:
            outcome.append(exc)

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    reader.join(timeout=10)
    assert not reader.is_alive(), "waiting on a task the cluster cancelled never ended"
    assert outcome[0] == 7 and "cancelled on the cluster" in str(outcome[1])


def test_the_cluster_giving_up_on_a_task_is_a_one_line_error():
    killed = type("KilledWorker", (Exception,), {"__module__": "distributed.scheduler"})
    with pytest.raises(TraceError, match="KilledWorker: task 'merge-3' marked as failed"):
        _raise_failure(killed("task 'merge-3' marked as failed"))
    with pytest.raises(ValueError):  # a task's own error stays what it is
        _raise_failure(ValueError("the task's own"))


def test_the_run_directory_goes_even_when_closing_the_client_fails(tmp_path, monkeypatch):
    class FailingClient:
        def close(self) -> None:
            raise OSError("connection reset while closing")

    removed: list[str] = []
    monkeypatch.setattr(executors, "remove_tree", removed.append)
    runner = TaskRunner(2)
    runner._client, runner.work_dir = FailingClient(), str(tmp_path / "streamtrace-run-x")
    with pytest.raises(OSError, match="connection reset"):
        runner.__exit__(None, None, None)
    assert removed == [str(tmp_path / "streamtrace-run-x")] and runner.work_dir is None and runner._client is None


def test_overlapping_frozen_blocks_freeze_once():
    """A Dask worker runs tasks in threads at once: the second task's block must not freeze the
    first one's objects (its collections could then free none of its garbage) nor unfreeze early."""
    import gc

    from streamtrace.resources import frozen_heap

    assert gc.get_freeze_count() == 0
    with frozen_heap():
        frozen = gc.get_freeze_count()
        first_tasks_objects = [[n] for n in range(1000)]  # live in the first block: must stay unfrozen
        with frozen_heap():
            assert gc.get_freeze_count() == frozen
        assert gc.get_freeze_count() == frozen
        del first_tasks_objects
    assert gc.get_freeze_count() == 0


@pytest.mark.parametrize("address", ["foo://bar:1", "head-node", "tcp://127.0.0.1:notaport"])
def test_an_address_dask_cannot_parse_is_refused_in_one_line(address):
    pytest.importorskip("distributed")
    with pytest.raises(TraceError, match="not a scheduler address such as tcp://host:8786"):
        executors._connect(address)


def test_spool_objects_that_cannot_be_deleted_are_named_in_a_warning(monkeypatch, capsys):
    """The run's own outcome stands; what stays in the bucket is said, not swallowed."""
    from streamtrace.io import objectstore

    class ExpiredCredentials:
        def rm_file(self, path: str) -> None:
            raise PermissionError("ExpiredToken: the security token included in the request is expired")

    monkeypatch.setattr(objectstore, "_filesystem", lambda url: (ExpiredCredentials(), url.split("://", 1)[1]))
    objectstore.RunStore("s3://bucket/tmp/streamtrace-run-abc").remove()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "s3://bucket/tmp/streamtrace-run-abc/" in err and "access denied" in err


def test_a_spool_object_whose_run_cannot_be_checked_after_upload_is_deleted(tmp_path, monkeypatch):
    """A worker that may write but not read the marker (403 on HEAD) uploads, then cannot tell
    whether the run stopped meanwhile: the object it made is deleted, and the error says which step failed."""
    from streamtrace.io import objectstore

    class WriteOnly:
        def __init__(self) -> None:
            self.objects: set[str] = set()
            self.checks = 0

        def invalidate_cache(self, path: str) -> None:
            pass

        def exists(self, path: str) -> bool:
            self.checks += 1
            if self.checks > 1:
                raise PermissionError("403 Forbidden")
            return True

        def put_file(self, local: str, path: str) -> None:
            self.objects.add(path)

        def rm_file(self, path: str) -> None:
            self.objects.discard(path)

    store = WriteOnly()
    monkeypatch.setattr(objectstore, "_filesystem", lambda url: (store, url.split("://", 1)[1]))
    local = tmp_path / "rank3.state"
    local.write_bytes(b"state")
    with pytest.raises(TraceError, match="cannot check that the run is still on after uploading"):
        objectstore.RunStore("s3://bucket/tmp/streamtrace-run-abc").put(str(local))
    assert store.objects == set()
