"""SICK-R (SemEval-2014 Task 1): relatedness of sentence pairs built from image and video captions, 1–5."""

from retriever.evaluation.data import SubsetFiles, Task, parse_sick

TASK = Task(
    name="sickr",
    description="SICK relatedness (SemEval-2014 Task 1); train/trial/test, scored 1-5. Test is the reported split.",
    folder="sick",
    parser=parse_sick,
    splits={
        "train": (SubsetFiles("train", ("SICK_train.txt",), pairs=4500),),
        "trial": (SubsetFiles("trial", ("SICK_trial.txt",), pairs=500),),
        "test": (SubsetFiles("test", ("SICK_test_annotated.txt",), pairs=4927),),
    },
    eval_split="test",
    metric="spearman",
    main_aggregation="test",
    label_range=(1.0, 5.0),
    # original: the organizers' files (what BERT-flow's SickRProcessor read); senteval: tokenized copies.
    default_layout="original",
    layouts={"original": "", "senteval": "senteval"},
)
