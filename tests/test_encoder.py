"""The encoder: pooling excludes padding, batching/sorting keeps order, and it matches sentence-transformers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from retriever.encode.encoder import Encoder
from retriever.errors import RetrieverError

# Very different lengths, so length-sorted batches pad a lot and reorder the inputs.
TEXTS = [
    "Hi.",
    "A man is playing a large flute while standing on a stage in front of a quiet audience of several hundred people.",
    "Dogs run.",
    "The quick brown fox jumps over the lazy dog, then sleeps in the warm afternoon sun near the river bank.",
    "Tea?",
    "Three children are building a sandcastle.",
]

POOLINGS = [
    ("cls", None, None),
    ("last-avg", None, [-1]),
    ("last2-avg", None, [-2, -1]),
    ("first-last-avg", None, [1, -1]),
    ("last-avg", "0,2", [0, 2]),
    ("last-avg", "0", [0]),
]


def reference_vectors(folder, texts, layers):
    """Each text run alone (no padding at all): the mean of the chosen layers over all its tokens."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder).eval()
    vectors = []
    with torch.no_grad():
        for text in texts:
            outputs = model(**tokenizer(text, return_tensors="pt"), output_hidden_states=True)
            if layers is None:  # cls
                vectors.append(outputs.last_hidden_state[0, 0])
            else:
                states = torch.stack([outputs.hidden_states[layer][0] for layer in layers]).mean(0)
                vectors.append(states.mean(0))
    return torch.stack(vectors).numpy()


@pytest.mark.parametrize("pooling, layers, reference_layers", POOLINGS)
def test_every_pooling_mode_equals_unpadded_mean(tiny_bert, pooling, reference_layers, layers):
    encoder = Encoder(str(tiny_bert), pooling=pooling, layers=layers, device="cpu", batch_size=2)
    got = encoder.encode(TEXTS)
    expected = reference_vectors(tiny_bert, TEXTS, reference_layers)
    assert got.dtype == np.float32 and got.shape == (len(TEXTS), 32)
    np.testing.assert_allclose(got, expected, atol=2e-5, rtol=1e-4)


def test_hand_computed_masked_mean_on_a_padded_batch(tiny_bert):
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    model = AutoModel.from_pretrained(tiny_bert).eval()
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        states = model(**batch).last_hidden_state
    expected = []
    for row, mask in zip(states, batch["attention_mask"]):
        expected.append(row[mask.bool()].mean(0))  # only the real tokens of this row
    got = Encoder(str(tiny_bert), device="cpu", batch_size=4).encode(TEXTS)
    np.testing.assert_allclose(got, torch.stack(expected).numpy(), atol=2e-5, rtol=1e-4)


def test_length_sorting_restores_input_order(tiny_bert):
    encoder = Encoder(str(tiny_bert), device="cpu", batch_size=2)
    forward = encoder.encode(TEXTS)
    permutation = np.random.default_rng(0).permutation(len(TEXTS))
    shuffled = encoder.encode([TEXTS[i] for i in permutation])
    np.testing.assert_allclose(shuffled, forward[permutation], atol=1e-5)
    one_by_one = np.stack([encoder.encode([text])[0] for text in TEXTS])
    np.testing.assert_allclose(forward, one_by_one, atol=2e-5, rtol=1e-4)


def test_truncation_is_counted_and_max_length_respected(tiny_bert):
    encoder = Encoder(str(tiny_bert), device="cpu", max_length=8)
    vectors, truncated = encoder.encode_counting_truncated(TEXTS)
    assert truncated == 3  # the two long sentences and "Three children are building a sandcastle."
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    cut = tokenizer(TEXTS[1], truncation=True, max_length=8, return_tensors="pt")
    with torch.no_grad():
        expected = AutoModel.from_pretrained(tiny_bert).eval()(**cut).last_hidden_state[0].mean(0)
    np.testing.assert_allclose(vectors[1], expected.numpy(), atol=2e-5, rtol=1e-4)


def test_empty_input_gives_empty_matrix(tiny_bert):
    assert Encoder(str(tiny_bert), device="cpu").encode([]).shape == (0, 32)


