"""The benchmark runner behind ``retriever bench``: text -> encoder -> calibrator -> cosine -> evaluator.

    plan = plan_benchmark("sts", calibrators="none,flow")          # validates everything, loads no model
    report = run_benchmark(plan, CachedEncoder(Encoder(max_length=64), cache_dir))
    report.to_json(); score_table(report.results)

For each dataset, the sentences the calibrators are fitted on (``fit_on``) and those of the evaluation split
are encoded once, through the embedding cache. Each calibrator is then fitted (seeded) on the fit set, per
dataset, and applied to the evaluation sentences, and cosine similarities are scored by the evaluators.

``fit_on``:
- ``target`` (the paper's "flow (target)"): every distinct sentence of the dataset, all splits, no labels;
- ``train``: the sentences of the train split only (datasets without one are refused);
- a file path: any unlabeled sentences, one per line; the same fit set serves every dataset.
"""

from __future__ import annotations

import math
import os
import platform
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from retriever.errors import RetrieverError, param
from retriever.evaluation.data import PairSubset, Task, resolve_data_dir
from retriever.evaluation.evaluators import cosine_rows, evaluate, spearman_x100
from retriever.evaluation.retrieval import RetrievalTask, evaluate_searches
from retriever.evaluation.registry import TASKS, resolve_tasks
from retriever.versions.integrity import sha256_file

DEFAULT_CALIBRATORS = ("none", "auto")
FIT_ON_SPLITS = ("target", "train")
# The dataset, split and edit-distance cut of the paper's lexical analysis (Table 6, Figure 2).
LEXICAL_TASK, LEXICAL_SPLIT, LEXICAL_MAX_DISTANCE = "stsb", "dev", 4
# Names the BERT-flow tables use.
DISPLAY_NAMES = {
    "stsb": "STS-B", "sickr": "SICK-R", "sts12": "STS-12", "sts13": "STS-13", "sts14": "STS-14",
    "sts15": "STS-15", "sts16": "STS-16", "qnli": "QNLI", "qnli-retrieval": "QNLI-R", "stsb-dup": "STS-B dup",
    "sickr-dup": "SICK-R dup",
}


def check_plot_path(path: Path) -> None:
    """Refuse a figure's PATH before anything is computed (it was refused, or written elsewhere, after the run): a
    folder, or a name whose extension is no format matplotlib writes (where matplotlib is missing, the plot says
    so itself)."""
    if path.is_dir():
        raise RetrieverError(f"{param('plot')} {path} is a folder; name the figure's file, e.g. "
                             f"{path / 'figure.png'}")
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        return
    formats = sorted(FigureCanvasBase.get_supported_filetypes())
    if path.suffix.lower().lstrip(".") not in formats:
        raise RetrieverError(f"{param('plot')} {path}: its extension names the figure's format, one of "
                             f"{', '.join('.' + name for name in formats)}")


@dataclass(frozen=True)
class BenchPlan:
    """What to run, checked before any model is loaded so bad input fails in a second, not after a download."""

    tasks: list[Task]
    calibrators: list[str]
    data_dir: Path
    layout: str | None = None  # None: each dataset's own default layout
    fit_on: str = "target"  # "target", "train" or a file path
    seed: int = 0
    limit: int | None = None  # first N pairs of every file: smoke tests only, scores are not comparable
    lexical: bool = False
    plot: Path | None = None
    fit_queries: bool = False  # retrieval: fit on each corpus plus its queries (unlabeled)
    modes: tuple[str, ...] = ("dense",)  # retrieval: the search modes scored on each index

    def layout_of(self, task: Task) -> str:
        """The requested layout where the dataset has it (STS-B, SICK-R), else the dataset's only one."""
        return self.layout if self.layout in task.layouts else task.default_layout


