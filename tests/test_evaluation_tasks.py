"""Every dataset declaration parses the shared data folder to the counts documented in its README.

Expected numbers are copied from /work/shared/data/README.md (not from the declarations), so a wrong
declaration or parser fails here. The parser edge cases are also tested on small files written to tmp_path.
"""

from functools import cache
from pathlib import Path

import numpy as np
import pytest

from retriever.errors import RetrieverError
from retriever.evaluation.data import (
    SubsetFiles,
    Task,
    parse_qnli,
    parse_sick,
    parse_sts_benchmark,
    parse_sts_input_gold,
)
from retriever.evaluation.registry import GROUPS, TASKS, get_task, resolve_tasks


@cache
def _load(data_dir: Path, task_name: str, layout: str | None):
    return TASKS[task_name].load(data_dir, layout)


@pytest.fixture
def load(shared_data):
    """load(task_name, layout=None) -> split -> subsets, parsed once per session (conftest's shared_data)."""
    return lambda task_name, layout=None: _load(shared_data, task_name, layout)


# README: pairs per split (and per subset for STS12–16).
SPLIT_COUNTS = {
    "stsb": {"train": 5749, "dev": 1500, "test": 1379},
    "sickr": {"train": 4500, "trial": 500, "test": 4927},
    "sts12": {"test": 3108},
    "sts13": {"test": 1500},
    "sts14": {"test": 3750},
    "sts15": {"test": 3000},
    "sts16": {"test": 1186},
    "qnli": {"dev": 5463},
}
SUBSET_COUNTS = {
    "sts12": {"MSRpar": 750, "MSRvid": 750, "SMTeuroparl": 459, "surprise.OnWN": 750, "surprise.SMTnews": 399},
    "sts13": {"FNWN": 189, "headlines": 750, "OnWN": 561},
    "sts14": {"deft-forum": 450, "deft-news": 300, "headlines": 750, "images": 750, "OnWN": 750, "tweet-news": 750},
    "sts15": {"answers-forums": 375, "answers-students": 750, "belief": 375, "headlines": 750, "images": 750},
    "sts16": {"answer-answer": 254, "headlines": 249, "plagiarism": 230, "postediting": 244, "question-question": 209},
}
LABEL_RANGES = {"sickr": (1.0, 5.0), "qnli": (0, 1)}  # every other task: STS 0–5
TASK_LAYOUTS = [(name, layout) for name, task in TASKS.items() for layout in task.layouts]


@pytest.mark.parametrize("name,layout", TASK_LAYOUTS)
def test_split_counts_match_readme(load, name, layout):
    data = load(name, layout)
    assert {split: sum(len(s) for s in subsets) for split, subsets in data.items()} == SPLIT_COUNTS[name]
    assert TASKS[name].expected_counts == SPLIT_COUNTS[name]


@pytest.mark.parametrize("name", sorted(SUBSET_COUNTS))
def test_sts_subset_counts_match_readme(load, name):
    assert {s.name: len(s) for s in load(name)["test"]} == SUBSET_COUNTS[name]


@pytest.mark.parametrize("name,layout", TASK_LAYOUTS)
def test_labels_in_range_and_no_empty_sentences(load, name, layout):
    low, high = LABEL_RANGES.get(name, (0.0, 5.0))
    for subsets in load(name, layout).values():
        for s in subsets:
            assert len(s.sent1) == len(s.sent2) == len(s.labels)
            assert s.labels.min() >= low and s.labels.max() <= high
            assert all(sentence.strip() == sentence and sentence for sentence in s.sent1 + s.sent2)


def test_gold_uses_the_full_scale(load):
    # Guards against a column mix-up that still lands inside the range (e.g. reading the year as a score).
    for name in ("stsb", "sts12", "sts16"):
        labels = np.concatenate([s.labels for s in load(name)[TASKS[name].eval_split]])
        assert labels.min() == 0.0 and labels.max() == 5.0
    sick = load("sickr")["test"][0].labels
    assert sick.min() == 1.0 and sick.max() == 5.0


def test_qnli_label_balance(load):
    labels = load("qnli")["dev"][0].labels
    assert set(np.unique(labels)) == {0, 1}
    assert labels.sum() == 2702  # entailment; 2761 not_entailment