def test_config_round_trip(tiny_bert):
    encoder = Encoder(str(tiny_bert), layers="0,2", max_length=64, device="cpu")
    again = Encoder.from_config(encoder.config(), device="cpu")
    assert again.config() == encoder.config() == {
        "model": str(tiny_bert), "pooling": "layers", "layers": [0, 2], "max_length": 64, "dtype": "fp32", "dim": 32,
    }
    np.testing.assert_array_equal(again.encode(TEXTS), encoder.encode(TEXTS))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"model": "no-such-org/no-such-model"}, "cannot be reached"),
        ({"model": "/no/such/model-folder"}, "model folder /no/such/model-folder does not exist"),
        ({"layers": "0,9"}, "layer 9 does not exist"),
        ({"pooling": "max"}, "unknown pooling"),
        ({"layers": "a,b"}, "comma-separated integers"),
        ({"dtype": "int8"}, "unknown dtype"),
    ],
)
def test_bad_settings_give_one_clear_line(tiny_bert, monkeypatch, kwargs, message):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # never wait on the network in tests
    kwargs = {"model": str(tiny_bert), **kwargs}
    with pytest.raises(RetrieverError, match=message) as error:
        Encoder(device="cpu", **kwargs)
    assert "\n" not in str(error.value)


def test_default_model_defaults(minilm_encoder):
    assert minilm_encoder.config() == {
        "model": "all-MiniLM-L6-v2", "pooling": "last-avg", "layers": None, "max_length": 256, "dtype": "fp32",
        "dim": 384,
    }


def test_matches_sentence_transformers_on_real_sentences(minilm_encoder, shared_data):
    from sentence_transformers import SentenceTransformer

    from retriever.encode.models import default_model_path

    from retriever.evaluation import get_task

    (dev,) = get_task("stsb").load_split(shared_data, "dev")
    sentences = dev.sent1[:25] + dev.sent2[:25]
    assert len(sentences) == 50
    ours = minilm_encoder.encode(sentences)
    peer = SentenceTransformer(str(default_model_path()), device="cpu").encode(sentences, batch_size=16)
    cosine = (ours * peer).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(peer, axis=1)
    assert cosine.min() >= 0.99999


def test_layers_past_the_deepest_pooled_one_are_not_run(tiny_bert):
    """Later layers cannot change earlier hidden states: skipping them changes no number."""
    from retriever.encode.models import load_model

    texts = ["A man is playing a guitar.", "The cat sat on the mat and purred softly while it rained."]
    for layers, expected_run in (("0", 1), ("0,2", 2), ("1,3", 3)):
        encoder = Encoder(str(tiny_bert), layers=layers, device="cpu")
        assert encoder.layers_run == expected_run and len(encoder.model.encoder.layer) == expected_run
        whole = Encoder(str(tiny_bert), layers=layers, device="cpu")
        whole.model = load_model(str(tiny_bert)).model.eval()  # all 3 layers
        np.testing.assert_array_equal(encoder.encode(texts), whole.encode(texts))


LONG_TEXT = "word " * 3000  # ~3,000 tokens: past every model's positions


@pytest.fixture(scope="module")
def tiny_roberta(tmp_path_factory, tiny_bert):
    """A random RoBERTa-style encoder with 34 position embeddings: positions count from padding_idx + 1 = 2, so 32
    tokens fit (as mpnet's 514 give 512)."""
    from transformers import RobertaConfig, RobertaModel

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny-roberta")
    config = RobertaConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=37, max_position_embeddings=34, pad_token_id=1)
    RobertaModel(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_bert).save_pretrained(folder)
    return folder


@pytest.mark.parametrize(
    "model, usable",
    [("tiny_bert", 512), ("tiny_roberta", 32)],  # BERT positions start at 0; RoBERTa's after the padding index
)
def test_max_length_past_the_model_positions_is_refused(request, model, usable):
    """--max-length 1000000000 used to build, then fail on the first long text (tensor a (3002) vs (512))."""
    folder = str(request.getfixturevalue(model))
    assert Encoder(folder, device="cpu", max_length=usable).max_length == usable
    for too_long in (usable + 1, 10**9):
        with pytest.raises(RetrieverError) as caught:
            Encoder(folder, device="cpu", max_length=too_long)
        assert str(caught.value) == (f"max_length {too_long:,} is more than model '{folder}' takes: at most "
                                     f"{usable} tokens")


def test_the_default_max_length_fits_the_model_positions(tiny_roberta):
    """The tokenizer says 512; the model has 32 usable positions: the default is 32, and a long text encodes."""
    encoder = Encoder(str(tiny_roberta), device="cpu")
    vectors, truncated = encoder.encode_counting_truncated([LONG_TEXT, "short"])
    assert encoder.max_length == 32 and truncated == 1 and np.isfinite(vectors).all()


