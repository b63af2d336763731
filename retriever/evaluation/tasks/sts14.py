"""SemEval-2014 STS test sets (SentEval layout)."""

from retriever.evaluation.data import senteval_sts_task

TASK = senteval_sts_task(
    "sts14",
    "SemEval-2014 STS test, 6 subsets, scored 0-5.",
    {
        "deft-forum": 450,
        "deft-news": 300,
        "headlines": 750,
        "images": 750,
        "OnWN": 750,
        "tweet-news": 750,
    },
)
