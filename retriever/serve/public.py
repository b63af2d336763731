"""What a client of the server may see of it: answers and messages without server paths, parameters spelled as
the client sends them. Shared by the HTTP API (`retriever.serve.app`) and the MCP tools (`retriever.serve.mcp_tools`)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from retriever.errors import NO_VALUE, RetrieverError
from retriever.files.folder import FOLDER_KEY
from retriever.metadata import ADAPTER_KEYS, RESERVED


def as_json_reads_it(problem: RetrieverError, names: dict[str, str] | None = None) -> str:
    """PROBLEM's message for a client that sends JSON: a suggested setting spelled as the field to send
    ('"replace": true'), a parameter by its field name (or as NAMES renames it: a tool's `filter` for `where`)."""
    names = names or {}
    return "".join(part if isinstance(part, str) else names.get(part.name, part.name) if part.value is NO_VALUE
                   else f'"{names.get(part.name, part.name)}": {json.dumps(part.value)}' for part in problem.parts)


def describe_invalid(problem: dict) -> str:
    """One of pydantic's validation errors as a clause: the field at fault and what was wrong ("k: Input should be
    less than or equal to 1000")."""
    parts = [str(part) for part in problem.get("loc", ())]
    # FastAPI's locations lead with where a field was ("body", "query" for the URL's): dropped, but where the
    # field itself is named so (an MCP tool's `query` argument)
    if parts[:1] == ["body"] or (len(parts) > 1 and parts[0] == "query"):
        parts = parts[1:]
    where = ".".join(parts)
    return f"{where}: {problem.get('msg', 'invalid')}" if where else problem.get("msg", "invalid request")


def public_model(model: str) -> str:
    """A model named by a local folder is shown by the folder's name: no server path in any answer."""
    return Path(model).name if os.path.isabs(model) else model


def public_metadata(metadata: dict | None) -> dict | None:
    """A document's metadata as a client sees it: without the folder it was read from on the server (an absolute
    server path; `path`, the file within it, stays) and without what a framework adapter keeps for itself (a Haystack
    store's exact embeddings: kilobytes per hit)."""
    if not metadata:
        return metadata
    return {key: value for key, value in metadata.items() if key != FOLDER_KEY and key not in ADAPTER_KEYS}


def public_source(source: str | None) -> str | None:
    """Where a document was read from, by its file's name: no server path (a corpus file, a folder)."""
    return Path(source).name if source and os.path.isabs(source) else source


def public_record(record: dict, private: tuple[str, ...]) -> dict:
    """A `describe_indexes` record without server paths (no folder; the version by its number; no `folder`
    among the metadata fields, whose values, the server's folder, no answer shows)."""
    public = {key: value for key, value in record.items() if key != "folder"}
    if public.get("fields"):
        public["fields"] = public_fields(public["fields"])
    public.setdefault("version", None)  # an index whose manifest fails its checks: "problem" says why
    if "model" in public:
        public["model"] = public_model(public["model"])
    if "problem" in public:
        public["problem"] = scrub(public["problem"], private)
    return public


# The document's own fields a client may filter on: not `source`, which holds a server path
# (`serve.searching.check_public_filter`).
PUBLIC_OWN_FIELDS = RESERVED - {"source"}


def public_fields(fields: list[str]) -> list[str]:
    """An index's metadata FIELDS as a client is offered them: not `folder`, whose values (the server's folder) no
    answer shows, and which a filter may not read (`serve.searching.check_public_filter`)."""
    return [field for field in fields if field != FOLDER_KEY]


def private_paths(index_dir: Path) -> tuple[str, ...]:
    """Server paths that must not reach a client, longest first: the index home (as given and resolved) and the
    user's home folder."""
    paths = {str(index_dir), os.path.realpath(index_dir), str(Path.home())}
    return tuple(sorted((path for path in paths if len(path) > 1), key=len, reverse=True))


def scrub(message: str, private: tuple[str, ...]) -> str:
    """MESSAGE with server paths replaced by what they are (the index home, ~)."""
    for path in private:
        message = message.replace(path, "~" if path == str(Path.home()) else "<index home>")
    return message


_LINK_TARGET = re.compile(r"\(to .*, which does not exist\)")  # a broken link's note: its target, any path


def without_folder(message: str, folder: str | None) -> str:
    """MESSAGE (a sync's error or note) with the server FOLDER an index was built from shown by its name, as a
    document's source is, and a broken link's target by what it is."""
    if folder:
        for path in dict.fromkeys((folder, os.path.realpath(folder))):
            message = message.replace(path, Path(folder).name)
    return _LINK_TARGET.sub("(to a path on the server, which does not exist)", message)


def one_line(message: str) -> str:
    return " ".join(message.split())
