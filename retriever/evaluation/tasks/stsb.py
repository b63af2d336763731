"""STS Benchmark (Cer et al., 2017): English pairs from captions, news and forums, scored 0–5."""

from retriever.evaluation.data import SubsetFiles, Task, parse_sts_benchmark

TASK = Task(
    name="stsb",
    description="STS Benchmark 2017; train/dev/test, scored 0-5. Test is the reported split.",
    folder="stsb",
    parser=parse_sts_benchmark,
    splits={
        "train": (SubsetFiles("train", ("sts-train.csv",), pairs=5749),),
        "dev": (SubsetFiles("dev", ("sts-dev.csv",), pairs=1500),),
        "test": (SubsetFiles("test", ("sts-test.csv",), pairs=1379),),
    },
    eval_split="test",
    metric="spearman",
    main_aggregation="test",
    label_range=(0.0, 5.0),
    # original: the organizers' untokenized files (what BERT-flow read); senteval: tokenized, lowercased.
    default_layout="original",
    layouts={"original": "", "senteval": "senteval"},
)
