"""Faults a test inflicts on a Dask cluster while a run goes on."""
from __future__ import annotations

import os
import signal
import threading
import time
from typing import Callable


def kill_workers_during(client, merging: Callable[[], dict], targets: Callable[[list[str]], list[str]]
                        ) -> tuple[dict, list[int]]:
    """Run ``merging`` in a thread and SIGKILL, once, the workers that
    ``targets`` picks among those holding a task (asked again and again
    until it picks some); returns its outcome and the pids killed."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["summary"] = merging()
        except BaseException as exc:  # handed to the test thread
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    killed: list[int] = []
    deadline = time.monotonic() + 60
    while not killed and thread.is_alive() and time.monotonic() < deadline:
        busy = [worker for worker, keys in client.processing().items() if keys]
        chosen = targets(busy) if busy else []
        if chosen:
            killed = list(client.run(os.getpid, workers=chosen).values())
            for pid in killed:
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
    thread.join(120)
    return outcome, killed
