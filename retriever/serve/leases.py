"""Versions in use by requests: each is closed once it is retired (replaced, or evicted) and the last request
holding it has let go, never while one still reads it. The local server's open indexes and a distributed server's
shards both keep their versions through `Leases`."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Leases(Generic[T]):
    """Reference counts of items (by identity), and CLOSE for a retired one once nobody holds it. `lock` is held
    around every change; a caller takes it too where its own bookkeeping (which item is current) must change with
    the counts in one step."""

    def __init__(self, close: Callable[[T], None]):
        self.lock = threading.RLock()
        self._close = close
        self._holders: dict[int, int] = {}
        self._retired: dict[int, T] = {}

    def hold(self, item: T) -> None:
        with self.lock:
            self._holders[id(item)] = self._holders.get(id(item), 0) + 1

    def release(self, item: T) -> None:
        with self.lock:
            if id(item) not in self._holders:
                return  # everything was closed (`close_all`: the server stopped) while it was held
            left = self._holders[id(item)] - 1
            if left:
                self._holders[id(item)] = left
                return
            del self._holders[id(item)]
            retired = self._retired.pop(id(item), None)
        if retired is not None:
            self._close(retired)

    def retire(self, item: T | None) -> None:
        """ITEM is no longer handed out: closed now if nobody holds it, else when the last holder releases it."""
        if item is None:
            return
        with self.lock:
            if self._holders.get(id(item), 0):
                self._retired[id(item)] = item
                return
        self._close(item)

    def is_retired(self, item: T) -> bool:
        with self.lock:
            return id(item) in self._retired

    def close_all(self, current: list[T]) -> None:
        """Close CURRENT and every retired item, held or not (the server is stopping)."""
        with self.lock:
            items = [*current, *self._retired.values()]
            self._retired.clear()
            self._holders.clear()
        for item in items:
            self._close(item)