def plan_benchmark(
    datasets: str = "all",
    calibrators: str | Sequence[str] = DEFAULT_CALIBRATORS,
    data_dir: str | os.PathLike | None = None,
    layout: str | None = None,
    fit_on: str = "target",
    seed: int = 0,
    limit: int | None = None,
    lexical: bool = False,
    plot: str | os.PathLike | None = None,
    fit_queries: bool = False,
    modes: str | Sequence[str] = "dense",
) -> BenchPlan:
    """Check datasets, data folder, calibrator names, layout, fit set and search modes; raise one clear
    RetrieverError."""
    tasks = resolve_tasks(datasets)
    folder = resolve_data_dir(data_dir)
    from retriever.calibration import make_calibrator  # imports the calibrators: after the checks that need nothing

    names = parse_calibrators(calibrators)
    for name in names:
        make_calibrator(name, seed=seed)  # unknown names raise here, before the model loads
    if layout is not None:
        known = sorted({name for task in TASKS.values() for name in task.layouts})
        if layout not in known:
            raise RetrieverError(f"unknown layout {layout!r}; choose one of {', '.join(known)}", parameter="layout")
    if fit_on == "train":
        without = [task.name for task in tasks if isinstance(task, Task) and "train" not in task.splits]
        if without:
            raise RetrieverError(
                f"{param('fit_on', 'train')}: {', '.join(without)} {'has' if len(without) == 1 else 'have'} no "
                f"train split (only evaluation data); use {param('fit_on', 'target')} or a file of sentences"
            )
    elif fit_on != "target":
        path = Path(fit_on).expanduser()
        if not path.is_file():
            raise RetrieverError(f"{param('fit_on')} must be target, train or a file of sentences; {fit_on} is not a "
                                 "file")
        fit_on = str(path)
    if fit_queries and not any(isinstance(task, RetrievalTask) for task in tasks):
        raise RetrieverError(f"{param('fit_queries')} applies to retrieval tasks (qnli-retrieval, stsb-dup, sickr-dup, "
                             "beir PATH); none was asked for")
    if limit is not None and limit < 2:
        raise RetrieverError(f"{param('limit')} must be at least 2 pairs (got {limit})")
    if plot:
        check_plot_path(Path(plot))
    from retriever.search.options import MODES

    modes = [part.strip().lower() for part in (modes.split(",") if isinstance(modes, str) else modes) if part.strip()]
    unknown = [mode for mode in modes if mode not in MODES]
    if unknown or not modes:
        raise RetrieverError(f"{param('modes')}: {', '.join(unknown) or 'none given'}; known: {', '.join(MODES)}")
    return BenchPlan(tasks, names, folder, layout, fit_on, seed, limit, lexical, Path(plot) if plot else None,
                     fit_queries, tuple(dict.fromkeys(modes)))


def parse_calibrators(calibrators: str | Sequence[str]) -> list[str]:
    parts = calibrators.split(",") if isinstance(calibrators, str) else list(calibrators)
    names = list(dict.fromkeys(part.strip().lower() for part in parts if part.strip()))
    if not names:
        raise RetrieverError(f"no calibrator given; e.g. {param('calibrators', 'none,flow')}")
    return names


@dataclass
class BenchReport:
    """Everything a run produced; ``to_json()`` is the ``--json`` document."""

    settings: dict  # model, pooling, layers, max_length, dtype, seed, calibrators, fit_on, layouts (, limit)
    results: list[dict]  # flat records: dataset, split, calibrator, metric, aggregation, score
    fit_sets: dict[str, dict]  # dataset -> {"source", "sentences"}: what each dataset's calibrators saw
    data_checksums: dict[str, str]  # data file (relative to the data folder) -> sha256
    lexical: dict | None = None
    plot: str | None = None
    seconds: dict[str, float] = field(default_factory=dict)  # wall time per dataset (not in the JSON)
    decisions: dict[str, dict] = field(default_factory=dict)  # dataset -> {calibrator: auto's decision}

    def to_json(self) -> dict:
        document = {
            **self.settings,
            "versions": versions(),
            "data_checksums": self.data_checksums,
            "fit_sets": self.fit_sets,
            # What each `auto` fit chose and why, per dataset (absent without auto).
            **({"decisions": self.decisions} if self.decisions else {}),
            "results": self.results,
        }
        if self.lexical is not None:
            document["lexical"] = self.lexical
        return document