@pytest.mark.parametrize("name", ["stsb", "sickr"])
def test_layouts_hold_the_same_pairs(load, name):
    # README: same pairs, same order, identical gold; sentences differ only in tokenization and case.
    def squash(text):
        return "".join(text.lower().split())

    original, senteval = load(name, "original"), load(name, "senteval")
    mismatches = 0
    for split in original:
        a, b = original[split][0], senteval[split][0]
        np.testing.assert_array_equal(a.labels, b.labels)
        mismatches += sum(squash(x) != squash(y) for x, y in zip(a.sent1 + a.sent2, b.sent1 + b.sent2))
    # The one U+0012 in the original STS-B train ("Treasury\x12s") is dropped by SentEval.
    assert mismatches == (1 if name == "stsb" else 0)


def test_stsb_all_sentences(load, shared_data):
    sentences = TASKS["stsb"].all_sentences(shared_data)
    assert len(sentences) == len(set(sentences)) == 15457
    every = {s for subsets in load("stsb").values() for p in subsets for s in p.sent1 + p.sent2}
    assert set(sentences) == every
    # SentEval lowercases, so a few sentences that differ only in case merge.
    assert len(TASKS["stsb"].all_sentences(shared_data, "senteval")) == 15437


def test_all_sentences_cover_every_split(load, shared_data):
    sentences = set(TASKS["sickr"].all_sentences(shared_data))
    test = load("sickr")["test"][0]
    assert set(test.sent1) | set(test.sent2) <= sentences
    assert len(TASKS["sts12"].all_sentences(shared_data)) == 4946


def test_sts15_skips_unscored_pairs_in_step_with_inputs(load, shared_data):
    # answers-forums: 2000 input lines, 375 scored. The first scored line decides the alignment.
    folder = shared_data / "sts15"
    gold_lines = (folder / "STS.gs.answers-forums.txt").read_text(encoding="utf-8").split("\n")
    first = next(i for i, line in enumerate(gold_lines) if line.strip())
    input_line = (folder / "STS.input.answers-forums.txt").read_text(encoding="utf-8").split("\n")[first]
    subset = load("sts15")["test"][0]
    assert subset.sent1[0] == input_line.split("\t")[0].strip()
    assert subset.labels[0] == float(gold_lines[first])


def test_wrong_layout_is_a_clear_error(shared_data):
    with pytest.raises(RetrieverError, match="sts12 has no 'original' layout"):
        get_task("sts12").load_split(shared_data, layout="original")


# --- registry ---------------------------------------------------------------------------------------------


def test_registry_groups():
    assert [t.name for t in resolve_tasks("sts")] == ["stsb", "sickr", "sts12", "sts13", "sts14", "sts15", "sts16"]
    assert [t.name for t in resolve_tasks("all")] == GROUPS["sts"] + ["qnli"]
    assert [t.name for t in resolve_tasks("sts12, qnli,sts12")] == ["sts12", "qnli"]
    assert [t.name for t in resolve_tasks("STS-B,SICK-R")] == ["stsb", "sickr"]
    assert {t.metric for t in resolve_tasks("sts")} == {"spearman"} and get_task("qnli").metric == "auc"


def test_registry_errors():
    with pytest.raises(RetrieverError, match="unknown dataset 'sts17'"):
        resolve_tasks("sts12,sts17")
    with pytest.raises(RetrieverError, match="no dataset given"):
        resolve_tasks(" , ")


# --- parsers on small files -------------------------------------------------------------------------------


def write(path: Path, text: str, newline: str = "\n") -> Path:
    path.write_bytes(text.replace("\n", newline).encode("utf-8"))
    return path


def test_stsb_parser_ignores_quotes_and_extra_columns(tmp_path):
    rows = [
        'main-news\tMSRpar\t2012test\t0001\t3.5\tHe said "yes.\tShe said no.',
        "main-news\theadlines\t2015\t0002\t0.25\tA\tB\tEurope Media Monitor\t(http://emm.newsbrief.eu)",
        "main-forums\tdeft\t2014\t0003\t5.000\t  Trailing spaces \tC",
    ]
    subset = parse_sts_benchmark("test", write(tmp_path / "sts.csv", "\n".join(rows) + "\n"))
    assert subset.sent1 == ['He said "yes.', "A", "Trailing spaces"]
    assert subset.sent2 == ["She said no.", "B", "C"]
    np.testing.assert_array_equal(subset.labels, [3.5, 0.25, 5.0])


