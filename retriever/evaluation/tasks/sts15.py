"""SemEval-2015 STS test sets (SentEval layout). Only pairs with a gold score count (blank gold lines skipped)."""

from retriever.evaluation.data import Task, parse_sts_input_gold, sts_subset

TASK = Task(
    name="sts15",
    description="SemEval-2015 STS test, 5 subsets, scored 0-5.",
    folder="sts15",
    parser=parse_sts_input_gold,
    splits={
        "test": (
            sts_subset("answers-forums", 375),
            sts_subset("answers-students", 750),
            sts_subset("belief", 375),
            sts_subset("headlines", 750),
            sts_subset("images", 750),
        )
    },
    eval_split="test",
    metric="spearman",
    main_aggregation="wmean",
    label_range=(0.0, 5.0),
    default_layout="senteval",
    layouts={"senteval": ""},
)
