"""Distributed search on Ray Serve: shards that hold a share of every index's segments, and a front that encodes,
fans out, merges and answers the same HTTP API as the local server (`retriever serve --engine ray --shards N`).

    HTTP (Ray Serve's proxy, 127.0.0.1) -> Front (the `retriever.serve.app` app: encoder, keyword index, documents)
                                            |-- Shard 0 (replicas) : vectors of its segments
                                            `-- Shard N-1 (replicas)

- Each version's segments are assigned to shards by `assign_segments` (largest first, to the least loaded shard):
  a shard searches only its segments' vectors, so a shard's memory is its share of the vectors (segments are
  memory-mapped, and a process touches only the pages it searches). The assignment is a function of the manifest,
  the same in every process, and `GET /indexes/{name}` shows it.
- The front resolves the version to answer from once per request (as the local server does) and names its folder
  in every shard call; a shard opens exactly that version (kept open for the next calls). A version committed
  meanwhile is searched by the next request, on every shard at once: no answer mixes versions, and each names
  the version it comes from.
- The front merges the shards' per-segment top lists in segment order, as one process merges its segments, so
  the answers equal the local server's. Keyword search, fusion and documents stay at the front (BM25 reads the
  whole version's statistics; the keyword index is a small part of an index).
- A shard that does not answer within `SHARD_TIMEOUT_S` (or whose replica died) fails the request with a 503
  naming it: never a partial merge, never a hang. An error a shard raises itself reaches the front as it was
  raised (damage is a 503 naming the index; a bug a 500 whose traceback the front logs). Ray Serve replaces a
  dead replica; requests meanwhile go to the shard's other replicas or fail fast.

The deployments are put together by `retriever.serve.run.ray_application`; this module holds what runs in them and
imports no Ray itself (the handles it calls are given to it).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from retriever.errors import RetrieverError, UnavailableError
from retriever.search.plan import DensePlan
from retriever.search.top_lists import PassageVectors, TopList, passage_vectors, segment_top_lists
from retriever.serve.leases import Leases
from retriever.versions.manifest import SegmentEntry
from retriever.versions.snapshot import Snapshot

log = logging.getLogger("retriever.serve")

SHARD_TIMEOUT_S = 2.0  # a shard's answer (milliseconds when healthy); past it the request is a 503, not a wait
VERSIONS_HELD = 4  # versions a shard keeps open: the current one and those requests in flight may still name


def assign_segments(segments: Sequence[SegmentEntry], shards: int) -> dict[str, int]:
    """Segment name -> shard number: the largest segment first, each to the shard holding the fewest rows so far
    (ties: the lower number). Deterministic: every process derives the same assignment from the manifest."""
    if shards < 1:
        raise RetrieverError(f"a distributed server needs at least 1 shard (got {shards})", parameter="shards")
    load = [0] * shards
    assignment = {}
    for entry in sorted(segments, key=lambda entry: (-entry.rows, entry.name)):
        shard = min(range(shards), key=lambda number: (load[number], number))
        assignment[entry.name] = shard
        load[shard] += entry.rows
    return assignment


class ShardServer:
    """One shard (a Ray Serve deployment's replica): answers for its segments of whichever version it is asked.

    Versions are kept open for the next calls, the most recent VERSIONS_HELD of them; an evicted version is closed
    once no call in flight still reads it (`Leases`)."""

    def __init__(self, index_dir: str, shard: int, shards: int, device: str = "cpu"):
        self.index_dir, self.shard, self.shards, self.device = index_dir, shard, shards, device
        self._open: OrderedDict[str, Snapshot] = OrderedDict()
        self._leases: Leases[Snapshot] = Leases(lambda snapshot: snapshot.close())

    @contextmanager
    def holding(self, name: str, folder: str) -> Iterator[tuple[Snapshot, list[int]]]:
        """The version in FOLDER of index NAME, opened or kept open, held until the block ends; with the numbers of
        its segments this shard answers for."""
        with self._leases.lock:
            snapshot = self._open.get(folder)
            if snapshot is None:
                snapshot = Snapshot.open_version(Path(folder), name, self.index_dir, device=self.device)
                self._open[folder] = snapshot
                while len(self._open) > VERSIONS_HELD:
                    self._leases.retire(self._open.popitem(last=False)[1])
            self._open.move_to_end(folder)
            self._leases.hold(snapshot)
        try:
            assignment = assign_segments(snapshot.manifest.segments, self.shards)
            yield snapshot, [number for number, segment in enumerate(snapshot.segments)
                             if assignment[segment.name] == self.shard]
        finally:
            self._leases.release(snapshot)

    def top_lists(self, name: str, folder: str, queries: np.ndarray, plan: DensePlan,
                  includes: dict[int, np.ndarray] | None) -> list[TopList]:
        with self.holding(name, folder) as (snapshot, mine):
            return segment_top_lists(snapshot, mine, queries, plan, includes)

    def passage_vectors(self, name: str, folder: str, rowids: np.ndarray) -> PassageVectors:
        """The vectors of those of ROWIDS' passages this shard holds, in the index's space."""
        with self.holding(name, folder) as (snapshot, mine):
            return passage_vectors(snapshot, rowids, mine)


def raised_by_shard(error: Exception) -> Exception | None:
    """The exception a shard's own code raised, where ERROR carries one (Ray hands it back as the `cause` of a
    task error; an in-process handle raises it as it is), else None: the shard did not answer (a timeout, an
    actor that died, a replica restarting)."""
    if isinstance(error, RetrieverError):
        return error
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, Exception) else None


class RayShards:
    """The front's view of the shards (a `search.dense.RemoteSegments`): calls each shard that holds segments of
    the version, waits for all, and merges nothing partial."""

    def __init__(self, handles: Sequence, timeout: float = SHARD_TIMEOUT_S):
        self.handles, self.timeout = list(handles), timeout

    def assignment(self, snapshot: Snapshot) -> dict[str, int]:
        return assign_segments(snapshot.manifest.segments, len(self.handles))

    def _gather(self, calls: dict[int, object]) -> dict[int, object]:
        answers = {}
        for shard, call in calls.items():
            try:
                answers[shard] = call.result(timeout_s=self.timeout)
            except Exception as error:  # noqa: BLE001 - Ray's errors vary (actor died, timeout, replica restarting)
                for pending in calls.values():
                    pending.cancel()
                raised = raised_by_shard(error)
                if raised is not None:  # the shard answered with an error of its own (damage, a bug): that error
                    raise raised from error
                reason = str(error).strip().splitlines()[0][:160] if str(error).strip() else type(error).__name__
                log.warning("shard %d did not answer: %s: %s", shard, type(error).__name__, reason)
                raise UnavailableError(f"shard {shard} did not answer ({type(error).__name__}: {reason}); nothing "
                                       "was merged: try again") from error
        return answers

    def top_lists(self, snapshot: Snapshot, queries: np.ndarray, plan: DensePlan,
                  includes: dict[int, np.ndarray] | None) -> list[TopList]:
        assignment = self.assignment(snapshot)
        calls = {}
        for shard, handle in enumerate(self.handles):
            numbers = [n for n, segment in enumerate(snapshot.segments) if assignment[segment.name] == shard]
            if includes is not None:
                numbers = [n for n in numbers if n in includes]
            if not numbers:
                continue
            mine = None if includes is None else {n: includes[n] for n in numbers}
            calls[shard] = handle.top_lists.remote(snapshot.name, str(snapshot.folder), queries, plan, mine)
        return [found for lists in self._gather(calls).values() for found in lists]

    def passage_vectors(self, snapshot: Snapshot, rowids: np.ndarray) -> PassageVectors:
        assignment = self.assignment(snapshot)
        holding = {assignment[segment.name] for segment in snapshot.segments if segment.contains(rowids).any()}
        calls = {shard: self.handles[shard].passage_vectors.remote(snapshot.name, str(snapshot.folder), rowids)
                 for shard in sorted(holding)}  # only the shards holding some of them
        return PassageVectors.join(self._gather(calls).values(), snapshot.manifest.dim)


__all__ = ["assign_segments", "RayShards", "ShardServer", "SHARD_TIMEOUT_S"]
