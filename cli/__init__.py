"""The `retriever` command line: a thin typer layer over the `retriever` library."""
