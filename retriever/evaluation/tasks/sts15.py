"""SemEval-2015 STS test sets (SentEval layout). Only pairs with a gold score count (blank gold lines skipped)."""

from retriever.evaluation.data import senteval_sts_task

TASK = senteval_sts_task(
    "sts15",
    "SemEval-2015 STS test, 5 subsets, scored 0-5.",
    {
        "answers-forums": 375,
        "answers-students": 750,
        "belief": 375,
        "headlines": 750,
        "images": 750,
    },
)
