"""Worker processes that run the library's own functions, never the user's script.

A spawned process imports the parent's main module first (`multiprocessing.spawn` finds it by its `__file__`, or by
its `__spec__` under `python -m`), and a script that builds an index at its top level, without an
`if __name__ == "__main__":` guard, would build again in every worker and die there. Workers started through
`spawn_context()` need nothing of the main module (they run functions of this library), so it is hidden from the
spawn while each process starts. Spawn, not fork: the parent may hold a CUDA context and threads (the tokenizer's,
the encoder's prefetching), which a fork cannot copy.
"""

from __future__ import annotations

import signal
import sys
import threading
from multiprocessing.context import SpawnContext, SpawnProcess


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


def ignore_interrupts() -> None:
    """A worker's initializer: Ctrl-C is the parent's to handle (it stops its workers)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
