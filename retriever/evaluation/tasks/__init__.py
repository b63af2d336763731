"""Registry of benchmark tasks: one declaration per dataset module, plus the ``sts`` and ``all`` groups."""

from __future__ import annotations

from retriever.errors import RetrieverError
from retriever.evaluation.data import Task
from retriever.evaluation.tasks import qnli, sickr, sts12, sts13, sts14, sts15, sts16, stsb

# Order of the BERT-flow tables: STS-B, SICK-R, STS12–16; then QNLI.
TASKS: dict[str, Task] = {
    module.TASK.name: module.TASK for module in (stsb, sickr, sts12, sts13, sts14, sts15, sts16, qnli)
}
GROUPS: dict[str, list[str]] = {
    "sts": ["stsb", "sickr", "sts12", "sts13", "sts14", "sts15", "sts16"],
    "all": list(TASKS),
}


def _canonical(name: str) -> str:
    # Accept the spellings papers use: "STS-B", "SICK-R", "STS-12".
    return name.strip().lower().replace("-", "").replace("_", "")


def get_task(name: str) -> Task:
    task = TASKS.get(_canonical(name))
    if task is None:
        raise RetrieverError(f"unknown dataset {name!r}; choose from {', '.join(TASKS)} or the groups sts, all")
    return task


def resolve_tasks(spec: str) -> list[Task]:
    """Comma-separated task and group names ("sts12,qnli", "sts", "all") -> tasks, without duplicates."""
    names = [part for part in (p.strip() for p in spec.split(",")) if part]
    if not names:
        raise RetrieverError(f"no dataset given; choose from {', '.join(TASKS)} or the groups sts, all")
    chosen: dict[str, Task] = {}
    for name in names:
        group = GROUPS.get(_canonical(name))
        for task in [TASKS[n] for n in group] if group else [get_task(name)]:
            chosen.setdefault(task.name, task)
    return list(chosen.values())


__all__ = ["GROUPS", "TASKS", "Task", "get_task", "resolve_tasks"]
