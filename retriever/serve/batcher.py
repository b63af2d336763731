"""Micro-batching: searches answered on one thread, every query that queued while the previous batch ran going
through one encoder call (one per encoder), then one search per index version and `SearchOptions.batch_key` (the
same options but min_score).
Under load that is micro-batching for free; a lone query waits for nothing.

One client's bad query never fails another's: queries are checked before they are batched, and a batch that
fails anyway is retried query by query, so the error reaches only the request that caused it. An error that is
no request's (a shard that does not answer) fails the batch at once.
"""

from __future__ import annotations

import queue
import threading
from collections import defaultdict
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from retriever.errors import UnavailableError
from retriever.search.options import SearchOptions
from retriever.search.results import cut
from retriever.serve.metrics import ServerMetrics
from retriever.serve.open_indexes import Served

MAX_BATCH_QUERIES = 64  # queries per encoder call


@dataclass
class SearchJob:
    """One request's search: its QUERIES over SERVED with OPTIONS (resolved for that index: the mode is set)."""

    served: Served
    queries: list[str]
    options: SearchOptions
    future: Future = field(default_factory=Future)
    raw: np.ndarray | None = None


class SearchBatcher:
    """Answers searches on one thread, batching every query that queued while the previous batch ran."""

    def __init__(self, max_queries: int = MAX_BATCH_QUERIES, metrics: ServerMetrics | None = None):
        self.max_queries = max_queries
        self.metrics = metrics
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="search-batcher", daemon=True)
        self._thread.start()
        self.batches = 0
        self.queries = 0

    def submit(self, served: Served, queries: list[str], options: SearchOptions) -> Future:
        """QUERIES searched over SERVED with OPTIONS (resolved for it): a future of their hits, cut to each
        request's own k and min_score."""
        job = SearchJob(served, queries, options)
        self._queue.put(job)
        return job.future

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            jobs, count = [job], len(job.queries)
            while count < self.max_queries:
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    self._queue.put(None)  # answer what was taken, then stop
                    break
                jobs.append(job)
                count += len(job.queries)
            # A request whose client went away was cancelled while queued: not searched. The others can no longer
            # be cancelled, so answering them never meets a cancelled future.
            jobs = [job for job in jobs if job.future.set_running_or_notify_cancel()]
            if not jobs:
                continue
            count = sum(len(job.queries) for job in jobs)
            self.batches += 1
            self.queries += count
            if self.metrics is not None:
                self.metrics.batch.observe(count)
            self._answer(jobs)

    def _answer(self, jobs: list[SearchJob]) -> None:
        by_encoder: dict[int, list[SearchJob]] = defaultdict(list)
        for job in jobs:
            by_encoder[id(job.served.encoder)].append(job)
        for group in by_encoder.values():
            self._encode_and_search(group)

    def _encode_and_search(self, group: list[SearchJob]) -> None:
        """One encoder call for the group (keyword searches need none), then one search per index version and
        batch key; a failure of a group of several is retried job by job, so it reaches only the request that
        caused it."""
        encoded = [job for job in group if job.options.mode != "keyword"]
        try:
            raw = group[0].served.encoder.encode([text for job in encoded for text in job.queries]) if encoded else None
        except Exception as error:  # noqa: BLE001 - the thread lives on; only the guilty request gets the error
            if len(group) == 1:
                _fail(group, error)
            else:
                for job in group:
                    self._encode_and_search([job])
            return
        offset = 0
        for job in encoded:
            job.raw = raw[offset : offset + len(job.queries)]
            offset += len(job.queries)
        by_search: dict[tuple, list[SearchJob]] = defaultdict(list)
        for job in group:
            by_search[(id(job.served), job.options.batch_key())].append(job)
        for same in by_search.values():
            try:
                self._search(same)
            except Exception as error:  # noqa: BLE001
                if len(same) == 1 or isinstance(error, UnavailableError):  # the server's failure: no request to blame
                    _fail(same, error)
                    continue
                for job in same:
                    try:
                        self._search([job])
                    except Exception as alone:  # noqa: BLE001
                        _fail([job], alone)

    @staticmethod
    def _search(jobs: list[SearchJob]) -> None:
        served = jobs[0].served
        options = jobs[0].options.batch_key()
        texts = [text for job in jobs for text in job.queries]
        vectors = (None if options.mode == "keyword" else
                   served.snapshot.calibrate(np.concatenate([job.raw for job in jobs])))
        hits = served.searcher.search(texts, vectors, options)
        offset = 0
        for job in jobs:
            job.future.set_result(cut(hits[offset : offset + len(job.queries)], job.options))
            offset += len(job.queries)


def _fail(jobs: list[SearchJob], error: Exception) -> None:
    for job in jobs:
        if not job.future.done():
            job.future.set_exception(error)
