"""Options shared by several commands, declared once so every command spells them the same way.

Every option's help shows its default: click prints "[default: X]" for a value, and an option whose default is
None says what None means with `default(...)`. An option with a fixed set of values lists them as its metavar
and refuses any other as a usage error (`choice`)."""

from __future__ import annotations

import re
from typing import Annotated, Optional

import typer

from retriever.search.options import FUSIONS, MODES, SPACES, described

# The library's own lists (retriever.encode.pooling.POOLING_MODES, retriever.encode.device.DEVICES,
# retriever.encode.encoder.DTYPES, retriever.store.vectors.INDEX_TYPES), repeated here so `--help` imports neither
# torch nor faiss; a test keeps them equal. The search parameters come from the library itself
# (`retriever.search.options`, light on purpose).
POOLING_MODES = ("cls", "last-avg", "last2-avg", "first-last-avg")
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("fp32", "bf16", "fp16")
INDEX_TYPES = ("auto", "flat", "hnsw", "ivf", "ivfpq")
CALIBRATORS = "auto | flow | flow-K | flow+lu | whitening | whitening-K | sn | natsv-K | sn+natsv-K | none"


def default(text: str) -> str:
    """The "[default: TEXT]" note of an option whose default is None. Escaped: typer renders help as rich markup,
    which would take a bare "[default: ...]" for a style tag and drop it."""
    return f"\\[default: {text}]"


def choice(values: tuple[str, ...], pattern: str | None = None, shown: str | None = None) -> dict:
    """typer.Option arguments for one of VALUES (or a value matching PATTERN, shown as SHOWN): the metavar lists
    them in the help, and the parser refuses anything else as a usage error. (A parser rather than a Literal
    annotation: it works with every typer, and lets --device take cuda:N too.)"""
    listed = [*values, *([shown] if shown else [])]

    def parse(value: str) -> str:
        if value in values or (pattern and re.fullmatch(pattern, value)):
            return value
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(listed)}")

    return {"parser": parse, "metavar": "[" + "|".join(listed) + "]"}


Model = Annotated[
    Optional[str],
    typer.Option("--model", "-m", help="Hugging Face model name or local folder "
                 + default("all-MiniLM-L6-v2, embedded")),
]
Pooling = Annotated[
    str, typer.Option("--pooling", "-p", **choice(POOLING_MODES), help="ignored with --layers")
]
Layers = Annotated[
    Optional[str], typer.Option("--layers", help="mean of these hidden_states, e.g. 0,4 (0 = embedding output) "
                                + default("the --pooling layers"))
]
MaxLength = Annotated[
    Optional[int], typer.Option("--max-length", help="tokens per text " + default("the model's limit"))
]
Device = Annotated[str, typer.Option("--device", **choice(DEVICES, r"cuda:\d+", "cuda:N"),
                                     help="auto picks CUDA when present; cuda:N picks one GPU of several")]
Dtype = Annotated[str, typer.Option("--dtype", **choice(DTYPES), help="model weights' precision")]
Runtime = Annotated[str, typer.Option(
    "--runtime", **choice(("auto", "torch", "onnx")),
    help="run the encoder on PyTorch or ONNX Runtime (same numbers; on a CPU ONNX Runtime encodes faster, and once "
    "its graph is kept a search loads no model at all); auto: onnx on a CPU in fp32 when onnxruntime is installed "
    "and can take the model, else torch")]
BatchSize = Annotated[Optional[int], typer.Option(
    "--batch-size",
    help="texts per forward pass " + default("32 on a CPU on ONNX Runtime, 64 on PyTorch, 512 on a GPU"))]
IndexName = Annotated[
    Optional[str],
    typer.Option("--name", "-n", help="index name " + default(
        "the only index; a command that only reads takes the most recently written one")),
]
IndexDir = Annotated[
    Optional[str],
    typer.Option("--index-dir", show_default=False,
                 help="where indexes live " + default("$RETRIEVER_HOME, else ~/.local/share/retriever/indexes")),
]
def _search(name: str) -> str:
    """The help of search parameter NAME, as `retriever.search.options.SearchOptions` declares it, with its default
    in words where it has none of its own."""
    about = described(name)
    return about["help"] + (" " + default(about["unset"]) if about["unset"] else "")


# The search parameters: SearchOptions declares them (meaning, choices, bounds); the CLI spells them as flags.
K = Annotated[int, typer.Option("-k", min=1, max=described("k")["le"], help=_search("k"))]
Mode = Annotated[Optional[str], typer.Option("--mode", **choice(MODES), help=_search("mode"))]
Fusion = Annotated[Optional[str], typer.Option("--fusion", **choice(FUSIONS), help=_search("fusion"))]
Weight = Annotated[Optional[float], typer.Option("--weight", min=described("weight")["ge"],
                                                 max=described("weight")["le"], help=_search("weight"))]
Where = Annotated[Optional[str], typer.Option("--where", help=_search("where").replace("{", "'{", 1).replace(
    "}}", "}}'", 1))]
MinScore = Annotated[Optional[float], typer.Option("--min-score", help=_search("min_score"))]
Space = Annotated[str, typer.Option("--space", **choice(SPACES), help=_search("space"))]
NProbe = Annotated[Optional[int], typer.Option("--nprobe", help=_search("nprobe"))]
EfSearch = Annotated[Optional[int], typer.Option("--ef-search", help=_search("ef_search"))]
Rerank = Annotated[Optional[int], typer.Option("--rerank", help=_search("rerank"))]
Encoding = Annotated[str, typer.Option("--encoding", help="text encoding of the input file")]

# Library parameters a command's options name otherwise: {command: {library spelling: the option's spelling}}, a
# spelling being a parameter's name or a whole setting (name=value). A test keeps every entry pointing at an option.
LIBRARY_NAMES = {
    "bench": {"calibrators": "calibrator", "folder": "cache_dir", "folder=None": "no_cache=True", "modes": "mode"},
    "serve": {"allow_without_key=True": "no_key=True"},
}


def flag_names(command) -> dict[str, str]:
    """How COMMAND (a click command) spells the library's parameters, for `RetrieverError.render`: derived from
    its options, so a renamed flag cannot drift. Each option's Python name maps to its long flag ("fit_sample":
    "--fit-sample"), a switch's setting too ("no_key=True": "--no-key"); then the command's LIBRARY_NAMES."""
    names = {}
    for option in command.params:
        if option.param_type_name != "option":
            continue
        flag = next((spelling for spelling in option.opts if spelling.startswith("--")), option.opts[0])
        names[option.name] = flag
        if option.is_bool_flag:
            names[f"{option.name}=True"] = flag
            if option.secondary_opts:
                names[f"{option.name}=False"] = option.secondary_opts[0]
    for library, own in LIBRARY_NAMES.get(command.name, {}).items():
        if own in names:
            names[library] = names[own]
    return names
