"""*SEM-2013 STS test sets (SentEval layout). SMT is left out: its text is LDC-only, as in SentEval."""

from retriever.evaluation.data import senteval_sts_task

TASK = senteval_sts_task(
    "sts13",
    "*SEM-2013 STS test, 3 subsets (no SMT), scored 0-5.",
    {
        "FNWN": 189,
        "headlines": 750,
        "OnWN": 561,
    },
)