def test_a_recorded_max_length_past_the_positions_is_capped(tiny_bert):
    """An index built before the limit was checked still searches: no text longer than 512 tokens could have been
    encoded then, so capping reproduces its vectors."""
    encoder = Encoder(str(tiny_bert), device="cpu", max_length=512)
    recorded = {**encoder.config(), "max_length": 10**9}
    again = Encoder.from_config(recorded, device="cpu")
    assert again.max_length == 512
    np.testing.assert_array_equal(again.encode([LONG_TEXT] + TEXTS), encoder.encode([LONG_TEXT] + TEXTS))


def test_tokenize_reads_the_same_ids_as_the_tokenizer_call(tiny_bert):
    """The Rust backend read directly gives the ids, token types, masks and truncation count that
    `tokenizer(texts, truncation=True, max_length=...)` gives."""
    encoder = Encoder(str(tiny_bert), device="cpu", max_length=8, batch_size=3)
    texts = TEXTS + ["", "   ", "Ünïcödé façade naïve", "word " * 40]
    direct = encoder.tokenize(texts)
    encoder._direct_inputs = False  # the tokenizer's own call, the reference
    reference = encoder.tokenize(texts)
    assert direct.truncated == reference.truncated > 0
    assert len(direct.batches) == len(reference.batches)
    for got, expected in zip(direct.batches, reference.batches):
        np.testing.assert_array_equal(got.rows, expected.rows)
        np.testing.assert_array_equal(got.attention_mask, expected.attention_mask)
        assert got.inputs.keys() == expected.inputs.keys() == {"input_ids", "token_type_ids"}
        for name in got.inputs:
            np.testing.assert_array_equal(got.inputs[name], expected.inputs[name])
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    padded = tokenizer(texts, truncation=True, max_length=8, padding=True, return_tensors="np")
    first = direct.batches[0]
    width = first.attention_mask.shape[1]
    np.testing.assert_array_equal(first.inputs["input_ids"], padded["input_ids"][first.rows, :width])


def test_chunks_encode_in_order_with_the_next_tokenized_ahead(tiny_bert, monkeypatch):
    encoder = Encoder(str(tiny_bert), device="cpu", batch_size=2)
    whole = encoder.encode(TEXTS)
    chunks = [TEXTS[:3], TEXTS[3:4], TEXTS[4:]]
    got = [vectors for vectors, _ in encoder.encode_chunks(chunks)]
    assert [len(vectors) for vectors in got] == [3, 1, 2]
    # Other batches pad differently: equal up to float32 rounding.
    np.testing.assert_allclose(np.concatenate(got), whole, atol=1e-6)
    monkeypatch.setattr("retriever.encode.encoder.TOKENIZE_CHUNK", 2)  # the same through encode's own chunks
    np.testing.assert_allclose(encoder.encode(TEXTS), whole, atol=1e-6)


def test_an_error_while_tokenizing_ahead_reaches_the_caller_and_stops_the_thread(tiny_bert):
    import threading

    encoder = Encoder(str(tiny_bert), device="cpu")

    def chunks():
        yield TEXTS[:2]
        raise OSError("corpus file vanished")

    with pytest.raises(OSError, match="corpus file vanished"):
        list(encoder.encode_chunks(chunks()))
    read = []

    def endless():
        while True:
            read.append(1)
            yield TEXTS[:2]

    stream = encoder.encode_chunks(endless())
    next(stream)
    stream.close()  # a consumer that stops early (an interrupted build) stops the reader too
    count = len(read)
    assert count <= 3 and not any(t.name == "retriever-tokenize" for t in threading.enumerate())


def test_tokenizer_processes_give_the_vectors_one_thread_gives(tiny_bert, monkeypatch):
    """On a GPU, worker processes tokenize ahead (`tokenizer_workers`); forced on here, on the CPU."""
    monkeypatch.setattr("retriever.encode.encoder.TOKENIZE_CHUNK", 2)
    texts = TEXTS * 3
    encoder = Encoder(str(tiny_bert), device="cpu", max_length=8, batch_size=2)
    assert encoder.tokenizer_workers == 0  # none on a CPU
    expected, expected_truncated = encoder.encode_counting_truncated(texts)
    encoder.tokenizer_workers = 2
    vectors, truncated = encoder.encode_counting_truncated(texts)
    np.testing.assert_array_equal(vectors, expected)
    assert truncated == expected_truncated == 9


