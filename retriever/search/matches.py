"""Filters' matches, remembered per opened version: a filter is evaluated over every document once, and users
repeat theirs (a page of results, the next query of a session, a server's many clients with one filter)."""

from __future__ import annotations

import threading
from collections import OrderedDict

from retriever.filters import Filter
from retriever.search.plan import Matches
from retriever.versions.snapshot import Snapshot

# At most this many filters, and this many bytes of their row ids (split by segment too), so that clients cycling
# broad filters cannot fill memory.
FILTERS_REMEMBERED = 32
FILTER_CACHE_BYTES = 256 * 2**20


class MatchCache:
    """The most recent filters' `Matches` over SNAPSHOT. Safe to share between threads: an entry is one immutable
    `Matches`, put and read whole under a lock; two threads asking for a new filter at once may both evaluate it,
    and either answer is the same."""

    def __init__(self, snapshot: Snapshot, remembered: int = FILTERS_REMEMBERED, max_bytes: int = FILTER_CACHE_BYTES):
        self.snapshot, self.remembered, self.max_bytes = snapshot, remembered, max_bytes
        self._held: OrderedDict[Filter, Matches] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def matches(self, where: Filter) -> Matches:
        """The live row ids WHERE selects, and the same by segment."""
        with self._lock:
            found = self._held.get(where)
            if found is not None:
                self._held.move_to_end(where)
                return found
        rowids = self.snapshot.matching(where)
        found = Matches(rowids, tuple(rowids[segment.contains(rowids)] for segment in self.snapshot.segments))
        with self._lock:
            if where not in self._held:
                self._held[where] = found
                self._bytes += _size(found)
                while len(self._held) > 1 and (len(self._held) > self.remembered or self._bytes > self.max_bytes):
                    _, dropped = self._held.popitem(last=False)
                    self._bytes -= _size(dropped)
        return found


def _size(matches: Matches) -> int:
    return int(matches.rowids.nbytes + sum(part.nbytes for part in matches.by_segment))
