"""The pair tasks (STS-B, SICK-R, STS12-16, QNLI), one module each declaring its `TASK`; the registry that names
them, with the retrieval tasks and the groups, is `retriever.evaluation.registry`."""