def run_benchmark(
    plan: BenchPlan, encoder, progress: bool = True, log: Callable[[str], None] | None = None
) -> BenchReport:
    """Run the plan with ``encoder`` (an ``Encoder`` or a ``CachedEncoder``); progress and ``log`` go to stderr."""
    from retriever.evaluation.cache import CachedEncoder

    if not isinstance(encoder, CachedEncoder):
        encoder = CachedEncoder(encoder)  # in memory only: still encode each sentence once per run
    return _Run(plan, encoder, progress, log or (lambda message: None)).run()


class _Run:
    """One benchmark run: holds the loaded splits, fit sets and fitted calibrators so each is made once."""

    def __init__(self, plan: BenchPlan, encoder, progress: bool, log: Callable[[str], None]):
        self.plan = plan
        self.encoder = encoder
        self.progress = progress
        self.log = log
        self.checksums: dict[str, str] = {}
        self.fit_sets: dict[str, dict] = {}
        self.decisions: dict[str, dict] = {}
        self._splits: dict[str, dict[str, list[PairSubset]]] = {}
        self._fit_sentences: dict[str, list[str]] = {}
        self._file_sentences: list[str] | None = None
        self._fitted: dict[tuple[str, str], object] = {}  # (dataset or "file", calibrator) -> fitted

    def run(self) -> BenchReport:
        results, seconds = [], {}
        for task in self.plan.tasks:
            start = time.perf_counter()
            results += self.evaluate_retrieval(task) if isinstance(task, RetrievalTask) else self.evaluate_task(task)
            seconds[task.name] = time.perf_counter() - start
        lexical = plot = None
        if self.plan.lexical or self.plan.plot:
            start = time.perf_counter()
            analysis = self.lexical_analysis()
            lexical = analysis["table"] if self.plan.lexical else None
            if self.plan.plot:
                from retriever.evaluation.plots import plot_lexical_and_spectrum

                plot = str(plot_lexical_and_spectrum(self.plan.plot, **analysis["plot"]))
                self.log(f"wrote {plot}")
            seconds["lexical"] = time.perf_counter() - start
        settings = {key: value for key, value in self.encoder_config().items() if key != "dim"}
        from retriever.calibration import make_calibrator

        settings.update(
            seed=self.plan.seed,
            # Each calibrator's hyperparameters (the flow's epochs, batch size, ...), as fitted in this run.
            calibrators={name: make_calibrator(name, seed=self.plan.seed).config() for name in self.plan.calibrators},
            fit_on=self.plan.fit_on,
            layouts={task.name: self.plan.layout_of(task) for task in self.plan.tasks if isinstance(task, Task)},
        )
        if self.plan.limit is not None:
            settings["limit"] = self.plan.limit
        if self.plan.fit_queries:
            settings["fit_queries"] = True
        return BenchReport(settings, results, self.fit_sets, dict(sorted(self.checksums.items())), lexical, plot,
                           seconds, self.decisions)

    def encoder_config(self) -> dict:
        return self.encoder.encoder.config()

    # --- one dataset ---------------------------------------------------------------------------------------

    def evaluate_task(self, task: Task) -> list[dict]:
        subsets = self.splits(task)[task.eval_split]
        fit_sentences = self.fit_sentences(task)
        # One encode call for everything this dataset needs; every later call is a cache hit.
        self.embed([*fit_sentences, *_distinct_sentences(subsets)], description=f"{task.name}: encoding")
        records = []
        for name in self.plan.calibrators:
            calibrator = self.fitted(task, name)
            for record in evaluate(task, subsets, lambda texts: calibrator.transform(self.embed(texts))):
                if not math.isfinite(record["score"]):  # e.g. a diverged flow: NaN vectors; JSON has no NaN
                    self.log(f"{task.name}: {name} gave non-finite similarities; its {record['aggregation']} "
                             "score is left empty (null)")
                    record["score"] = None
                records.append({**record, "calibrator": name})
        self.log(_summary(task, records, self.plan.calibrators))
        return [_ordered(record) for record in records]

    def evaluate_retrieval(self, task: RetrievalTask) -> list[dict]:
        """Build an index of the task's corpus per calibrator (fitted on that corpus, as `retriever build` fits)
        and search every query through it: nDCG@10, Recall@100, MRR@10. --fit-on does not apply: an index is
        always fitted on its own documents (with --fit-queries, plus the task's queries). --limit keeps the first N queries (and the whole corpus)."""
        from retriever.corpus import Document, document_text

        rset = task.load(self.plan.data_dir)
        if self.plan.limit is not None:
            kept = list(rset.queries)[: self.plan.limit]
            rset = replace(rset, queries={q: rset.queries[q] for q in kept}, qrels={q: rset.qrels[q] for q in kept})
        self.fit_sets[task.name] = {"source": "corpus+queries" if self.plan.fit_queries else "corpus",
                                    "sentences": len(rset.corpus) + (len(rset.queries) if self.plan.fit_queries else 0),
                                    **rset.describe()}
        texts = [document_text(Document(doc, text, title, "", 0)) for doc, (title, text) in rset.corpus.items()]
        self.embed([*texts, *rset.queries.values()], description=f"{task.name}: encoding")
        records = []
        for name in self.plan.calibrators:
            self.log(f"{task.name}: indexing {len(rset.corpus):,} documents with {name}, searching "
                     f"{len(rset.queries):,} queries")
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                by_mode = evaluate_searches(rset, self.embed, self.encoder, name,
                                            {mode: {"mode": mode} for mode in self.plan.modes}, self.plan.seed,
                                            fit_queries=self.plan.fit_queries,
                                            on_fitted=lambda fitted: self.record_decision(task.name, name, fitted))
            for warning in caught:
                self.log(f"{task.name}: {name}: {warning.message}")
            records += [{"dataset": task.name, "split": task.split, "calibrator": name, "mode": mode,
                         "metric": metric, "aggregation": task.split, "score": score}
                        for mode, scores in by_mode.items() for metric, score in scores.items()]
        main = {row_label(r): r["score"] for r in records if r["metric"] == task.main_metric}
        self.log(f"{task.name} ({task.main_metric}): " + ", ".join(f"{n} {format_score(main[n])}" for n in main))
        return [_ordered(record) for record in records]

    def record_decision(self, dataset: str, name: str, calibrator) -> None:
        """Keep (and log) what an `auto` calibrator chose for DATASET, and why."""
        decision = getattr(calibrator, "decision", None)
        if decision:
            from retriever.calibration import describe_decision

            self.decisions.setdefault(dataset, {})[name] = decision
            self.log(f"{dataset}: {describe_decision(decision)}")

    def splits(self, task: Task) -> dict[str, list[PairSubset]]:
        """Every split of ``task`` (parsed once), cut to ``limit`` pairs per file; records file checksums."""
        if task.name not in self._splits:
            layout = self.plan.layout_of(task)
            if self.plan.layout not in (None, layout):
                self.log(f"{task.name}: no {self.plan.layout} layout here; using {layout}")
            splits = task.load(self.plan.data_dir, layout)
            if self.plan.limit is not None:
                splits = {split: [_head(s, self.plan.limit) for s in subsets] for split, subsets in splits.items()}
            folder = task.layout_dir(self.plan.data_dir, layout)
            for specs in task.splits.values():
                for spec in specs:
                    for name in spec.files:
                        path = folder / name
                        self.checksums[path.relative_to(self.plan.data_dir).as_posix()] = sha256_file(path)
            self._splits[task.name] = splits
        return self._splits[task.name]

    def fit_sentences(self, task: Task) -> list[str]:
        """The unlabeled sentences ``task``'s calibrators are fitted on, per ``fit_on`` (computed once)."""
        if task.name not in self._fit_sentences:
            fit_on = self.plan.fit_on
            if fit_on == "target":  # = task.all_sentences(), from the already parsed (and limited) splits
                sentences = _distinct_sentences([s for subsets in self.splits(task).values() for s in subsets])
            elif fit_on == "train":
                sentences = _distinct_sentences(self.splits(task)["train"])
            else:
                sentences = self.file_sentences()
            self._fit_sentences[task.name] = sentences
            self.fit_sets[task.name] = {"source": fit_on, "sentences": len(sentences)}
        return self._fit_sentences[task.name]

    def file_sentences(self) -> list[str]:
        """``--fit-on FILE``: its distinct non-blank lines, stripped. Read once, shared by every dataset."""
        if self._file_sentences is None:
            path = Path(self.plan.fit_on)
            try:
                text = path.read_bytes().decode("utf-8-sig")
            except UnicodeDecodeError as error:
                raise RetrieverError(f"{param('fit_on', str(path))}: not UTF-8 at byte {error.start}") from None
            except OSError as error:
                raise RetrieverError(f"{param('fit_on', str(path))}: cannot read ({error.strerror or error})") from None
            sentences = list(dict.fromkeys(line.strip() for line in text.split("\n") if line.strip()))
            if len(sentences) < 2:
                raise RetrieverError(f"{param('fit_on', str(path))}: needs at least 2 non-blank lines "
                                     f"(found {len(sentences)})")
            self.checksums[str(path)] = sha256_file(path)
            self._file_sentences = sentences
        return self._file_sentences

    def fitted(self, task: Task, name: str):
        """Calibrator ``name`` fitted on ``task``'s fit set, once per run (a file fit set is shared by all), as the
        index fits: on at most the default fit sample of its vectors."""
        from retriever.calibration import DEFAULT_FIT_SAMPLE, fit_on_sample, make_calibrator
        from retriever.engines.stages import check_set

        sentences = self.fit_sentences(task)
        fit_set = "file" if self.plan.fit_on not in FIT_ON_SPLITS else task.name
        if (fit_set, name) not in self._fitted:
            self.log(f"{task.name}: fitting {name} on {len(sentences):,} sentences ({self.plan.fit_on})")
            calibrator = make_calibrator(name, seed=self.plan.seed, device=str(self.encoder.encoder.device))
            vectors = self.embed(sentences)
            # auto checks its candidates on pseudo-queries cut from the same sentences, through the same encoder.
            check = check_set(calibrator, len(sentences), lambda positions: [(None, sentences[i]) for i in positions],
                              lambda positions: vectors[positions], self.encoder, self.plan.seed)
            with warnings.catch_warnings(record=True) as caught:  # e.g. whitening on fewer vectors than dims
                warnings.simplefilter("always")
                self._fitted[(fit_set, name)] = fit_on_sample(calibrator, vectors, DEFAULT_FIT_SAMPLE, self.plan.seed,
                                                              check)
            self.record_decision(fit_set, name, self._fitted[(fit_set, name)])
            for warning in caught:
                self.log(f"{task.name}: {name}: {warning.message}")
        return self._fitted[(fit_set, name)]

    def embed(self, texts: Sequence[str], description: str = "Encoding") -> np.ndarray:
        return self.encoder.encode(texts, progress=self.progress, description=description)

    # --- the paper's lexical analysis (Table 6) and Figure 2 ------------------------------------------------

    def lexical_analysis(self) -> dict:
        """STS-B dev: Spearman of each similarity (gold, raw, calibrated) with word edit distance and with gold."""
        from retriever.evaluation.lexical import lexical_analysis, word_edit_distances

        task = TASKS[LEXICAL_TASK]
        (subset,) = self.splits(task)[LEXICAL_SPLIT]
        sentences = _distinct_sentences([subset])
        self.embed(sentences, description="stsb dev: encoding")
        calibrated, similarities = {}, {}
        for name in self.plan.calibrators:
            calibrator = self.fitted(task, name)
            calibrated[name] = calibrator.transform(self.embed(sentences))  # for the spectrum plot
            similarities[name] = cosine_rows(calibrator.transform(self.embed(subset.sent1)),
                                             calibrator.transform(self.embed(subset.sent2)))
        everything = lexical_analysis(subset.sent1, subset.sent2, subset.labels, similarities)
        distances = word_edit_distances(subset.sent1, subset.sent2)
        close = int((distances <= LEXICAL_MAX_DISTANCE).sum())
        near = (
            lexical_analysis(subset.sent1, subset.sent2, subset.labels, similarities, LEXICAL_MAX_DISTANCE)
            if close >= 3 else {}
        )
        rows = []
        for name in ["gold", *self.plan.calibrators]:
            values = subset.labels if name == "gold" else similarities[name]
            rows.append({
                "similarity": name,
                "edit_distance": _finite_or_none(everything[name]),
                f"edit_distance_le{LEXICAL_MAX_DISTANCE}": _finite_or_none(near.get(name)),
                "gold": _finite_or_none(spearman_x100(values, subset.labels)),
            })
        table = {
            "dataset": task.name,
            "split": LEXICAL_SPLIT,
            "pairs": len(subset),
            f"pairs_edit_distance_le{LEXICAL_MAX_DISTANCE}": close,
            "rows": rows,
        }
        plot = {
            "gold": subset.labels,
            "similarities": similarities,
            "distances": distances,
            "vectors": calibrated,
            "max_distance": LEXICAL_MAX_DISTANCE,
            "title": _plot_title(self.encoder_config(), self.plan),
        }
        return {"table": table, "plot": plot}


