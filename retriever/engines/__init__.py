"""Build engines: where a build's read -> encode -> segment stages run. What lies between (fitting the
calibrator, training the index, committing) is one skeleton for all of them (`retriever.engines.base.run_build`),
so an engine is a `BuildEngine` that fills in its stages:

- ``local`` (`retriever.engines.local`): one process, streamed in chunks, resumable after a kill.
- ``ray`` (`retriever.engines.ray_build`): Ray Data reads the corpus and encodes it on an actor pool (one model
  load per actor, a GPU each where present), the driver fits the calibrator on a sample, and Ray tasks write the
  index segments. Needs the optional extra ``retriever[ray]``; Ray is imported only when this engine is chosen.

Both give an ordinary index version: search, add, delete, compact and serve do not know which engine built it.
The work each Ray stage does lives in `retriever.engines.workers` as plain Python, testable without Ray.
"""

from __future__ import annotations

ENGINES = ("local", "ray")
