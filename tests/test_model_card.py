"""The model card: an encoder's record read from the model's files equals the loaded encoder's, so a build from
precomputed vectors loads no model; and commands that encode nothing import no torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from retriever.errors import RetrieverError
from retriever.encode.model_card import DeferredEncoder, ModelCard
from tests.helpers import write_jsonl

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("settings", [
    {"pooling": "last-avg", "layers": None, "max_length": None},
    {"pooling": "first-last-avg", "layers": None, "max_length": 128},
    {"pooling": None, "layers": "0", "max_length": 512},
    {"pooling": "cls", "layers": None, "max_length": 300},
])
def test_the_default_models_card_gives_the_loaded_encoders_record(settings):
    from retriever.encode.encoder import Encoder

    card = ModelCard.read(None)
    expected = Encoder(None, settings["pooling"], settings["layers"], settings["max_length"], device="cpu").config()
    assert card.encoder_config(settings["pooling"], settings["layers"], settings["max_length"], "fp32") == expected


def test_the_card_refuses_what_the_encoder_refuses():
    card = ModelCard.read("all-MiniLM-L6-v2")
    with pytest.raises(RetrieverError, match="at most 512 tokens"):
        card.encoder_config("last-avg", None, 600, "fp32")
    with pytest.raises(RetrieverError, match="layer 9 does not exist"):
        card.encoder_config(None, "9", None, "fp32")
    with pytest.raises(RetrieverError, match="unknown pooling"):
        card.encoder_config("max", None, None, "fp32")


@pytest.mark.parametrize("model_type", ["bert", "electra", "mpnet", "roberta", "xlm-roberta"])
def test_positions_read_from_config_match_the_loaded_models(model_type, tmp_path):
    """RoBERTa-style models lose padding_idx + 1 positions; BERT-style none: the card must know which is which."""
    from transformers import AutoConfig, AutoModel

    from retriever.encode.encoder import model_positions

    config = AutoConfig.for_model(model_type, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=37, vocab_size=99, embedding_size=32,
                                  max_position_embeddings=130)
    config.save_pretrained(tmp_path)
    card = ModelCard.read(str(tmp_path))
    assert card.positions == model_positions(AutoModel.from_config(config))
    assert (card.hidden_size, card.num_hidden_layers) == (32, 2)


def test_no_card_where_the_files_cannot_say(tmp_path):
    """An unknown model type or a name in no local folder or cache: the encoder is loaded instead."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "hidden_size": 8,
                                                      "num_hidden_layers": 1}))
    assert ModelCard.read(str(tmp_path)) is None
    assert ModelCard.read("nobody/no-such-model-anywhere") is None


def test_a_deferred_encoder_refuses_a_model_that_is_not_its_record(minilm_encoder):
    record = {**minilm_encoder.config(), "max_length": 7}
    deferred = DeferredEncoder(record, lambda: minilm_encoder)
    assert (deferred.dim, deferred.config(), deferred.loaded) == (384, record, False)
    with pytest.raises(RetrieverError, match="its files describe"):
        deferred.encode(["a text"])


def test_a_build_from_vectors_loads_no_model_and_records_the_encoder(tmp_path, minilm_encoder):
    """The manifest's encoder record is the one queries are encoded with: it must be the loaded encoder's."""
    docs = {f"d{i}": f"document number {i} about topic {i % 5}" for i in range(40)}
    corpus = write_jsonl(tmp_path / "docs.jsonl", docs)
    np.save(tmp_path / "vectors.npy", minilm_encoder.encode(list(docs.values())))
    script = (
        "import sys, json\n"
        "from retriever import Index\n"
        f"summary = Index.build({str(corpus)!r}, 'v', vectors={str(tmp_path / 'vectors.npy')!r}, "
        "calibrator='whitening')\n"
        "manifest = json.loads(open(summary.folder + '/manifest.json').read())\n"
        "print(json.dumps({'torch': 'torch' in sys.modules, 'transformers': 'transformers' in sys.modules,\n"
        "                  'encoder': manifest['encoder'], 'documents': summary.documents}))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["torch"] is False and report["transformers"] is False
    assert report["encoder"] == minilm_encoder.config() and report["documents"] == 40


def test_commands_that_encode_nothing_import_no_torch(tmp_path, minilm_encoder):
    """list, show, info, versions, verify, delete and compact answer without torch or transformers (seconds
    saved on every call)."""
    docs = {f"d{i}": f"note {i} on the subject of {['tea', 'rain', 'ships'][i % 3]}" for i in range(30)}
    corpus = write_jsonl(tmp_path / "docs.jsonl", docs)
    np.save(tmp_path / "vectors.npy", minilm_encoder.encode(list(docs.values())))
    commands = [["build", str(corpus), "--name", "n", "--vectors", str(tmp_path / "vectors.npy"),
                 "--calibrator", "whitening"],
                ["list"], ["show", "d3"], ["info"], ["versions"], ["verify"], ["delete", "d4"], ["compact"]]
    script = (
        "import sys, json\n"
        "from cli.main import app\n"
        f"for command in {commands!r}:\n"
        "    try:\n"
        "        assert not app(command, standalone_mode=False), command\n"
        "    except SystemExit as stop:\n"
        "        assert not stop.code, (command, stop.code)\n"
        "print(json.dumps({name: name in sys.modules for name in ('torch', 'transformers')}))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"torch": False, "transformers": False}


def test_a_build_on_the_cpu_from_a_kept_kit_fits_its_flow_without_torch(tmp_path, tiny_bert):
    """Once a build has left the model's kit, the next build on the CPU encodes from it and fits its flow in NumPy:
    neither torch nor transformers is imported (their import was most of a small build's time)."""
    import os
    import shutil

    from retriever import Index
    from retriever.encode.query_kit import onnx_cache_dir

    model = tmp_path / "model"
    shutil.copytree(tiny_bert, model)
    subjects = ["tea", "rain", "ships", "maps"]
    docs = {f"d{i}": f"note {i} on the subject of {subjects[i % 4]} and more" for i in range(80)}
    corpus = write_jsonl(tmp_path / "docs.jsonl", docs)
    Index.build(corpus, "first", tmp_path / "indexes", model=str(model), calibrator="flow", device="cpu")  # the kit
    script = (
        "import sys, json\n"
        "from retriever import Index\n"
        f"summary = Index.build({str(corpus)!r}, 'second', {str(tmp_path / 'indexes')!r}, model={str(model)!r}, "
        "calibrator='flow', device='cpu')\n"
        "print(json.dumps({'torch': 'torch' in sys.modules, 'transformers': 'transformers' in sys.modules,\n"
        "                  'documents': summary.documents}))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**os.environ, "RETRIEVER_ONNX_CACHE": str(onnx_cache_dir())})
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"torch": False, "transformers": False,
                                                                "documents": 80}
    first, second = (Index.open(name, tmp_path / "indexes") for name in ("first", "second"))
    assert first.search("rain", k=3) == second.search("rain", k=3)  # the same flow, fitted in either process