# --- tables --------------------------------------------------------------------------------------------------


def score_table(results: Sequence[dict]) -> tuple[list[str], list[list[str | float | None]]]:
    """The paper's Table 2 layout: a row per calibrator; a column per dataset (both aggregations for STS12–16),
    the average of the STS datasets' main scores (wmean for STS12–16), then QNLI's AUC."""
    main = {task.name: task.main_aggregation for task in TASKS.values()}
    columns: list[tuple[str, str]] = []
    for record in results:
        column = (record["dataset"], record["aggregation"])
        if column not in columns and record["metric"] in ("spearman", "auc", "ndcg@10"):
            columns.append(column)
    sts = [c for c in columns if c[0] in TASKS and TASKS[c[0]].metric == "spearman"]
    other = [c for c in columns if c not in sts]
    sts_main = [c for c in sts if main.get(c[0]) == c[1]]
    scores = {(r["calibrator"], r["dataset"], r["aggregation"]): r["score"] for r in results
              if r["metric"] in ("spearman", "auc", "ndcg@10")}
    calibrators = list(dict.fromkeys(r["calibrator"] for r in results))
    headers = ["calibrator", *(_column_name(*c) for c in sts)]
    if len(sts_main) > 1:
        headers.append("avg")
    headers += [_column_name(*c) for c in other]
    rows = []
    for name in calibrators:
        row = [name, *(scores.get((name, *c)) for c in sts)]
        if len(sts_main) > 1:
            values = [scores.get((name, *c)) for c in sts_main]
            row.append(float(np.mean(values)) if None not in values else None)
        row += [scores.get((name, *c)) for c in other]
        rows.append(row)
    return headers, rows