def test_sick_parser_reads_crlf(tmp_path):
    text = "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n6\tA b\tC d\t3.3\tNEUTRAL\n"
    subset = parse_sick("test", write(tmp_path / "SICK.txt", text, newline="\r\n"))
    assert (subset.sent1, subset.sent2, subset.labels.tolist()) == (["A b"], ["C d"], [3.3])


def test_sts_parser_skips_blank_gold_lines(tmp_path):
    inputs = write(tmp_path / "in.txt", "a\tb\nc\td\ne\tf\n")
    gold = write(tmp_path / "gs.txt", "\n4.800\n\n")
    subset = parse_sts_input_gold("x", inputs, gold)
    assert (subset.sent1, subset.sent2, subset.labels.tolist()) == (["c"], ["d"], [4.8])


def test_qnli_parser_maps_entailment_to_one(tmp_path):
    text = "index\tquestion\tsentence\tlabel\n0\tQ?\tS\u00a0\ufeffx.\tentailment\n1\tQ2?\tS2.\tnot_entailment\n"
    subset = parse_qnli("dev", write(tmp_path / "dev.tsv", text))
    assert subset.labels.tolist() == [1, 0] and subset.sent2[0] == "S\u00a0\ufeffx."


@pytest.mark.parametrize(
    "parser,text,message",
    [
        (parse_sts_benchmark, "g\tf\t2012\t1\t3.0\tonly one sentence\n", r"line 1: expected 7 to 9 tab-separated"),
        (parse_sts_benchmark, "g\tf\t2012\t1\t3.0\ta\tb\ng\tf\t2012\t2\thigh\ta\tb\n", r"line 2: score 'high'"),
        (parse_sts_benchmark, "g\tf\t2012\t1\t3.0\ta\t \n", r"line 1: empty sentence"),
        (parse_sick, "pair_ID\tsentence_A\n", r"line 1: expected header"),
        (parse_qnli, "index\tquestion\tsentence\tlabel\n0\tq\ts\tmaybe\n", r"line 2: label 'maybe'"),
    ],
)
def test_malformed_files_name_file_and_line(tmp_path, parser, text, message):
    path = write(tmp_path / "bad.txt", text)
    with pytest.raises(RetrieverError, match=message) as error:
        parser("x", path)
    assert str(path) in str(error.value)


def test_misaligned_sts_files_are_an_error(tmp_path):
    inputs = write(tmp_path / "in.txt", "a\tb\nc\td\n")
    gold = write(tmp_path / "gs.txt", "1\n")
    with pytest.raises(RetrieverError, match="has 2 lines but its gold file .* has 1"):
        parse_sts_input_gold("x", inputs, gold)


def _tiny_task(pairs: int, label_range=(0.0, 5.0)) -> Task:
    return Task(
        name="tiny",
        description="test fixture",
        folder="tiny",
        parser=parse_sts_benchmark,
        splits={"test": (SubsetFiles("test", ("sts-test.csv",), pairs=pairs),)},
        eval_split="test",
        metric="spearman",
        main_aggregation="test",
        label_range=label_range,
        default_layout="original",
        layouts={"original": ""},
    )


def test_count_mismatch_and_missing_file_are_errors(tmp_path):
    (tmp_path / "tiny").mkdir()
    write(tmp_path / "tiny" / "sts-test.csv", "g\tf\t2012\t1\t3.0\ta\tb\ng\tf\t2012\t2\t6.5\tc\td\n")
    with pytest.raises(RetrieverError, match=r"sts-test.csv: expected 3 scored pairs for tiny, found 2"):
        _tiny_task(3).load_split(tmp_path)
    with pytest.raises(RetrieverError, match=r"label 6.5 of pair 2 is outside 0.0–5.0"):
        _tiny_task(2).load_split(tmp_path)
    assert len(_tiny_task(2, label_range=(0.0, 10.0)).load_split(tmp_path)[0]) == 2
    with pytest.raises(RetrieverError, match=r"missing data file .*sts-test.csv"):
        _tiny_task(2).load_split(tmp_path / "elsewhere")
