"""BERT-flow on real data: MiniLM's embedding-layer vectors of 600 STS-B test pairs, fitted and scored in-test.

Layer 0 is anisotropic like an un-tuned encoder, so a working flow must lift cosine similarity a lot.
"""

from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from retriever.calibration import make_calibrator

PAIRS = 600
REPO = Path(__file__).resolve().parents[1]
STSB_TEST = next(
    (path for path in (REPO / "shared", REPO.parent / "shared") if (path / "data/stsb/sts-test.csv").is_file()),
    REPO.parent / "shared",
) / "data/stsb/sts-test.csv"


def read_stsb(path: Path, limit: int) -> list[tuple[float, str, str]]:
    """(score, sentence1, sentence2) rows. Tab-separated despite .csv, with stray quotes: split on tabs only."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines()[:limit]:
        fields = line.split("\t")
        rows.append((float(fields[4]), fields[5], fields[6]))
    return rows


@pytest.mark.slow
@pytest.mark.skipif(not STSB_TEST.is_file(), reason=f"STS-B test file not found at {STSB_TEST}")
def test_flow_lifts_layer0_cosine_similarity_on_stsb():
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on a shared CPU two threads per process can oversubscribe it 10x; restored below
    try:
        raw, flow = stsb_scores()
    finally:
        torch.set_num_threads(previous_threads)
    # Measured on these 1,125 sentences: raw 66.3, flow 79.8-79.9 over seeds 0-3 (whitening 74.3).
    assert 60 < raw < 72
    assert flow > raw + 8, f"flow {flow:.2f} vs raw {raw:.2f}"


def stsb_scores() -> tuple[float, float]:
    """Spearman x 100 of raw and flow-calibrated layer-0 cosine similarity on the first PAIRS test pairs."""
    from retriever.encoder import Encoder

    rows = read_stsb(STSB_TEST, PAIRS)
    sentences = list(dict.fromkeys(sentence for _, first, second in rows for sentence in (first, second)))
    vectors = Encoder(layers=[0], max_length=64, device="cpu", batch_size=128).encode(sentences)
    row_of = {sentence: row for row, sentence in enumerate(sentences)}
    first = np.array([row_of[first] for _, first, _ in rows])
    second = np.array([row_of[second] for _, _, second in rows])
    gold = [score for score, _, _ in rows]

    def spearman(Z: np.ndarray) -> float:
        Z = Z / np.linalg.norm(Z, axis=1, keepdims=True)
        return 100 * spearmanr((Z[first] * Z[second]).sum(1), gold).correlation

    return spearman(vectors), spearman(make_calibrator("flow", device="cpu").fit(vectors).transform(vectors))
