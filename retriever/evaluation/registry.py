"""Registry of benchmark tasks: the pair tasks (one declaration per module of `retriever.evaluation.tasks`), the
retrieval tasks (`retrieval_tasks`), BEIR folders, and the ``sts``, ``retrieval`` and ``all`` groups."""

from __future__ import annotations

from retriever.errors import RetrieverError
from retriever.evaluation.data import Task
from retriever.evaluation.retrieval import RetrievalTask
from retriever.evaluation.retrieval_tasks import IR_CLASSIC, RETRIEVAL_TASKS, beir_task
from retriever.evaluation.tasks import qnli, sickr, sts12, sts13, sts14, sts15, sts16, stsb

# Order of the BERT-flow tables: STS-B, SICK-R, STS12–16; then QNLI.
TASKS: dict[str, Task] = {
    module.TASK.name: module.TASK for module in (stsb, sickr, sts12, sts13, sts14, sts15, sts16, qnli)
}
GROUPS: dict[str, list[str]] = {
    "sts": ["stsb", "sickr", "sts12", "sts13", "sts14", "sts15", "sts16"],
    "all": list(TASKS),
    "retrieval": ["qnli-retrieval", "stsb-dup", "sickr-dup"],
    "ir-classic": list(IR_CLASSIC),
}


def _canonical(name: str) -> str:
    # Accept the spellings papers use: "STS-B", "SICK-R", "STS-12".
    return name.strip().lower().replace("-", "").replace("_", "")


KNOWN = (f"choose from {', '.join([*TASKS, *RETRIEVAL_TASKS])}, beir:PATH (a BEIR folder) or the groups sts, "
         "retrieval, ir-classic, all")


def get_task(name: str) -> Task:
    task = TASKS.get(_canonical(name))
    if task is None:
        raise RetrieverError(f"unknown dataset {name!r}; {KNOWN}")
    return task


def get_any_task(name: str) -> Task | RetrievalTask:
    """A pair task, a retrieval task, or beir:PATH."""
    if name.lower().startswith("beir:"):
        return beir_task(name[len("beir:"):])
    retrieval = RETRIEVAL_TASKS.get(name.strip().lower())
    return retrieval if retrieval is not None else get_task(name)


def resolve_tasks(spec: str) -> list[Task | RetrievalTask]:
    """Comma-separated task and group names ("sts12,qnli", "sts", "retrieval", "beir:PATH") -> tasks, without
    duplicates."""
    names = [part for part in (p.strip() for p in spec.split(",")) if part]
    if not names:
        raise RetrieverError(f"no dataset given; {KNOWN}")
    chosen: dict[str, Task | RetrievalTask] = {}
    for name in names:
        group = GROUPS.get(_canonical(name)) or GROUPS.get(name.strip().lower())
        for task in [get_any_task(n) for n in group] if group else [get_any_task(name)]:
            chosen.setdefault(task.name, task)
    return list(chosen.values())


__all__ = ["GROUPS", "RETRIEVAL_TASKS", "TASKS", "Task", "get_any_task", "get_task", "resolve_tasks"]
