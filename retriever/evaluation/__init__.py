"""Benchmark evaluation for ``retriever bench``: dataset declarations, parsers and evaluators.

- ``data``: data-folder resolution, one parser per file format, the ``Task`` declaration type.
- ``tasks``: one declaration per dataset and the registry (``get_task``, ``resolve_tasks``).
- ``evaluators``: Spearman / ROC-AUC of cosine similarities, as flat result records.
- ``lexical``: the edit-distance analysis of BERT-flow's Table 6.
"""

from retriever.evaluation.data import PairSubset, Task, resolve_data_dir
from retriever.evaluation.evaluators import embed_pairs, evaluate
from retriever.evaluation.lexical import lexical_analysis
from retriever.evaluation.registry import GROUPS, TASKS, get_task, resolve_tasks

__all__ = [
    "GROUPS",
    "TASKS",
    "PairSubset",
    "Task",
    "embed_pairs",
    "evaluate",
    "get_task",
    "lexical_analysis",
    "resolve_data_dir",
    "resolve_tasks",
]