def retrieval_table(results: Sequence[dict]) -> tuple[list[str], list[list[str | float | None]]]:
    """Every retrieval metric: a row per calibrator (and search mode, beyond dense), a column per (dataset,
    metric); empty without retrieval."""
    retrieval = [r for r in results if r["metric"] in ("ndcg@10", "recall@100", "mrr@10")]
    columns = list(dict.fromkeys((r["dataset"], r["metric"]) for r in retrieval))
    scores = {(row_label(r), r["dataset"], r["metric"]): r["score"] for r in retrieval}
    labels = list(dict.fromkeys(row_label(r) for r in retrieval))
    headers = ["calibrator", *(f"{DISPLAY_NAMES.get(d, d)} {_METRIC_NAMES[m]}" for d, m in columns)]
    return headers, [[label, *(scores.get((label, *c)) for c in columns)] for label in labels]


def row_label(record: dict) -> str:
    """A retrieval record's row: its calibrator, and its search mode where that is not dense."""
    mode = record.get("mode", "dense")
    return record["calibrator"] if mode == "dense" else f"{record['calibrator']} ({mode})"


_METRIC_NAMES = {"ndcg@10": "nDCG@10", "recall@100": "R@100", "mrr@10": "MRR@10"}


def lexical_table(lexical: dict) -> tuple[list[str], list[list[str | float | None]]]:
    """The paper's Table 6: rows gold / raw / calibrated; Spearman with edit distance (all pairs, close pairs)
    and with gold similarity."""
    close = f"edit_distance_le{LEXICAL_MAX_DISTANCE}"
    headers = [
        "similarity",
        "vs edit distance",
        f"vs edit distance (≤{LEXICAL_MAX_DISTANCE}, {lexical[f'pairs_{close}']} pairs)",
        "vs gold",
    ]
    rows = [[row["similarity"], row["edit_distance"], row[close], row["gold"]] for row in lexical["rows"]]
    return headers, rows


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(["---"] + ["---:"] * (len(headers) - 1)) + "|"]
    lines += ["| " + " | ".join(format_score(value) for value in row) + " |" for row in rows]
    return "\n".join(lines)


