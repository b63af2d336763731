"""Evaluation data: where it lives, how each file format is parsed, and the task declaration type.

Every parser returns a ``PairSubset`` (one scored file of sentence pairs). Parsers read text by hand with
``split('\\t')`` instead of the csv module because the STS files contain unbalanced quotes that make csv
quoting merge lines. Anything unexpected in a file raises ``RetrieverError`` naming the file and line, and
each task checks its pair counts at load time, so a damaged data folder cannot silently change scores.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from retriever.errors import RetrieverError, param

DATA_ENV_VAR = "RETRIEVER_DATA"
# The checkout sits next to the shared data folder: <root>/main (this repo) and <root>/shared/data.
_REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DATA_DIR = _REPO_ROOT.parent / "shared" / "data"
_HOW_TO_POINT = (f"pass {param('data_dir')} or set {DATA_ENV_VAR}=DIR (the folder holding stsb/, sick/, sts12/ "
                 "... qnli/)")


def resolve_data_dir(explicit: str | os.PathLike | None = None) -> Path:
    """The evaluation data folder: ``explicit``, else $RETRIEVER_DATA, else ../shared/data next to the repo."""
    if explicit is not None:
        path, origin = Path(explicit), "data folder"
    elif os.environ.get(DATA_ENV_VAR):
        path, origin = Path(os.environ[DATA_ENV_VAR]), f"{DATA_ENV_VAR} points to"
    else:
        path, origin = DEFAULT_DATA_DIR, "no evaluation data found: default data folder"
    if not path.is_dir():
        raise RetrieverError(f"{origin} {path} is not a folder; {_HOW_TO_POINT}")
    return path


@dataclass(frozen=True, eq=False)
class PairSubset:
    """One scored file of sentence pairs; ``labels`` holds gold scores (STS) or 0/1 classes (QNLI)."""

    name: str
    sent1: list[str]
    sent2: list[str]
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)


# --- reading lines ---------------------------------------------------------------------------------------


def _read_lines(path: Path) -> list[str]:
    """Lines without terminators; CRLF files (SICK test) read the same as LF ones.

    Decodes bytes and splits on "\\n" only: text mode would also break lines at a stray "\\r", and
    str.splitlines() at characters such as U+2028 inside a sentence.
    """
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise RetrieverError(f"missing data file {path}; {_HOW_TO_POINT}") from None
    except UnicodeDecodeError as err:
        raise RetrieverError(f"{path}: not UTF-8 at byte {err.start}") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def _fields(path: Path, line_no: int, line: str, min_columns: int, max_columns: int) -> list[str]:
    fields = line.split("\t")
    if not min_columns <= len(fields) <= max_columns:
        expected = str(min_columns) if min_columns == max_columns else f"{min_columns} to {max_columns}"
        raise RetrieverError(f"{path} line {line_no}: expected {expected} tab-separated columns, found {len(fields)}")
    return fields


def _sentence(path: Path, line_no: int, text: str) -> str:
    # Surrounding spaces (428 sentences of the original STS-B and SICK files have them) mean nothing to a
    # tokenizer; stripping them keeps all_sentences() from counting "x" and "x " as two sentences.
    text = text.strip()
    if not text:
        raise RetrieverError(f"{path} line {line_no}: empty sentence")
    return text


def _score(path: Path, line_no: int, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise RetrieverError(f"{path} line {line_no}: score {text!r} is not a number") from None


def _check_header(path: Path, lines: list[str], expected: list[str]) -> None:
    found = lines[0].split("\t") if lines else []
    if found != expected:
        raise RetrieverError(f"{path} line 1: expected header {' '.join(expected)!r}, found {' '.join(found)!r}")


def _subset(name: str, sent1: list[str], sent2: list[str], labels: list[float], dtype=np.float64) -> PairSubset:
    return PairSubset(name=name, sent1=sent1, sent2=sent2, labels=np.asarray(labels, dtype=dtype))


# --- one parser per file format --------------------------------------------------------------------------


def parse_sts_benchmark(name: str, path: Path) -> PairSubset:
    """STS-B ``sts-*.csv`` (tab-separated, no header): genre, file, year, sid, score, sentence1, sentence2.

    Some original rows carry 2 extra source-attribution columns; only the first 7 are used.
    """
    sent1, sent2, scores = [], [], []
    for line_no, line in enumerate(_read_lines(path), start=1):
        fields = _fields(path, line_no, line, 7, 9)
        scores.append(_score(path, line_no, fields[4]))
        sent1.append(_sentence(path, line_no, fields[5]))
        sent2.append(_sentence(path, line_no, fields[6]))
    return _subset(name, sent1, sent2, scores)


SICK_HEADER = ["pair_ID", "sentence_A", "sentence_B", "relatedness_score", "entailment_judgment"]


def parse_sick(name: str, path: Path) -> PairSubset:
    """SICK ``SICK_*.txt``: header, then pair_ID, sentence_A, sentence_B, relatedness_score, entailment."""
    lines = _read_lines(path)
    _check_header(path, lines, SICK_HEADER)
    sent1, sent2, scores = [], [], []
    for line_no, line in enumerate(lines[1:], start=2):
        fields = _fields(path, line_no, line, 5, 5)
        sent1.append(_sentence(path, line_no, fields[1]))
        sent2.append(_sentence(path, line_no, fields[2]))
        scores.append(_score(path, line_no, fields[3]))
    return _subset(name, sent1, sent2, scores)


def parse_sts_input_gold(name: str, input_path: Path, gold_path: Path) -> PairSubset:
    """STS12–16 ``STS.input.X.txt`` (sent1<TAB>sent2[<TAB>sources]) with ``STS.gs.X.txt`` (one score a line).

    A blank gold line marks an unscored pair (STS15/16): that pair is skipped, as SentEval does.
    """
    inputs, golds = _read_lines(input_path), _read_lines(gold_path)
    if len(inputs) != len(golds):
        raise RetrieverError(
            f"{input_path} has {len(inputs)} lines but its gold file {gold_path} has {len(golds)}; they must align"
        )
    sent1, sent2, scores = [], [], []
    for line_no, (line, gold) in enumerate(zip(inputs, golds), start=1):
        if not gold.strip():
            continue
        scores.append(_score(gold_path, line_no, gold.strip()))
        # Raw STS16 inputs add two source columns after the sentences.
        fields = _fields(input_path, line_no, line, 2, 4)
        sent1.append(_sentence(input_path, line_no, fields[0]))
        sent2.append(_sentence(input_path, line_no, fields[1]))
    return _subset(name, sent1, sent2, scores)


QNLI_HEADER = ["index", "question", "sentence", "label"]
QNLI_LABELS = {"entailment": 1, "not_entailment": 0}


def parse_qnli(name: str, path: Path) -> PairSubset:
    """GLUE QNLI ``dev.tsv``: header, then index, question, sentence, label; entailment is the positive class."""
    lines = _read_lines(path)
    _check_header(path, lines, QNLI_HEADER)
    questions, sentences, labels = [], [], []
    for line_no, line in enumerate(lines[1:], start=2):
        fields = _fields(path, line_no, line, 4, 4)
        if fields[3] not in QNLI_LABELS:
            raise RetrieverError(f"{path} line {line_no}: label {fields[3]!r} is not one of {sorted(QNLI_LABELS)}")
        questions.append(_sentence(path, line_no, fields[1]))
        sentences.append(_sentence(path, line_no, fields[2]))
        labels.append(QNLI_LABELS[fields[3]])
    return _subset(name, questions, sentences, labels, dtype=np.int64)


# --- task declarations -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SubsetFiles:
    """Where one subset lives (file names inside the layout folder) and how many scored pairs it must have."""

    name: str
    files: tuple[str, ...]
    pairs: int


def sts_subset(name: str, pairs: int) -> SubsetFiles:
    """An STS12–16 subset: ``STS.input.<name>.txt`` with its gold file ``STS.gs.<name>.txt``."""
    return SubsetFiles(name, (f"STS.input.{name}.txt", f"STS.gs.{name}.txt"), pairs)


@dataclass(frozen=True)
class Task:
    """A benchmark dataset, declared as data: files per split, the parser, the metric and expected counts.

    ``layouts`` maps a layout name to its sub-folder of ``folder`` (e.g. STS-B: original files at the top,
    SentEval's tokenized copies in ``senteval/``); ``default_layout`` is what the paper evaluated on.
    """

    name: str
    description: str
    folder: str
    parser: Callable[..., PairSubset]
    splits: dict[str, tuple[SubsetFiles, ...]]
    eval_split: str
    metric: str  # "spearman" (STS) or "auc" (pair classification)
    main_aggregation: str  # "test" (single file), "wmean" or "all" (several subsets)
    label_range: tuple[float, float]
    default_layout: str
    layouts: dict[str, str] = field(default_factory=dict)

    @property
    def expected_counts(self) -> dict[str, int]:
        """Scored pairs per split."""
        return {split: sum(s.pairs for s in subsets) for split, subsets in self.splits.items()}

    def layout_dir(self, data_dir: str | os.PathLike, layout: str | None = None) -> Path:
        layout = layout or self.default_layout
        if layout not in self.layouts:
            raise RetrieverError(f"{self.name} has no {layout!r} layout (available: {', '.join(self.layouts)})")
        return Path(data_dir) / self.folder / self.layouts[layout]

    def load_split(
        self, data_dir: str | os.PathLike, split: str | None = None, layout: str | None = None
    ) -> list[PairSubset]:
        """Parse one split (default: the evaluation split), checking pair counts and label range."""
        split = split or self.eval_split
        if split not in self.splits:
            raise RetrieverError(f"{self.name} has no {split!r} split (available: {', '.join(self.splits)})")
        folder = self.layout_dir(data_dir, layout)
        return [self._load_subset(folder, spec) for spec in self.splits[split]]

    def load(self, data_dir: str | os.PathLike, layout: str | None = None) -> dict[str, list[PairSubset]]:
        """Every split: split name -> its subsets."""
        return {split: self.load_split(data_dir, split, layout) for split in self.splits}

    def all_sentences(self, data_dir: str | os.PathLike, layout: str | None = None) -> list[str]:
        """Distinct sentences over all splits, in first-seen order (the target corpus for fitting calibrators)."""
        seen: dict[str, None] = {}
        for subsets in self.load(data_dir, layout).values():
            for subset in subsets:
                seen.update(dict.fromkeys(subset.sent1))
                seen.update(dict.fromkeys(subset.sent2))
        return list(seen)

    def _load_subset(self, folder: Path, spec: SubsetFiles) -> PairSubset:
        paths = [folder / name for name in spec.files]
        subset = self.parser(spec.name, *paths)
        where = paths[-1] if len(paths) > 1 else paths[0]
        if len(subset) != spec.pairs:
            raise RetrieverError(f"{where}: expected {spec.pairs} scored pairs for {self.name}, found {len(subset)}")
        low, high = self.label_range
        outside = (subset.labels < low) | (subset.labels > high)
        if outside.any():
            first = int(np.argmax(outside))
            raise RetrieverError(
                f"{where}: label {subset.labels[first]} of pair {first + 1} is outside {low}–{high} for {self.name}"
            )
        return subset


def senteval_sts_task(name: str, description: str, subsets: dict[str, int]) -> Task:
    """An STS12–16 test set in SentEval's layout: ``subsets`` maps each subset to its scored pairs; Spearman on 0-5
    gold scores, reported as the subset-size-weighted mean as SentEval and BERT-flow do."""
    return Task(
        name=name,
        description=description,
        folder=name,
        parser=parse_sts_input_gold,
        splits={"test": tuple(sts_subset(subset, pairs) for subset, pairs in subsets.items())},
        eval_split="test",
        metric="spearman",
        main_aggregation="wmean",
        label_range=(0.0, 5.0),
        default_layout="senteval",
        layouts={"senteval": ""},
    )
