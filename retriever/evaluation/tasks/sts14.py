"""SemEval-2014 STS test sets (SentEval layout)."""

from retriever.evaluation.data import Task, parse_sts_input_gold, sts_subset

TASK = Task(
    name="sts14",
    description="SemEval-2014 STS test, 6 subsets, scored 0-5.",
    folder="sts14",
    parser=parse_sts_input_gold,
    splits={
        "test": (
            sts_subset("deft-forum", 450),
            sts_subset("deft-news", 300),
            sts_subset("headlines", 750),
            sts_subset("images", 750),
            sts_subset("OnWN", 750),
            sts_subset("tweet-news", 750),
        )
    },
    eval_split="test",
    metric="spearman",
    main_aggregation="wmean",
    label_range=(0.0, 5.0),
    default_layout="senteval",
    layouts={"senteval": ""},
)
