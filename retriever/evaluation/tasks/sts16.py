"""SemEval-2016 STS test sets (SentEval layout). Only pairs with a gold score count (blank gold lines skipped)."""

from retriever.evaluation.data import senteval_sts_task

TASK = senteval_sts_task(
    "sts16",
    "SemEval-2016 STS test, 5 subsets, scored 0-5.",
    {
        "answer-answer": 254,
        "headlines": 249,
        "plagiarism": 230,
        "postediting": 244,
        "question-question": 209,
    },
)
