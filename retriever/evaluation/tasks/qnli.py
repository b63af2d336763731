"""GLUE QNLI dev as pair classification: does the sentence answer the question? (entailment = positive)."""

from retriever.evaluation.data import SubsetFiles, Task, parse_qnli

TASK = Task(
    name="qnli",
    description="GLUE QNLI v2 dev (SQuAD questions vs Wikipedia sentences); ROC-AUC of cosine vs entailment.",
    folder="qnli",
    parser=parse_qnli,
    # The labelled train.tsv was not found (README), and the unlabelled GLUE test is useless here.
    splits={"dev": (SubsetFiles("dev", ("dev.tsv",), pairs=5463),)},
    eval_split="dev",
    metric="auc",
    main_aggregation="dev",
    label_range=(0, 1),
    default_layout="glue",
    layouts={"glue": ""},
)
