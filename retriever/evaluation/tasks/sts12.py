"""SemEval-2012 STS test sets (SentEval layout: Moses-tokenized, lowercased)."""

from retriever.evaluation.data import senteval_sts_task

TASK = senteval_sts_task(
    "sts12",
    "SemEval-2012 STS test, 5 subsets, scored 0-5.",
    {
        "MSRpar": 750,
        "MSRvid": 750,
        "SMTeuroparl": 459,
        "surprise.OnWN": 750,
        "surprise.SMTnews": 399,
    },
)
