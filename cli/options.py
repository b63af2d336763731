"""Options shared by several commands, declared once so every command spells them the same way."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

Model = Annotated[
    Optional[str],
    typer.Option("--model", "-m", help="Hugging Face model name or local folder [default: all-MiniLM-L6-v2, embedded]"),
]
Pooling = Annotated[
    str, typer.Option("--pooling", "-p", help="cls | last-avg | last2-avg | first-last-avg (ignored with --layers)")
]
Layers = Annotated[
    Optional[str], typer.Option("--layers", help="mean of these hidden_states, e.g. 0,4 (0 = embedding output)")
]
MaxLength = Annotated[
    Optional[int], typer.Option("--max-length", help="tokens per text [default: the model's own limit]")
]
Device = Annotated[str, typer.Option("--device", help="auto | cpu | cuda (auto picks CUDA when present)")]
Dtype = Annotated[str, typer.Option("--dtype", help="fp32 | bf16 | fp16")]
BatchSize = Annotated[int, typer.Option("--batch-size", help="texts per forward pass")]
IndexName = Annotated[
    Optional[str],
    typer.Option("--name", "-n", help="index name [default: the only index, or for search/info the latest built]"),
]
IndexDir = Annotated[str, typer.Option("--index-dir", envvar="RETRIEVER_INDEX_DIR", help="where indexes live")]
Encoding = Annotated[str, typer.Option("--encoding", help="text encoding of the input file")]
