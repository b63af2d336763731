"""The retrieval tasks, declared as data (as `retriever.evaluation.tasks` declares the pair tasks): QNLI dev as
question -> answering sentence(s), STS-B, SICK-R and STS12-16 as duplicate retrieval, four tasks built from the
passages (`passage_tasks`), the three classic test collections of `ir-classic/` (Cranfield, CISI, CACM: real
questions with human judgments, the yardstick for defaults), and any BEIR folder. Each is a `RetrievalTask` whose loader gives a `RetrievalSet`;
`retriever.evaluation.retrieval` scores them through a real index.
"""

from __future__ import annotations

from pathlib import Path

from retriever.errors import RetrieverError
from retriever.evaluation import passage_tasks
from retriever.evaluation.data import Task
from retriever.evaluation.retrieval import Qrels, RetrievalSet, RetrievalTask, load_beir
from retriever.evaluation.tasks import qnli, sickr, sts12, sts13, sts14, sts15, sts16, stsb

DUPLICATE_THRESHOLD = 4.0
# The classic collections (the data folder's ir-classic/, in BEIR layout): real questions, judged by people.
IR_CLASSIC = {
    "cranfield": "Cranfield: 225 aeronautics questions over 1,400 abstracts, graded judgments (1-4)",
    "cisi": "CISI: 76 judged information-science questions over 1,460 abstracts",
    "cacm": "CACM: 52 judged computing questions over 3,204 titles and abstracts",
}


# The pair tasks these sets are built from, by name (the registry lists this module's tasks, so it is not used).
PAIR_TASKS: dict[str, Task] = {module.TASK.name: module.TASK
                               for module in (qnli, sickr, sts12, sts13, sts14, sts15, sts16, stsb)}


def _pair_task(name: str) -> Task:
    return PAIR_TASKS[name]


def qnli_retrieval(data_dir: str | Path) -> RetrievalSet:
    (subset,) = _pair_task("qnli").load(Path(data_dir))["dev"]
    sentences = list(dict.fromkeys(subset.sent2))
    doc_ids = {sentence: f"s{i}" for i, sentence in enumerate(sentences)}
    questions = list(dict.fromkeys(subset.sent1))
    query_ids = {question: f"q{i}" for i, question in enumerate(questions)}
    qrels: Qrels = {}
    for question, sentence, label in zip(subset.sent1, subset.sent2, subset.labels):
        if label == 1:
            qrels.setdefault(query_ids[question], {})[doc_ids[sentence]] = 1
    queries = {query_ids[q]: q for q in questions if query_ids[q] in qrels}
    return RetrievalSet("qnli-retrieval", {doc_ids[s]: (None, s) for s in sentences}, queries, qrels)


def duplicate_retrieval(task_name: str, data_dir: str | Path, threshold: float = DUPLICATE_THRESHOLD) -> RetrievalSet:
    task = _pair_task(task_name)
    subsets = task.load(Path(data_dir))[task.eval_split]
    sentences = list(dict.fromkeys(s for subset in subsets for s in (*subset.sent1, *subset.sent2)))
    ids = {sentence: f"s{i}" for i, sentence in enumerate(sentences)}
    qrels: Qrels = {}
    for subset in subsets:
        for first, second, gold in zip(subset.sent1, subset.sent2, subset.labels):
            if gold >= threshold and first != second:
                qrels.setdefault(ids[first], {})[ids[second]] = 1
                qrels.setdefault(ids[second], {})[ids[first]] = 1
    queries = {ids[s]: s for s in sentences if ids[s] in qrels}
    return RetrievalSet(f"{task.name}-dup", {ids[s]: (None, s) for s in sentences}, queries, qrels)


RETRIEVAL_TASKS: dict[str, RetrievalTask] = {
    task.name: task for task in (
        RetrievalTask("qnli-retrieval", "QNLI dev: each question retrieves its answering sentence(s) among all "
                      "distinct dev sentences", qnli_retrieval, split="dev"),
        RetrievalTask("stsb-dup", "STS-B test as duplicate retrieval: pairs with gold >= 4, both ways",
                      lambda data: duplicate_retrieval("stsb", data)),
        RetrievalTask("sickr-dup", "SICK test as duplicate retrieval: pairs with gold >= 4, both ways",
                      lambda data: duplicate_retrieval("sickr", data)),
        *(RetrievalTask(f"{year}-dup", f"{year.upper()} as duplicate retrieval: pairs with gold >= 4, both ways",
                        lambda data, year=year: duplicate_retrieval(year, data))
          for year in ("sts12", "sts13", "sts14", "sts15", "sts16")),
        *(RetrievalTask(name, description, lambda data, name=name: _passage_task(name, data))
          for name, description in (
              ("bible-parallel", "a King James verse retrieves the same verse of the World English Bible (New "
                                 "Testament), from passages/"),
              ("wordnet-define", "a WordNet lemma retrieves the glosses of its synsets, from passages/"),
              ("debian-package", "a Debian package's synopsis retrieves its description's paragraphs, from "
                                 "passages/"),
              ("foldoc-term", "a FOLDOC headword retrieves the paragraphs defining it, from passages/"),
              ("python-doc-page", "a Python documentation page's title retrieves its paragraphs, from passages/"),
              ("linux-doc-page", "a Linux kernel documentation page's title retrieves its paragraphs, from "
                                 "passages/"))),
        *(RetrievalTask(name, f"a {source.removesuffix('-doc')} documentation page's title retrieves its "
                        "paragraphs, from passages/", lambda data, name=name, source=source:
                        passage_tasks.doc_page(Path(data), source, name))
          for name, source in passage_tasks.FRESH_DOC_PAGES),
        *(RetrievalTask(name, description, lambda data, name=name: load_beir(Path(data) / "ir-classic" / name, name=name))
          for name, description in IR_CLASSIC.items()),
    )
}


def _passage_task(name: str, data_dir: Path) -> RetrievalSet:
    return getattr(passage_tasks, name.replace("-", "_"))(Path(data_dir))


def beir_task(folder: str | Path, split: str = "test") -> RetrievalTask:
    """A task for any BEIR folder (`retriever bench beir PATH`), named after the folder."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise RetrieverError(f"beir: {folder} is not a folder")
    return RetrievalTask(folder.name, f"BEIR folder {folder}", lambda data: load_beir(folder, split), split=split)
