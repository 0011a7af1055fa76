"""Faults a test inflicts on a Dask cluster while a run goes on."""
from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any, Callable


def kill_a_busy_worker_during(run: Callable[[], Any], client: Any, *, timeout: float = 300) -> tuple[int | None, dict]:
    """``run()`` in a thread while the first worker seen holding a task is
    killed (SIGKILL, at once: waiting to be "well into" a task lets short
    tasks slip by).  Returns the killed process's id (None: no task was seen
    running) and ``{"result": ...}`` or ``{"error": exception}``."""
    outcome: dict = {}

    def capture() -> None:
        try:
            outcome["result"] = run()
        except BaseException as exc:  # handed to the test's thread
            outcome["error"] = exc

    running = threading.Thread(target=capture)
    running.start()
    victim = None
    deadline = time.monotonic() + 60
    while victim is None and running.is_alive() and time.monotonic() < deadline:
        busy = [worker for worker, held in client.processing().items() if held]
        if busy:
            victim = client.run(os.getpid, workers=busy[:1])[busy[0]]
            os.kill(victim, signal.SIGKILL)
        time.sleep(0.01)
    running.join(timeout)
    return victim, outcome
