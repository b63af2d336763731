"""Library worker processes: spawned without the user's script, and gone when their parent is."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

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


FORKED_SEARCH = """
import os, signal
import numpy as np
from retriever.store import keywords

documents = 3000
arguments = (np.arange(documents, dtype=np.int32), np.ones(documents, np.uint16), np.array([0], np.int64),
             np.array([documents], np.int64), np.array([1.7], np.float32), np.array([4.0]), np.array([0], np.int64),
             np.float32(2.2), np.ones(documents, np.float32), np.array([], np.int32), 3, 0.0)
print(keywords.max_score_in_slices(arguments, [0, 1000, 2000, documents])[0].tolist(), flush=True)
child = os.fork()
if child == 0:
    signal.alarm(10)  # were the parent's pool handed on, the slices would wait for threads the child lacks
    print(keywords.max_score_in_slices(arguments, [0, 1000, 2000, documents])[0].tolist(), flush=True)
    os._exit(0)
os._exit(os.waitpid(child, 0)[1])
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX")
def test_a_forked_child_searches_in_slices_with_threads_of_its_own():
    """A process that searched a large keyword segment (its slices on a pool of threads), then forked, as a
    user's script or server may: the child's search finishes, with the parent's answer."""
    done = subprocess.run([sys.executable, "-c", FORKED_SEARCH], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["[0, 1, 2]", "[0, 1, 2]"]
