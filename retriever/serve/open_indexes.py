"""The server's open indexes: each opened once, swapped for its newer version when one is committed (by the CLI,
another process, or this server), one encoder per model for the server's life.

A request holds the version it started with until it is answered (`OpenIndexes.using`), so every response comes
from exactly one version (and says which); a replaced version is closed (its files, SQLite connections and mapped
vectors released) once the last request holding it is answered (`Leases`), so write storms do not pile up open
descriptors of pruned versions.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from concurrent.futures import Future
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from fastapi.concurrency import run_in_threadpool

from retriever.errors import NotFoundError, RetrieverError, UnavailableError
from retriever.encode.query_kit import QueryKitEncoder, kit_may_serve
from retriever.index import Index, load_encoder
from retriever.search.dense import RemoteSegments
from retriever.search.searcher import Searcher
from retriever.serve.leases import Leases
from retriever.serve.metrics import ServerMetrics
from retriever.versions.catalog import default_index
from retriever.versions.home import check_name, list_indexes
from retriever.versions.snapshot import Snapshot

log = logging.getLogger("retriever.serve")


@dataclass(frozen=True)
class Served:
    """One open version as the server uses it: the INDEX (documents, writes), its SEARCHER (the batched search
    path, shared with the index) and the ENCODER its model's requests go through together."""

    index: Index
    searcher: Searcher
    encoder: object

    @property
    def name(self) -> str:
        return self.index.name

    @property
    def snapshot(self) -> Snapshot:
        return self.index.snapshot


class _LoadedAtFirstUse:
    """A model's writing encoder (`index.load_encoder`: from its kit where one is kept, else the model), made by LOAD
    at its first use (the first write through the server), once; every version of every index on that model shares
    it."""

    def __init__(self, load):
        self._load, self._lock, self._encoder = load, threading.Lock(), None

    def __getattr__(self, name: str):
        if self._encoder is None:
            with self._lock:
                if self._encoder is None:
                    self._encoder = self._load()
        return getattr(self._encoder, name)


def _loaded(snapshot, runtime: str, kit: QueryKitEncoder | None = None):
    """The writing encoder SNAPSHOT records (its manifest, device and name; `index.load_encoder`, from KIT, the
    queries' kit, where it fits); a model this machine lacks is the server's problem (503), not the request's."""
    try:
        return load_encoder(snapshot, runtime, kit)
    except RetrieverError as error:
        raise UnavailableError(str(error), parameter=error.parameter) from None


class OpenIndexes:
    """Each index of INDEX_DIR opened once, swapped for its newer version when one is committed; one encoder per
    model (RUNTIME: its forward pass); REMOTE: a distributed server's shards, which search every version's vectors."""

    def __init__(self, index_dir: Path, device: str = "auto", runtime: str = "auto",
                 metrics: ServerMetrics | None = None, remote: RemoteSegments | None = None):
        self.index_dir = index_dir
        self.device = device
        self.runtime = runtime
        self.metrics = metrics
        self.remote = remote
        self._held: dict[str, Served] = {}
        self._encoders: dict[str, object] = {}  # per model: what encodes its queries, batched
        self._full: dict[str, object] = {}  # per model: the full encoder (a write's passages and vectors)
        self._opening = threading.Lock()  # one opener at a time; the others wait for the same new version
        self._leases: Leases[Served] = Leases(lambda served: served.index.close())

    def names(self) -> list[str]:
        return list_indexes(self.index_dir)

    def held(self, name: str) -> Served | None:
        """The open version of NAME if it is still the current one (one path resolution), else None."""
        held = self._held.get(check_name(name))
        current = os.path.realpath(self.index_dir / name)
        return held if held is not None and str(held.snapshot.folder) == current else None

    def get(self, name: str) -> Served:
        """The current version of NAME, opened now if a newer one was committed since it was last asked for."""
        held = self.held(name)
        if held is not None:
            return held
        with self._opening:
            held = self.held(name)
            if held is not None:  # opened by the thread that held the lock before
                return held
            try:
                snapshot = Snapshot.open(name, self.index_dir, device=self.device)
            except NotFoundError:  # removed: forget the version held
                with self._leases.lock:
                    self._leases.retire(self._held.pop(name, None))
                if self.metrics is not None:
                    self.metrics.forget(name)
                raise
            key = json.dumps(snapshot.manifest.encoder, sort_keys=True)
            if key not in self._encoders:  # once per model for the server's life
                # Queries from the kept kit where there is one (`encode.query_kit`: no model loaded, the server up
                # in about a second), the writes' encoder at the first write; else the full encoder, now.
                record = snapshot.manifest.encoder
                kit = QueryKitEncoder.open(record) if kit_may_serve(record, self.device, self.runtime) else None
                try:
                    full = None if kit is not None else load_encoder(snapshot, self.runtime)
                except RetrieverError as error:  # this machine lacks the model: the server's problem, not the request's
                    snapshot.close()
                    raise UnavailableError(str(error), parameter=error.parameter) from None
                self._encoders[key] = kit or full
                # What loading needs of this version, not the version (it may be closed by then).
                recorded = SimpleNamespace(manifest=snapshot.manifest, device=snapshot.device, name=snapshot.name)
                self._full[key] = full or _LoadedAtFirstUse(lambda: _loaded(recorded, self.runtime, kit))
            searcher = Searcher(snapshot, self.remote)
            # The server swaps versions itself (`using`), each request on the one it began with.
            index = Index(snapshot, encoder=self._full[key], searcher=searcher, follow_writes=False)
            served = Served(index, searcher, self._encoders[key])
            with self._leases.lock:
                previous = self._held.get(name)
                self._held[name] = served
                self._leases.retire(previous)
            if self.metrics is not None:
                self.metrics.serving(name, snapshot.manifest.version, len(snapshot))
            if previous is not None:
                log.info("index '%s': now serving version %d (was %d)", name, snapshot.manifest.version,
                         previous.snapshot.manifest.version)
            return served

    def _hold(self, served: Served) -> bool:
        with self._leases.lock:
            if self._held.get(served.name) is not served and not self._leases.is_retired(served):
                return False  # replaced (and closed) between the look-up and now: look again
            self._leases.hold(served)
            return True

    def hold_until_done(self, served: Served, future: Future) -> None:
        """Keep SERVED open until FUTURE (its batched search) is done, whatever becomes of the request that
        submitted it: a client that goes away cancels its handler, not a search the batcher has started."""
        self._leases.hold(served)
        future.add_done_callback(lambda _: self._leases.release(served))

    @asynccontextmanager
    async def using(self, name: str | None):
        """NAME's current version (the most recently written index when NAME is empty), held open until the block
        ends."""
        while True:
            served = await self.current(name)
            if self._hold(served):
                break
        try:
            yield served
        finally:
            self._leases.release(served)

    async def current(self, name: str | None) -> Served:
        """NAME, current version; when none is named, the default index (the CLI's rule for reading,
        `versions.catalog.default_index`; the answer names it). An open, when one is needed, runs off the event loop so
        other requests go on meanwhile."""
        if not name:
            name = await run_in_threadpool(default_index, self.index_dir)
            if name is None:
                raise NotFoundError("no index is served yet; build one with: retriever build CORPUS")
        return self.held(name) or await run_in_threadpool(self.get, name)

    def close(self) -> None:
        with self._leases.lock:
            held = list(self._held.values())
            self._held.clear()
        self._leases.close_all(held)
