"""SemEval-2016 STS test sets (SentEval layout). Only pairs with a gold score count (blank gold lines skipped)."""

from retriever.evaluation.data import Task, parse_sts_input_gold, sts_subset

TASK = Task(
    name="sts16",
    description="SemEval-2016 STS test, 5 subsets, scored 0-5.",
    folder="sts16",
    parser=parse_sts_input_gold,
    splits={
        "test": (
            sts_subset("answer-answer", 254),
            sts_subset("headlines", 249),
            sts_subset("plagiarism", 230),
            sts_subset("postediting", 244),
            sts_subset("question-question", 209),
        )
    },
    eval_split="test",
    metric="spearman",
    main_aggregation="wmean",
    label_range=(0.0, 5.0),
    default_layout="senteval",
    layouts={"senteval": ""},
)
