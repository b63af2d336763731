"""Library worker processes: spawned without the user's script, and gone when their parent is."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

KILLED_PARENT = """
import os, time
from concurrent.futures import ProcessPoolExecutor
from retriever.processes import spawn_context, start_worker
pool = ProcessPoolExecutor(1, mp_context=spawn_context(), initializer=start_worker)
print(pool.submit(os.getpid).result(), flush=True)
pool.submit(time.sleep, 60)  # still working when its parent dies
time.sleep(0.5)
os.kill(os.getpid(), 9)
"""


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie has exited: only its reaping is left


def test_a_worker_whose_parent_is_killed_exits_and_lets_go_of_its_output():
    # The worker holds the parent's stdout: were it to stay, reading that output to its end would wait for it.
    done = subprocess.run([sys.executable, "-c", KILLED_PARENT], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == -9
    worker = int(done.stdout.split()[0])
    deadline = time.monotonic() + 10
    while _running(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(worker)
