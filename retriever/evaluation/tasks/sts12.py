"""SemEval-2012 STS test sets (SentEval layout: Moses-tokenized, lowercased)."""

from retriever.evaluation.data import Task, parse_sts_input_gold, sts_subset

TASK = Task(
    name="sts12",
    description="SemEval-2012 STS test, 5 subsets, scored 0-5.",
    folder="sts12",
    parser=parse_sts_input_gold,
    splits={
        "test": (
            sts_subset("MSRpar", 750),
            sts_subset("MSRvid", 750),
            sts_subset("SMTeuroparl", 459),
            sts_subset("surprise.OnWN", 750),
            sts_subset("surprise.SMTnews", 399),
        )
    },
    eval_split="test",
    metric="spearman",
    main_aggregation="wmean",
    label_range=(0.0, 5.0),
    default_layout="senteval",
    layouts={"senteval": ""},
)