def format_score(value) -> str:
    if value is None:
        return "–"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def versions() -> dict:
    import torch
    import transformers

    from retriever import __version__

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": np.__version__,
        "retriever": __version__,
        "python": platform.python_version(),
    }


# --- helpers -------------------------------------------------------------------------------------------------


def _column_name(dataset: str, aggregation: str) -> str:
    name = DISPLAY_NAMES.get(dataset, dataset)
    if aggregation in ("wmean", "all"):
        return f"{name} {aggregation}"
    if TASKS.get(dataset) is not None and TASKS[dataset].metric == "auc":
        return f"{name} (AUC)"
    if TASKS.get(dataset) is None:  # a retrieval task: its main metric
        return f"{name} nDCG@10"
    return name


def _summary(task: Task, records: list[dict], calibrators: list[str]) -> str:
    scores = {r["calibrator"]: r["score"] for r in records if r["aggregation"] == task.main_aggregation}
    return f"{task.name} ({task.main_aggregation}): " + ", ".join(f"{n} {format_score(scores[n])}" for n in calibrators)


def _ordered(record: dict) -> dict:
    keys = ("dataset", "split", "calibrator", "mode", "metric", "aggregation", "score")
    return {key: record[key] for key in keys if key in record}  # mode: retrieval records only


def _finite_or_none(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _distinct_sentences(subsets: Sequence[PairSubset]) -> list[str]:
    return list(dict.fromkeys(s for subset in subsets for s in (*subset.sent1, *subset.sent2)))


def _head(subset: PairSubset, limit: int) -> PairSubset:
    return PairSubset(subset.name, subset.sent1[:limit], subset.sent2[:limit], subset.labels[:limit])


def _plot_title(config: dict, plan: BenchPlan) -> str:
    pooling = f"layers {','.join(map(str, config['layers']))}" if config.get("layers") else config["pooling"]
    fit_on = plan.fit_on if plan.fit_on in FIT_ON_SPLITS else Path(plan.fit_on).name
    return f"{Path(config['model']).name}, {pooling}, max_length {config['max_length']}, fit on {fit_on}"