def test_a_script_without_a_main_guard_builds_with_tokenizer_processes(tiny_bert, tmp_path):
    """On a GPU, tokenizer worker processes are spawned, and the keyword index's writer; a spawned process used to
    import the user's script again, which built again at its top level and died. The same spawn paths, forced on
    here, on the CPU."""
    import os
    import subprocess
    import sys

    script = tmp_path / "build_notes.py"
    script.write_text(
        "import functools, sys\n"
        "import retriever.index\n"
        "from retriever import Document, Index\n"
        "from retriever.engines.local import LocalEngine\n"
        "retriever.index.LocalEngine = functools.partial(LocalEngine, keywords_in_process=True)\n"
        "notes = [Document(f'n{i}', f'note {i} about the harbour and its boats', None, 'notes', i + 1)\n"
        "         for i in range(40)]\n"
        "summary = Index.build(notes, 'notes', sys.argv[1], model=sys.argv[2], calibrator='none', device='cpu')\n"
        "print(Index.open('notes', sys.argv[1]).search('harbour boats', k=3, mode='keyword')[0].doc_id)\n"
        "print('built', summary.documents)\n")
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    environment = {**os.environ, "RETRIEVER_TOKENIZER_WORKERS": "2", "PYTHONPATH": str(repo)}
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "indexes"), str(tiny_bert)], cwd=tmp_path,
                          env=environment, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "built 40" and done.stdout.count("built") == 1
    assert done.stdout.strip().splitlines()[-2].startswith("n")  # the keyword index its worker wrote answers


def test_tokenizer_processes_are_asked_for_by_number(monkeypatch):
    import torch

    from retriever.encode.encoder import tokenizer_workers

    monkeypatch.setenv("RETRIEVER_TOKENIZER_WORKERS", "3")
    assert tokenizer_workers(torch.device("cpu")) == 3
    monkeypatch.setenv("RETRIEVER_TOKENIZER_WORKERS", "many")
    with pytest.raises(RetrieverError, match="RETRIEVER_TOKENIZER_WORKERS must be a number"):
        tokenizer_workers(torch.device("cpu"))


def test_the_batch_size_defaults_by_device(tiny_bert):
    from retriever.encode.encoder import default_batch_size

    assert Encoder(str(tiny_bert), device="cpu").batch_size == 32  # ONNX Runtime: long texts pad less
    assert Encoder(str(tiny_bert), device="cpu", runtime="torch").batch_size == 64
    assert Encoder(str(tiny_bert), device="cpu", batch_size=3).batch_size == 3
    assert default_batch_size(torch.device("cuda")) == 512  # small batches leave a GPU launching kernels
    assert default_batch_size(torch.device("cuda"), "torch") == 512
    assert default_batch_size(torch.device("cpu"), "onnx") == 32


def test_a_batch_the_gpu_has_no_memory_for_is_encoded_in_halves(tiny_bert):
    encoder = Encoder(str(tiny_bert), device="cpu", batch_size=8)
    expected = encoder.encode(TEXTS)
    forward, sizes = encoder._forward, []

    def at_most_two(attention_mask, inputs):  # a card with memory for two texts a pass
        if len(attention_mask) > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        sizes.append(len(attention_mask))
        return forward(attention_mask, inputs)

    encoder._forward = at_most_two
    np.testing.assert_allclose(encoder.encode(TEXTS), expected, atol=2e-5, rtol=1e-4)
    assert max(sizes) == 2 and sum(sizes) == len(TEXTS)

    encoder = Encoder(str(tiny_bert), device="cpu", batch_size=4)  # batches of 4 and 2
    forward, failed = encoder._forward, []

    def one_at_a_time(attention_mask, inputs):
        if len(attention_mask) > 1:
            failed.append(len(attention_mask))
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return forward(attention_mask, inputs)

    encoder._forward = one_at_a_time
    np.testing.assert_allclose(encoder.encode(TEXTS), expected, atol=2e-5, rtol=1e-4)
    assert failed == [4, 2]  # a size that failed is not tried again

    def none(attention_mask, inputs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    encoder._forward = none
    with pytest.raises(torch.cuda.OutOfMemoryError):  # not even one text fits: the error, not a loop
        encoder.encode(TEXTS)
