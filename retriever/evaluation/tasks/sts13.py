"""*SEM-2013 STS test sets (SentEval layout). SMT is left out: its text is LDC-only, as in SentEval."""

from retriever.evaluation.data import Task, parse_sts_input_gold, sts_subset

TASK = Task(
    name="sts13",
    description="*SEM-2013 STS test, 3 subsets (no SMT), scored 0-5.",
    folder="sts13",
    parser=parse_sts_input_gold,
    splits={
        "test": (
            sts_subset("FNWN", 189),
            sts_subset("headlines", 750),
            sts_subset("OnWN", 561),
        )
    },
    eval_split="test",
    metric="spearman",
    main_aggregation="wmean",
    label_range=(0.0, 5.0),
    default_layout="senteval",
    layouts={"senteval": ""},
)
