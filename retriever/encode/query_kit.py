"""Encoding queries without PyTorch or transformers: a kept ONNX graph and the model's Rust tokenizer.

A one-off search (`retriever search "..."`, a script that opens an index and asks one thing) spent most of its
seconds importing torch and transformers and loading the model's weights, to encode a dozen tokens. Once an
encoder has run on ONNX Runtime its graph is kept (`onnx_runtime.onnx_cache_dir`); a kit beside it records what
else a query needs: the tokenizer (its Rust backend, serialised), the tokenizing settings and the vector size,
under a key made of the encoder's record and the model folder's files (names, sizes, modification times), so a
changed model, or another ONNX Runtime, finds no kit and goes the long way. `QueryKitEncoder` then encodes
queries with the `tokenizers` and `onnxruntime` packages alone: the same token ids (`tokenizing.backend_tokens`)
and the same graph, so the same vectors as the encoder that left the kit.

A build and `retriever encode` on the CPU use the kit too (`model_card.encoder_for`): their documents and
pseudo-queries encoded in the batches the full encoder makes (the same vectors to the last bit), its long documents
cut with the kit's tokenizer (the model's own), and no model loaded: for a few hundred records, or a build from
precomputed vectors, loading the model was most of the build; so do writes to an open index (`index.load_encoder`:
`Index.add`, the server).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path

import numpy as np

from retriever.encode.tokenizing import (
    TOKENIZE_CHUNK,
    Prefetched,
    TokenizedTexts,
    TokenizerSettings,
    backend_tokens,
    padded_batches,
)

# 2: kits name fused graphs (`onnx_runtime._fused`); a kit of 1 names a plain graph, and is passed over so the next
# full load keeps one that names the faster graph.
KIT_FORMAT = 2
KITS = "kits"  # the folder beside the graphs
ONNX_CACHE_ENV = "RETRIEVER_ONNX_CACHE"
SPIN_MICROSECONDS = 50  # a worker's longest spin between two operators of one run
# The first ONNX Runtime measured to honour `session.intra_op.spin_duration_us` (earlier releases ignore an unknown
# key, so their workers would spin unbounded within a run: measured slower beside a busy neighbour).
SPIN_BOUNDED_FROM = (1, 32)


def onnx_cache_dir() -> Path:
    """Where graphs and kits are kept: $RETRIEVER_ONNX_CACHE, else retriever/onnx in the user's cache folder."""
    if os.environ.get(ONNX_CACHE_ENV):
        return Path(os.environ[ONNX_CACHE_ENV]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "retriever" / "onnx"


def load_onnxruntime():
    """ONNX Runtime's module (ImportError where it is not installed). A Ctrl-C while its compiled module first loads
    is held until the load ends, then raised: one arriving inside the load comes out of it as an ImportError
    ("import numpy failed"), which read as "no ONNX Runtime here", and the command went on on PyTorch. Only the main
    thread, with Python's own Ctrl-C handler in place, holds it (no other thread may set a handler)."""
    if "onnxruntime" in sys.modules or threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        import onnxruntime

        return onnxruntime
    held: list[int] = []
    signal.signal(signal.SIGINT, lambda number, frame: held.append(number))
    try:
        import onnxruntime
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if held:
            raise KeyboardInterrupt
    return onnxruntime


def session_options(threads: int | None = None, spin_within_runs: bool = False):
    """ONNX Runtime's settings for an encoder's session, THREADS intra-op threads (default: ONNX Runtime's own
    choice, the physical cores). Idle workers sleep: on a few cores a spinning pool takes the CPU that a server's HTTP
    loop and its next batch need (the server's kit, `onnx_runtime.OnnxForward`: with 16 clients, spinning within
    runs served 15% fewer queries a second, benchmarks/results/query_runtime.md).

    SPIN_WITHIN_RUNS (`Index.search`'s kit: one caller's queries, run after run): within a run the workers spin
    briefly between operators (at most SPIN_MICROSECONDS each wait, on ONNX Runtime SPIN_BOUNDED_FROM onward) and stop
    when the run ends. A short query is a hundred small operators, and a worker put to sleep after each costs more
    than the operator; one still spinning after the run would take the CPU from the search that follows it."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    if spin_within_runs and spin_is_bounded():
        options.add_session_config_entry("session.intra_op.allow_spinning", "1")
        options.add_session_config_entry("session.intra_op.spin_duration_us", str(SPIN_MICROSECONDS))
        options.add_session_config_entry("session.force_spinning_stop", "1")
    else:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    return options


def spin_is_bounded() -> bool:
    """Whether the installed ONNX Runtime is one measured to honour a bound on a worker's spin (SPIN_BOUNDED_FROM)."""
    import onnxruntime

    parts = onnxruntime.__version__.split(".")
    try:
        return (int(parts[0]), int(parts[1])) >= SPIN_BOUNDED_FROM
    except (IndexError, ValueError):  # not a release number: assume the least
        return False


def kit_may_serve(record: dict, device: str | None, runtime: str) -> bool:
    """Whether queries for the encoder RECORD, on DEVICE with RUNTIME, would run on ONNX Runtime on the CPU
    (`encode.runtimes`: auto picks it there for fp32), told without importing torch: the device is the CPU, or auto
    where the machine has no GPU (where it may have one, torch decides); never for vectors computed outside."""
    from retriever.encode.device import surely_cpu

    if runtime not in ("auto", "onnx") or record.get("dtype", "fp32") != "fp32" or record.get("external"):
        return False
    return surely_cpu(device)


def kit_key(record: dict) -> str | None:
    """The kit's key for an encoder RECORD (a manifest's `encoder`), or None where its model is not a local folder
    (a hub name resolves to files that may change under it; that encoder loads the long way)."""
    from retriever.encode.models import resolve_model_path

    try:
        onnxruntime = load_onnxruntime()
        folder = Path(resolve_model_path(record.get("model")))
    except Exception:  # noqa: BLE001 - no ONNX Runtime, or a model name that does not resolve here: no kit
        return None
    if not folder.is_dir():
        return None
    try:
        # A file rewritten in place keeps its name and may keep its size and modification time (`cp -p`, `rsync
        # -a`, unpacking an archive): its change time and inode move on any rewrite, and no copy tool sets them.
        files = [(path.name, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino)
                 for path in sorted(folder.iterdir()) if path.is_file() for stat in (path.stat(),)]
    except OSError:  # a file removed while listed, an unreadable folder: no kit, the long way
        return None
    # The exporter's versions too (torch, onnx): after an upgrade the full encoder exports another graph, and a
    # kit naming the old one would encode otherwise.
    described = (KIT_FORMAT, onnxruntime.__version__, _version("tokenizers"), _version("transformers"),
                 _version("torch"), _version("onnx"),
                 str(folder.resolve()), files,
                 json.dumps({key: record.get(key) for key in ("model", "pooling", "layers", "max_length", "dtype")},
                            sort_keys=True))
    return hashlib.sha256(repr(described).encode()).hexdigest()[:40]


def _version(package: str) -> str | None:
    """PACKAGE's installed version, read without importing it (transformers built the tokenizer a kit keeps)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def keep_kit(record: dict, graph: Path, tokenizer_json: str, settings: TokenizerSettings, dim: int) -> None:
    """Leave the kit for RECORD's encoder: its GRAPH (a kept file), the Rust tokenizer serialised (TOKENIZER_JSON),
    its SETTINGS and the vector size DIM. Written whole or not at all; nothing where the folder cannot be written."""
    key = kit_key(record)
    if key is None:
        return
    path = onnx_cache_dir() / KITS / f"{key}.json"
    body = json.dumps({"format": KIT_FORMAT, "graph": graph.name, "dim": dim, "settings": asdict(settings),
                       "tokenizer": tokenizer_json})
    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_file() and path.read_text(encoding="utf-8") == body:
            return
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=".kit-", suffix=".tmp")
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(body)
        os.replace(temporary, path)
    except OSError:
        if temporary is not None:
            Path(temporary).unlink(missing_ok=True)


class QueryKitEncoder:
    """Queries encoded from a kit: `encode(texts)` gives the float32 (n, dim) pooled vectors the full encoder
    gives. `open(record)` finds the kit, or returns None."""

    runtime = "onnx"

    def __init__(self, graph: Path, tokenizer_json: str, settings: TokenizerSettings, dim: int, model_name: str,
                 spin_within_runs: bool = False):
        import onnxruntime
        from tokenizers import Tokenizer

        self.backend = Tokenizer.from_str(tokenizer_json)
        # A Rust tokenizer is not safe to call from two threads at once ("Already borrowed"), and Index.search may
        # be: tokenizing takes turns, as in the full encoder; the session's runs need no lock.
        self._tokenizer_lock = threading.Lock()
        self.settings, self.dim, self.model_name = settings, dim, model_name
        self.max_length = settings.max_length
        options = session_options(_threads_asked(), spin_within_runs=spin_within_runs)
        self.session = onnxruntime.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])

    @classmethod
    def open(cls, record: dict, spin_within_runs: bool = False) -> QueryKitEncoder | None:
        """The kit kept for the encoder RECORD, or None. SPIN_WITHIN_RUNS: for one caller's queries, run after run
        (`session_options`), not a server's concurrent batches."""
        key = kit_key(record)
        if key is None:
            return None
        path = onnx_cache_dir() / KITS / f"{key}.json"
        try:
            kit = json.loads(path.read_text(encoding="utf-8"))
            if kit.get("format") != KIT_FORMAT:
                return None
            settings = TokenizerSettings(**{**kit["settings"], "input_names": tuple(kit["settings"]["input_names"])})
            graph = path.parent.parent / kit["graph"]
            if not graph.is_file():
                return None
            return cls(graph, kit["tokenizer"], settings, int(kit["dim"]), str(record.get("model")),
                       spin_within_runs)
        except FileNotFoundError:
            return None
        except Exception:  # noqa: BLE001 - a damaged kit (a crash mid-write elsewhere): the long way, as if none
            return None

    def encode(self, texts, progress: bool = False, description: str = "Encoding") -> np.ndarray:
        return self.encode_counting_truncated(texts, progress, description)[0]

    def encode_counting_truncated(self, texts, progress: bool = False,
                                  description: str = "Encoding") -> tuple[np.ndarray, int]:
        """Vectors (n, dim) float32 in input order, and how many texts were cut at max_length: in the batches the
        full encoder makes of them (`tokenizing.TOKENIZE_CHUNK`), so the same vectors."""
        texts = list(texts)
        output = np.empty((len(texts), self.dim), dtype=np.float32)
        truncated = 0
        with _progress(description, len(texts), progress) as advance:
            for first in range(0, len(texts), TOKENIZE_CHUNK):
                tokenized = self.tokenize(texts[first : first + TOKENIZE_CHUNK])
                output[first : first + len(tokenized.texts)] = self.encode_tokenized(tokenized, advance)
                truncated += tokenized.truncated
        return output, truncated

    def encode_chunks(self, chunks: Iterable[Sequence[str]],
                      on_batch: Callable[[int], None] | None = None) -> Iterator[tuple[np.ndarray, int]]:
        """(vectors, truncated) for each chunk of texts, in order, as `Encoder.encode_chunks` on a CPU: the next
        chunk tokenized on a second thread while this one is encoded."""
        with Prefetched(self.tokenize, chunks) as tokenized_chunks:
            for tokenized in tokenized_chunks:
                yield self.encode_tokenized(tokenized, on_batch), tokenized.truncated

    def tokenize(self, texts: Sequence[str]) -> TokenizedTexts:
        """TEXTS tokenized (cut at max_length) and cut into padded batches, as the full encoder cuts them."""
        texts = list(texts)
        with self._tokenizer_lock:
            tokens, truncated = backend_tokens(self.backend, texts, self.settings)
        return padded_batches(texts, tokens, truncated, self.settings)

    def encode_tokenized(self, tokenized: TokenizedTexts,
                         on_batch: Callable[[int], None] | None = None) -> np.ndarray:
        """Vectors (n, dim) float32 for TOKENIZED's texts, in their order."""
        output = np.empty((len(tokenized.texts), self.dim), dtype=np.float32)
        for batch in tokenized.batches:
            feed = {"attention_mask": batch.attention_mask,
                    **{name: batch.inputs[name] for name in self.settings.input_names}}
            output[batch.rows] = self.session.run(["vectors"], feed)[0]
            if on_batch is not None:
                on_batch(len(batch.rows))
        return output

    def close(self) -> None:
        """Nothing to release but the session, which goes with the object."""


def _threads_asked() -> int | None:
    """The threads $OMP_NUM_THREADS asks for, which the full encoder's session takes through torch (None: not set,
    ONNX Runtime's own choice, the physical cores, as torch's)."""
    try:
        threads = int(os.environ.get("OMP_NUM_THREADS", ""))
    except ValueError:
        return None
    return threads if threads > 0 else None


def _progress(description: str, total: int, enabled: bool):
    """`progress.progress_bar` where ENABLED; else a no-op, without importing rich (a query's path stays light)."""
    if enabled:
        from retriever.progress import progress_bar

        return progress_bar(description, total=total)
    return nullcontext(lambda rows: None)
