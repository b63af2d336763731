"""Where indexes live and what they are called: the index home, the name rule, and an index's path in it.

    INDEX_DIR/NAME -> .versions/NAME/FOLDER     a name is a link to its current version (`retriever.versions.folder`)

Every reader and writer finds an index through here, so a name is always a safe file name, a URL path part and a
shell word, and the home is the same from any working folder.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

from retriever.errors import NotFoundError, RetrieverError, param
from retriever.text import did_you_mean
from retriever.versions.layout import MANIFEST

HOME_VARIABLE = "RETRIEVER_HOME"
# One rule for every index name, so a name is always a safe file name, a URL path part and a shell word.
NAME_RULE = "1 to 64 ASCII letters, digits, '.', '_' or '-', starting with a letter or digit"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        shown = repr(name) if len(str(name)) <= 40 else repr(str(name)[:40]) + f"... ({len(name)} characters)"
        raise RetrieverError(f"invalid index name {shown}: a name is {NAME_RULE}")
    return name


def resolve_index_dir(index_dir: str | Path | None = None) -> Path:
    """Where indexes live, independent of the current folder: INDEX_DIR when given, else $RETRIEVER_HOME, else
    the user's data folder ($XDG_DATA_HOME/retriever/indexes, by default ~/.local/share/retriever/indexes).
    Always absolute and resolved (links and '..' followed), so messages name the real place and a version's path
    compares with what the index's link resolves to; a path that exists but is not a folder is refused."""
    if index_dir is None or str(index_dir) == "":
        index_dir = os.environ.get(HOME_VARIABLE) or None
    if index_dir is None:
        data_home = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
        index_dir = Path(data_home) / "retriever" / "indexes"
    folder = Path(index_dir).expanduser().resolve()
    if folder.exists() and not folder.is_dir():
        raise RetrieverError(f"index folder {folder} is not a folder")
    return folder


def index_path(index_dir: str | Path, name: str) -> Path:
    return Path(index_dir) / check_name(name)


def index_options(index_dir: str | Path, name: str | None = None) -> str:
    """The CLI options that point at this index, for the hints in messages ("build it with: retriever build ...")."""
    options = [f"--name {shlex.quote(name)}"] if name else []
    try:
        default = resolve_index_dir(None)
    except RetrieverError:
        default = None
    if Path(index_dir).absolute() != default:
        options.append(f"--index-dir {shlex.quote(str(Path(index_dir).absolute()))}")
    return " ".join(options)


def resolve_existing(index_dir: str | Path, name: str) -> Path:
    """The folder of the current version of NAME (a plain folder works too)."""
    link = index_path(index_dir, name)
    if not link.exists():
        suggestion = did_you_mean(name, list_indexes(index_dir))
        if suggestion:
            raise NotFoundError(f"no index named '{name}' in {index_dir}{suggestion}")
        raise NotFoundError(
            f"no index named '{name}' in {index_dir}; build it with: "
            f"retriever build CORPUS {index_options(index_dir, name)}"
        )
    return link.resolve()


def check_target(index_dir: str | Path, name: str) -> None:
    """Writing NAME replaces a link; a plain folder in its place is someone else's and is never replaced."""
    link = index_path(index_dir, name)
    if Path(index_dir).exists() and not Path(index_dir).is_dir():
        raise RetrieverError(f"index folder {Path(index_dir).absolute()} is not a folder")
    if link.exists() and not link.is_symlink():
        raise RetrieverError(f"{link} is a plain folder, not a retriever index link; move it away first")


def list_indexes(index_dir: str | Path) -> list[str]:
    """Names of the indexes in index_dir, most recently written first."""
    folder = Path(index_dir)
    if not folder.is_dir():
        return []
    links = [path for path in folder.iterdir()
             if NAME.fullmatch(path.name) and (path / MANIFEST).is_file()]  # a name never starts with "."
    return [path.name for path in sorted(links, key=lambda path: (path / MANIFEST).stat().st_mtime, reverse=True)]
