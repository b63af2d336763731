"""Worker processes that run the library's own functions, never the user's script.

A spawned process imports the parent's main module first (`multiprocessing.spawn` finds it by its `__file__`, or by
its `__spec__` under `python -m`), and a script that builds an index at its top level, without an
`if __name__ == "__main__":` guard, would build again in every worker and die there. Workers started through
`spawn_context()` need nothing of the main module (they run functions of this library), so it is hidden from the
spawn while each process starts. Spawn, not fork: the parent may hold a CUDA context and threads (the tokenizer's,
the encoder's prefetching), which a fork cannot copy.

Also this process's own pools of threads (`shared_thread_pool`), which a user's fork must not inherit.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.context import SpawnContext, SpawnProcess


_pools: dict[str, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def shared_thread_pool(name: str, workers: int) -> ThreadPoolExecutor:
    """This process's pool of WORKERS threads named NAME, made on first use and shared by every caller. A forked
    child starts without any (`_forget_pools`): its copy of the parent's pool names threads the child does not have,
    and work handed to it would wait forever."""
    pool = _pools.get(name)
    if pool is None:
        with _pools_lock:
            pool = _pools.get(name)
            if pool is None:
                pool = _pools[name] = ThreadPoolExecutor(workers, thread_name_prefix=name)
    return pool


def _forget_pools() -> None:
    global _pools_lock
    _pools.clear()
    _pools_lock = threading.Lock()  # the parent's may have been held by one of its other threads


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools)


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity, a container's cpuset; not a CPU quota such as
    `docker --cpus`, which no count of CPUs expresses)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class _LibraryProcess(SpawnProcess):
    def start(self) -> None:
        main = vars(sys.modules["__main__"]) if "__main__" in sys.modules else {}
        with _MAIN_HIDDEN_LOCK:
            saved = {name: main[name] for name in ("__file__", "__spec__") if name in main}
            main.pop("__file__", None)
            main["__spec__"] = None
            try:
                super().start()
            finally:
                main.update(saved)


class _LibraryContext(SpawnContext):
    Process = _LibraryProcess


_MAIN_HIDDEN_LOCK = threading.Lock()


def spawn_context() -> SpawnContext:
    """A multiprocessing context whose processes are spawned without the user's main module (for
    `concurrent.futures.ProcessPoolExecutor(mp_context=...)`)."""
    return _LibraryContext()


def start_worker() -> None:
    """A worker's first step. Ctrl-C is the parent's to handle (it stops its workers). A worker whose parent died
    (killed, or out of memory) exits at once: else it would write on into a build that no one will commit, and then
    wait for work forever, holding the parent's output open."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_exit_with, args=(parent.sentinel,), name="retriever-parent-watch",
                         daemon=True).start()


def _exit_with(parent_sentinel: int) -> None:
    multiprocessing.connection.wait([parent_sentinel])
    os._exit(1)
