"""Defaults shared by the library and the command line, kept free of heavy imports so the CLI starts fast."""

# Calibrators fit on at most this many vectors, drawn uniformly (seeded) from the corpus, so fitting stops growing
# with the corpus. Chosen by measurement (benchmarks/results/fit_sample.md): on 1.09M real passages a flow fitted
# on this many gives STS-B within 0.2 of one fitted on all of them, and fits in about 20 s on two cores.
DEFAULT_FIT_SAMPLE = 200_000

# Hybrid search's fusion and the dense side's share of it, chosen by measurement (benchmarks/hybrid.py for the
# weight, benchmarks/fusion_adaptive.py for the fusion); an index records the weight its own corpus was given
# (`retriever.search.fusion_check`), searches override it.
DEFAULT_FUSION, DEFAULT_WEIGHT = "zscore-union", 0.7
