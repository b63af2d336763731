"""Issue 56 (3): queries on the fastest runtime by default. `Index.open(name)` encodes a query with ONNX Runtime on a
CPU (`runtime="auto"`) where it used to take PyTorch; this checks that it gives the same vectors and measures what
it saves where users wait.

    python benchmarks/query_runtime.py agree --out benchmarks/results/query_runtime/agree_minilm.json
    python benchmarks/query_runtime.py documents --out benchmarks/results/query_runtime/documents_minilm.json
    python benchmarks/query_runtime.py p50 --out benchmarks/results/query_runtime/p50_cpu.json
    python benchmarks/query_runtime.py cli --index-dir /tmp/runtime-indexes --out benchmarks/results/query_runtime/cli_cpu.json
    python benchmarks/query_runtime.py codes --codes ../before,. --index-dir /tmp/flow-indexes \\
        --out benchmarks/results/query_runtime/cli_cpu_flow_codes.json
    python benchmarks/query_runtime.py report benchmarks/results/query_runtime/*.json \\
        --out benchmarks/results/query_runtime.md

`agree`: the 14 labeled tasks; each query encoded alone (as a search encodes it) by PyTorch and by ONNX Runtime: the
lowest cosine between the two, and nDCG@10 of the default search (a default build, documents encoded by PyTorch)
with either's query vectors. `documents`: the same tasks built and searched end to end on each runtime, documents
too (a build encodes them on ONNX Runtime by default since issue 56's documents change). `p50`: one default index
of Cranfield's abstracts, opened three times in one process, as `Index.open(name, runtime="torch")` (the old
default), `Index.open(name)` and `Index.open(name)` with ONNX Runtime's workers sleeping between operators (the
settings shipped before they spun within a run); its questions searched one at a time through `Index.search`, the
three taking turns query by query, quiet and then beside a busy loop taking one core. `codes`: a one-off
`retriever search` of two checkouts in turn on one index (by default calibrated by a flow, which each checkout's
code maps its own way), and whether each imported torch.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.hybrid import DEV, HELD_OUT, model_path  # noqa: E402
from benchmarks.study_cli import generated_from, study_main  # noqa: E402

WARM_UP, TIMED = 20, 200
# Query by query, PyTorch's threads still awake after its query take the CPU from ONNX Runtime's next one (and the
# other way round); in turns of TURN queries each runtime runs as it does in a process of its own.
TURN = 20
LOADS = ("quiet", f"quiet, turns of {TURN}", "busy loop on one core", f"busy loop on one core, turns of {TURN}")
BUSY_LOOP = "while True: pass"
# The default runtime with the settings shipped before its workers spun within a run: the change measured in the same run.
SLEEPING = "default, workers sleeping (before)"


def agree(model: str, seed: int) -> dict:
    from retriever.encode.encoder import Encoder
    from retriever.evaluation.cache import CachedEncoder, resolve_cache_dir
    from retriever.evaluation.data import resolve_data_dir
    from retriever.evaluation.retrieval import evaluate_run, search_runs
    from retriever.evaluation.retrieval_tasks import RETRIEVAL_TASKS

    data = resolve_data_dir()
    torch_encoder = Encoder(model_path(model), device="cpu")
    onnx_encoder = Encoder(model_path(model), device="cpu", runtime="onnx")
    documents = CachedEncoder(torch_encoder, resolve_cache_dir())

    def one_at_a_time(encoder):
        return lambda texts: np.vstack([encoder.encode([text]) for text in texts])

    found = {"model": model, "seed": seed, "tasks": []}
    for name in DEV + HELD_OUT:
        rset = RETRIEVAL_TASKS[name].load(data)
        texts = list(rset.queries.values())
        by_torch, by_onnx = one_at_a_time(torch_encoder)(texts), one_at_a_time(onnx_encoder)(texts)
        cosines = np.sum(by_torch * by_onnx, axis=1) / (np.linalg.norm(by_torch, axis=1)
                                                       * np.linalg.norm(by_onnx, axis=1))
        record = {"task": name, "queries": len(texts), "min_cosine": float(cosines.min()),
                  "mean_cosine": float(cosines.mean())}
        for runtime, vectors in (("torch", by_torch), ("onnx", by_onnx)):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                runs = search_runs(rset, documents.encode, documents, "auto", {"default": {}}, seed,
                                   embed_queries=lambda _texts, vectors=vectors: vectors)
            record[runtime] = round(evaluate_run(runs["default"], rset.qrels, rset.ignore_identical)["ndcg@10"], 2)
        print(json.dumps(record), file=sys.stderr, flush=True)
        found["tasks"].append(record)
    return found


def agree_documents(model: str, seed: int, tasks: list[str] | None = None,
                    control_batches: list[int] | None = None) -> dict:
    """The labeled tasks (TASKS: those named; default all 14) built and searched end to end on each runtime: every
    text (documents, passages, auto's pseudo-queries, queries) encoded by that runtime's encoder, in batches as a
    build encodes them, nothing read from the disk cache; the lowest cosine between the two runtimes' document
    vectors and nDCG@10 of each's default search. CONTROL_BATCHES: the same on PyTorch at each of these batch sizes
    too, whose padding moves the vectors' last bits as a runtime does: what float rounding alone does to a task
    whose calibrator is fitted (a flow's fit carries such differences into its map)."""
    from retriever.encode.encoder import Encoder
    from retriever.evaluation.cache import CachedEncoder
    from retriever.evaluation.data import resolve_data_dir
    from retriever.evaluation.retrieval import evaluate_run, search_runs
    from retriever.evaluation.retrieval_tasks import RETRIEVAL_TASKS

    data = resolve_data_dir()
    encoders = {runtime: Encoder(model_path(model), device="cpu", runtime=runtime) for runtime in ("torch", "onnx")}
    for batch in control_batches or []:
        encoders[f"torch, batch {batch}"] = Encoder(model_path(model), device="cpu", runtime="torch",
                                                    batch_size=batch)
    found = {"model": model, "seed": seed, "documents": True, "tasks": []}
    for name in tasks or DEV + HELD_OUT:
        rset = RETRIEVAL_TASKS[name].load(data)
        texts = [f"{title} {text}".strip() if title else text for title, text in rset.corpus.values()]
        record = {"task": name, "documents": len(texts), "queries": len(rset.queries)}
        vectors, seconds, calibrators = {}, {}, {}
        for runtime, encoder in encoders.items():
            cached = CachedEncoder(encoder)  # in memory: each text encoded once per runtime
            started = time.perf_counter()
            vectors[runtime] = cached.encode(texts)
            seconds[runtime] = round(time.perf_counter() - started, 2)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                runs = search_runs(rset, cached.encode, cached, "auto", {"default": {}}, seed,
                                   on_snapshot=lambda snapshot, runtime=runtime: calibrators.__setitem__(
                                       runtime, _chosen(snapshot.manifest.calibrator)))
            record[runtime] = round(evaluate_run(runs["default"], rset.qrels, rset.ignore_identical)["ndcg@10"], 2)
        by_torch, by_onnx = vectors["torch"], vectors["onnx"]
        cosines = np.sum(by_torch * by_onnx, axis=1) / (np.linalg.norm(by_torch, axis=1)
                                                       * np.linalg.norm(by_onnx, axis=1))
        record.update(min_cosine=float(cosines.min()), mean_cosine=float(cosines.mean()), encode_s=seconds,
                      calibrators=calibrators)
        print(json.dumps(record), file=sys.stderr, flush=True)
        found["tasks"].append(record)
    return found


def _chosen(calibrator: dict) -> str:
    """The calibrator a manifest's CALIBRATOR record holds: auto's choice, or the one named."""
    return calibrator.get("decision", {}).get("chosen", {}).get("name", calibrator.get("name"))


def _timed(indexes: dict, queries: list[str], turn: int = 1) -> dict[str, float]:
    """p50 milliseconds of each index's `search([query])`, the indexes taking turns every TURN queries (the same
    queries for each)."""
    times = {label: [] for label in indexes}
    for number in range(0, WARM_UP + TIMED, turn):
        for label, index in indexes.items():
            for query in queries[number: number + turn]:
                started = time.perf_counter()
                index.search([query], k=10)
                if number >= WARM_UP:
                    times[label].append(time.perf_counter() - started)
    return {label: round(1000 * float(np.median(values)), 2) for label, values in times.items()}


def _graph_kept(index) -> str:
    """Which graph the default index's queries run, as its query kit names it: fused (ONNX Runtime's attention
    kernels) or plain."""
    import onnx

    from retriever.encode.query_kit import KITS, kit_key, onnx_cache_dir

    index.search(["warm"], k=1)  # the first search exports the graph and keeps the kit
    key = kit_key(index.snapshot.manifest.encoder)
    kit = onnx_cache_dir() / KITS / f"{key}.json"
    if key is None or not kit.is_file():
        return "not kept"
    graph = onnx_cache_dir() / json.loads(kit.read_text(encoding="utf-8"))["graph"]
    return "fused" if any(node.op_type == "Attention" for node in onnx.load(str(graph)).graph.node) else "plain"


def _workers_sleep(index) -> None:
    """INDEX's queries on ONNX Runtime with the settings shipped before (idle workers sleep between operators), as a
    server's kit still has them."""
    import onnxruntime

    from retriever.encode.query_kit import session_options

    kit = index._query_encoder()  # a benchmark's look inside: the same graph, another session
    kit.session = onnxruntime.InferenceSession(kit.session._model_path, session_options(),
                                               providers=["CPUExecutionProvider"])


def p50(model: str) -> dict:
    from retriever.corpus import Document
    from retriever.encode.query_kit import SPIN_MICROSECONDS
    from retriever.encode.runtimes import resolve_runtime
    from retriever.evaluation.data import resolve_data_dir
    from retriever.evaluation.retrieval_tasks import RETRIEVAL_TASKS
    from retriever.index import Index

    rset = RETRIEVAL_TASKS["cranfield"].load(resolve_data_dir())
    documents = [Document(doc, text, title, "corpus", number)
                 for number, (doc, (title, text)) in enumerate(rset.corpus.items(), start=1)]
    queries = list(rset.queries.values())
    found = {"model": model, "machine": f"{platform.machine()}, {len(__import__('os').sched_getaffinity(0))} CPUs",
             "documents": len(documents), "queries": min(TIMED, len(queries) - WARM_UP)}
    with tempfile.TemporaryDirectory(prefix="retriever-runtime-") as folder, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Index.build(documents, "cranfield", Path(folder), model=model_path(model), device="cpu")
        indexes = {"torch (the old default)": Index.open("cranfield", folder, device="cpu", runtime="torch"),
                   "default": Index.open("cranfield", folder, device="cpu"),
                   SLEEPING: Index.open("cranfield", folder, device="cpu")}
        found["runtimes"] = {"torch (the old default)": "torch", "default": resolve_runtime("auto", "cpu"),
                             SLEEPING: resolve_runtime("auto", "cpu")}
        found["graph"] = _graph_kept(indexes["default"])
        found["config"] = f"as shipped (workers spin within a run, at most {SPIN_MICROSECONDS} us a wait, and stop at its end)"
        _workers_sleep(indexes[SLEEPING])
        found["quiet"] = _timed(indexes, queries)
        found[f"quiet, turns of {TURN}"] = _timed(indexes, queries, TURN)
        busy = subprocess.Popen([sys.executable, "-c", BUSY_LOOP])
        try:
            time.sleep(1.0)
            found["busy loop on one core"] = _timed(indexes, queries)
            found[f"busy loop on one core, turns of {TURN}"] = _timed(indexes, queries, TURN)
        finally:
            busy.kill()
            busy.wait()
    for load in LOADS:
        times = found[load]
        found[load]["ratio"] = round(times["default"] / times["torch (the old default)"], 2)
        found[load]["sleeping ratio"] = round(times[SLEEPING] / times["torch (the old default)"], 2)
    print(json.dumps(found), file=sys.stderr, flush=True)
    return found


def one_off(model: str, index_dir: Path, rounds: int = 5, calibrator: str = "auto") -> dict:
    """Seconds of a whole `retriever search "..."` process (start, model, one query, exit) per runtime, the
    runtimes taking turns; the Cranfield index (with CALIBRATOR) built into INDEX_DIR first if it is not there.
    torch is the old default of a one-query search; auto, today's, encodes from the kept kit (`encode.query_kit`)."""
    from retriever.index import Index
    from retriever.versions.catalog import calibrator_label

    name, query = _cranfield_index(model, index_dir, calibrator)
    command = [str(Path(sys.executable).parent / "retriever"), "search", query, "--name", name,
               "--index-dir", str(index_dir), "-k", "3"]
    subprocess.run([*command, "--runtime", "onnx"], check=True, capture_output=True)  # the graph exported, kept
    seconds = {runtime: [] for runtime in ("torch", "onnx", "auto")}
    for _ in range(rounds):
        for runtime, taken in seconds.items():
            started = time.perf_counter()
            subprocess.run([*command, "--runtime", runtime], check=True, capture_output=True)
            taken.append(time.perf_counter() - started)
    found = {"model": model, "machine": f"{platform.machine()}, {len(__import__('os').sched_getaffinity(0))} CPUs",
             "rounds": rounds, "calibrator": calibrator_label(Index.open(name, index_dir).snapshot.manifest.calibrator),
             "one_off_seconds": {runtime: round(float(np.median(taken)), 2)
                                                   for runtime, taken in seconds.items()}}
    print(json.dumps(found), file=sys.stderr, flush=True)
    return found


def _cranfield_index(model: str, index_dir: Path, calibrator: str) -> tuple[str, str]:
    """The name of the Cranfield index with CALIBRATOR in INDEX_DIR, built there first if it is not, and a
    question of its."""
    from retriever.corpus import Document
    from retriever.evaluation.data import resolve_data_dir
    from retriever.evaluation.retrieval_tasks import RETRIEVAL_TASKS
    from retriever.index import Index

    rset = RETRIEVAL_TASKS["cranfield"].load(resolve_data_dir())
    name = "cranfield" if calibrator == "auto" else f"cranfield-{calibrator}"
    if not (index_dir / name).exists():
        documents = [Document(doc, text, title, "corpus", number)
                     for number, (doc, (title, text)) in enumerate(rset.corpus.items(), start=1)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            Index.build(documents, name, index_dir, model=model_path(model), device="cpu", calibrator=calibrator)
    return name, next(iter(rset.queries.values()))


def one_off_codes(model: str, index_dir: Path, codes: list[Path], rounds: int = 7, calibrator: str = "flow") -> dict:
    """Seconds of a whole `retriever search "..."` process (the default runtime) of each checkout of CODES in turn,
    on one Cranfield index (with CALIBRATOR) that this checkout builds into INDEX_DIR first if it is not there; and
    whether each checkout's process imported torch."""
    from retriever.index import Index
    from retriever.versions.catalog import calibrator_label

    name, query = _cranfield_index(model, index_dir, calibrator)
    argv = ["retriever", "search", query, "--name", name, "--index-dir", str(index_dir), "-k", "3"]

    def command(code: Path) -> list[str]:
        return [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(code.resolve())!r}); sys.argv = {argv!r}; "
                "from cli.main import main\ntry:\n    main()\n"
                "finally:\n    print('torch' in sys.modules, file=sys.stderr)"]

    loads_torch = {}
    for code in codes:  # each once untimed: the ONNX graph exported and kept
        loads_torch[str(code)] = subprocess.run(command(code), check=True, capture_output=True,
                                                text=True).stderr.strip().splitlines()[-1] == "True"
    seconds = {str(code): [] for code in codes}
    for _ in range(rounds):
        for code in codes:
            started = time.perf_counter()
            subprocess.run(command(code), check=True, capture_output=True)
            seconds[str(code)].append(time.perf_counter() - started)
    hits = {str(code): _every_question_hits(code, name, index_dir) for code in codes}
    base = hits[str(codes[0])]
    found = {"model": model, "machine": f"{platform.machine()}, {len(__import__('os').sched_getaffinity(0))} CPUs",
             "rounds": rounds, "calibrator": calibrator_label(Index.open(name, index_dir).snapshot.manifest.calibrator),
             "questions": len(base) // len(MODES_COMPARED), "modes": list(MODES_COMPARED),
             "codes": {code: {"commit": _commit(Path(code)), "median_s": round(float(np.median(taken)), 2),
                              "imports_torch": loads_torch[code],
                              "hit_lists_differing": sum(mine != theirs for mine, theirs in zip(
                                  [[doc for doc, _ in found] for found in hits[code]],
                                  [[doc for doc, _ in found] for found in base])),
                              "largest_score_difference": max(
                                  (abs(a[1] - b[1]) for mine, theirs in zip(hits[code], base)
                                   for a, b in zip(mine, theirs)), default=0.0)}
                       for code, taken in seconds.items()}}
    print(json.dumps(found), file=sys.stderr, flush=True)
    return found


MODES_COMPARED = ("dense", "hybrid")


def _every_question_hits(code: Path, name: str, index_dir: Path) -> list[list[list]]:
    """Every Cranfield question's top 10 (doc id, score) in each of MODES_COMPARED, searched by CODE's checkout
    through `Index.open(name).search`."""
    script = (f"import json, sys; sys.path.insert(0, {str(code.resolve())!r})\n"
              "from retriever.evaluation.data import resolve_data_dir\n"
              "from retriever.evaluation.retrieval_tasks import RETRIEVAL_TASKS\n"
              "from retriever.index import Index\n"
              f"index = Index.open({name!r}, {str(index_dir)!r})\n"
              "questions = list(RETRIEVAL_TASKS['cranfield'].load(resolve_data_dir()).queries.values())\n"
              f"print(json.dumps([[[hit.doc_id, hit.score] for hit in index.search(question, k=10, mode=mode)]"
              f" for mode in {list(MODES_COMPARED)!r} for question in questions]))")
    return json.loads(subprocess.run([sys.executable, "-c", script], check=True, capture_output=True,
                                     text=True).stdout)


def _commit(code: Path) -> str:
    return subprocess.run(["git", "-C", str(code), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


def report(files: list[Path]) -> str:
    lines = ["# Queries on the fastest runtime (issue 56)", "",
             f"{generated_from(__file__, files)}.", ""]
    for path in files:
        found = json.loads(path.read_text())
        if "codes" in found:
            lines += [f"## A one-off `retriever search \"...\"`, one checkout against another ({found['machine']}, "
                      f"{found['model']}, calibrator {found['calibrator'].partition(' (')[0]})", "",
                      "Command: `python benchmarks/query_runtime.py codes --codes A,B --index-dir DIR`. The whole "
                      "process (start, one Cranfield question, exit) with the default runtime, each checkout's code "
                      f"on the same index in turn, median of {found['rounds']} rounds; ONNX Runtime's graph and query "
                      "kit already kept. Then every Cranfield question searched by each checkout's "
                      f"`Index.search` ({', '.join(found['modes'])}, top 10), against the first checkout's.", "",
                      "| checkout | median s | imports torch | hit lists differing from the first's | largest score "
                      "difference |", "|---|---:|---|---:|---:|"]
            lines += [f"| {run['commit']} | {run['median_s']:.2f} | {'yes' if run['imports_torch'] else 'no'} | "
                      f"{run['hit_lists_differing']} of {found['questions'] * len(found['modes'])} | "
                      f"{run['largest_score_difference']:.1e} |" for run in found["codes"].values()]
            first, *others = found["codes"].values()
            lines += [f"\n{other['commit']} against {first['commit']}: {other['median_s'] / first['median_s']:.2f}x."
                      for other in others] + [""]
        elif "one_off_seconds" in found:
            taken = found["one_off_seconds"]
            lines += [f"## A one-off `retriever search \"...\"` ({found['machine']}, {found['model']}"
                      + (f", calibrator {found['calibrator'].partition(' (')[0]}" if "calibrator" in found else "")
                      + ")", "",
                      "Command: `python benchmarks/query_runtime.py cli --index-dir DIR"
                      + (f" --calibrator {found['calibrator']}`" if found.get("calibrator") == "flow" else "`")
                      + ". The whole process (start, model, one Cranfield question, exit), median of "
                      f"{found['rounds']} rounds, the runtimes taking turns, ONNX Runtime's graph already kept"
                      + (" and its query kit (issue 58): onnx and auto load no model"
                         if "calibrator" in found else "") + ".", "",
                      "| --runtime torch, s | --runtime onnx, s | --runtime auto (the default), s |", "|---:|---:|---:|",
                      f"| {taken['torch']:.2f} | {taken['onnx']:.2f} | {taken['auto']:.2f} |", ""]
        elif found.get("documents") is True:
            controls = [key for key in found["tasks"][0] if key.startswith("torch, batch")]
            lines += [f"## Documents on the fastest runtime: same vectors, same rankings ({found['model']}, "
                      f"`{path.name}`)", "",
                      "Command: `python benchmarks/query_runtime.py documents`"
                      + (f" (`--tasks ... --control-batches {','.join(key.rpartition(' ')[2] for key in controls)}`)"
                         if controls else "") + ". Each task built and searched end to end on each runtime: every "
                      "text (documents, passages, auto's pseudo-queries, the queries) encoded by that runtime in "
                      "batches, as a build encodes, none read from the disk cache; the lowest cosine between the two "
                      "runtimes' document vectors; nDCG@10 x100 of each's default search of a default build; "
                      "seconds encoding the documents."
                      + (" Controls: PyTorch at other batch sizes, whose padding moves the vectors' last bits as "
                         "another runtime does (float rounding alone), against PyTorch at the default batch size."
                         if controls else ""), "",
                      "| task | documents | lowest cosine | nDCG@10: torch | onnx | difference | "
                      + "".join(f"{key}: difference | " for key in controls) + "encode s: torch | onnx |",
                      "|---|---:|---:|---:|---:|---:|" + "---:|" * len(controls) + "---:|---:|"]
            for task in found["tasks"]:
                lines.append(f"| {task['task']} | {task['documents']:,} | {task['min_cosine']:.7f} | "
                             f"{task['torch']:.2f} | {task['onnx']:.2f} | {task['onnx'] - task['torch']:+.2f} | "
                             + "".join(f"{task[key] - task['torch']:+.2f} | " for key in controls)
                             + f"{task['encode_s']['torch']:.2f} | {task['encode_s']['onnx']:.2f} |")
            if "calibrators" in found["tasks"][0]:
                lines += ["", "Calibrator each build chose: " + "; ".join(
                    f"{task['task']}: " + ", ".join(f"{runtime} {name}" for runtime, name in task["calibrators"].items())
                    for task in found["tasks"]) + "."]
            worst_cosine = min(task["min_cosine"] for task in found["tasks"])
            worst = max(abs(task["onnx"] - task["torch"]) for task in found["tasks"])
            total = {runtime: sum(task["encode_s"][runtime] for task in found["tasks"]) for runtime in ("torch", "onnx")}
            lines += ["", f"Lowest cosine over every document of the {len(found['tasks'])} tasks: {worst_cosine:.7f}; "
                      f"largest nDCG@10 difference: {worst:.2f}; encoding every task's documents: "
                      f"{total['onnx']:.1f} s on ONNX Runtime against {total['torch']:.1f} s on PyTorch "
                      f"({total['onnx'] / total['torch']:.2f}x).", ""]
        elif "tasks" in found:
            lines += [f"## Same vectors, same rankings ({found['model']}, `{path.name}`)", "",
                      "Command: `python benchmarks/query_runtime.py agree`. Each query encoded alone by PyTorch and "
                      "by ONNX Runtime; nDCG@10 x100 of the default search of a default build (documents encoded by "
                      "PyTorch) with each runtime's query vectors.", "",
                      "| task | queries | lowest cosine | mean cosine | nDCG@10: torch | onnx | difference |",
                      "|---|---:|---:|---:|---:|---:|---:|"]
            for task in found["tasks"]:
                lines.append(f"| {task['task']} | {task['queries']:,} | {task['min_cosine']:.7f} | "
                             f"{task['mean_cosine']:.7f} | {task['torch']:.2f} | {task['onnx']:.2f} | "
                             f"{task['onnx'] - task['torch']:+.2f} |")
            worst_cosine = min(task["min_cosine"] for task in found["tasks"])
            worst = max(abs(task["onnx"] - task["torch"]) for task in found["tasks"])
            lines += ["", f"Lowest cosine over every query of the {len(found['tasks'])} tasks: {worst_cosine:.7f}; "
                      f"largest nDCG@10 difference: {worst:.2f}.", ""]
        else:
            lines += [f"## Query p50 through `Index.open(name).search([q])` ({found['machine']}, {found['model']}, "
                      f"`{path.name}`)", "",
                      f"Command: `python benchmarks/query_runtime.py p50`. Cranfield ({found['documents']:,} abstracts, "
                      f"a default build), {found['queries']} of its questions one at a time after {WARM_UP} untimed, "
                      f"the {'three' if SLEEPING in found['runtimes'] else 'two'} indexes taking turns query by query (and, where shown, every 20 queries); runtimes: "
                      + ", ".join(f"{label}: {runtime}" for label, runtime in found["runtimes"].items()) + ". "
                      + f"ONNX Runtime's settings: {found.get('config', 'as shipped (threads sleep when idle)')}"
                      + (f"; its graph: {found['graph']}" if "graph" in found else "") + ".", "",
                      "| load | torch (the old default), ms | default, ms | ratio |"
                      + (" default with workers sleeping (before), ms | ratio |" if SLEEPING in found["runtimes"] else ""),
                      "|---|---:|---:|---:|" + ("---:|---:|" if SLEEPING in found["runtimes"] else "")]
            for load in (load for load in LOADS if load in found):
                times = found[load]
                lines.append(f"| {load} | {times['torch (the old default)']:.2f} | {times['default']:.2f} | "
                             f"{times['ratio']:.2f}x |" + (f" {times[SLEEPING]:.2f} | {times['sleeping ratio']:.2f}x |"
                                                          if SLEEPING in times else ""))
            lines.append("")
    return "\n".join(lines)


def main() -> None:
    def agree_arguments(agreeing: argparse.ArgumentParser) -> None:
        agreeing.add_argument("--model", default="minilm")
        agreeing.add_argument("--seed", type=int, default=0)

    def documents_arguments(documents: argparse.ArgumentParser) -> None:
        agree_arguments(documents)
        documents.add_argument("--tasks", default=None, help="comma-separated labeled tasks (default: all 14)")
        documents.add_argument("--control-batches", default=None,
                               help="comma-separated batch sizes PyTorch also encodes at (float rounding alone)")

    def p50_arguments(timing: argparse.ArgumentParser) -> None:
        timing.add_argument("--model", default="minilm")

    def cli_arguments(cli: argparse.ArgumentParser) -> None:
        cli.add_argument("--model", default="minilm")
        cli.add_argument("--index-dir", type=Path, required=True)
        cli.add_argument("--calibrator", default="auto")

    def codes_arguments(codes: argparse.ArgumentParser) -> None:
        codes.add_argument("--model", default="minilm")
        codes.add_argument("--codes", required=True, help="two or more checkouts, comma-separated, the first the base")
        codes.add_argument("--index-dir", type=Path, required=True)
        codes.add_argument("--calibrator", default="flow")
        codes.add_argument("--rounds", type=int, default=7)

    study_main(__file__, __doc__, report,
               codes=(codes_arguments, lambda args: one_off_codes(
                   args.model, args.index_dir, [Path(code) for code in args.codes.split(",")], args.rounds,
                   args.calibrator)),
               agree=(agree_arguments, lambda args: agree(args.model, args.seed)),
               documents=(documents_arguments, lambda args: agree_documents(
                   args.model, args.seed, args.tasks.split(",") if args.tasks else None,
                   [int(batch) for batch in args.control_batches.split(",")] if args.control_batches else None)),
               p50=(p50_arguments, lambda args: p50(args.model)),
               cli=(cli_arguments, lambda args: one_off(args.model, args.index_dir, calibrator=args.calibrator)))


if __name__ == "__main__":
    main()
