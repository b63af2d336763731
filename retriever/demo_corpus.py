"""A real corpus available on every machine with Python: paragraphs of the standard library's docstrings.

    python -m retriever.demo_corpus indexes/stdlib-docs.jsonl [--limit 4000]

Writes a BEIR-style jsonl (`_id` = module.object#paragraph, `title` = the object's qualified name, `text`).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import warnings
from collections.abc import Iterator
from pathlib import Path

# Widely used, import-safe modules (no GUI, no side effects on import), so the corpus is the same everywhere.
MODULES = (
    "abc argparse array ast asyncio base64 bisect bz2 calendar collections concurrent.futures configparser contextlib "
    "copy csv dataclasses datetime decimal difflib email enum fileinput fnmatch fractions functools getpass gettext "
    "glob gzip hashlib heapq hmac html http.client http.server imaplib importlib inspect io ipaddress itertools json "
    "locale logging lzma mailbox math mimetypes multiprocessing operator os pathlib pickle platform pprint queue "
    "random re sched secrets select selectors shelve shlex shutil signal smtplib socket sqlite3 ssl statistics string "
    "struct subprocess tarfile tempfile textwrap threading time timeit tokenize traceback types typing unittest "
    "urllib.parse urllib.request uuid warnings weakref xml.etree.ElementTree zipfile zlib"
).split()
MIN_WORDS = 8


def paragraphs(docstring: str) -> Iterator[str]:
    for block in inspect.cleandoc(docstring).split("\n\n"):
        text = " ".join(block.split())
        # Prose only: skip doctest examples, signatures and short fragments.
        if len(text.split()) >= MIN_WORDS and not text.startswith((">>>", "...")) and "::" not in text[-3:]:
            yield text


def documents(limit: int | None = None) -> Iterator[dict]:
    count, seen = 0, set()
    for module_name in MODULES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                module = importlib.import_module(module_name)
            except ImportError:  # e.g. a Python built without ssl or sqlite3
                continue
        objects = [(module_name, module)]
        for attribute, value in sorted(vars(module).items()):
            if attribute.startswith("_") or getattr(value, "__module__", None) != module.__name__:
                continue
            if inspect.isfunction(value):
                objects.append((f"{module_name}.{attribute}", value))
            elif inspect.isclass(value):
                objects.append((f"{module_name}.{attribute}", value))
                objects.extend(
                    (f"{module_name}.{attribute}.{method}", function)
                    for method, function in sorted(vars(value).items())
                    if not method.startswith("_") and inspect.isfunction(function)
                )
        for name, value in objects:
            for number, text in enumerate(paragraphs(inspect.getdoc(value) or "")):
                if text in seen:
                    continue
                seen.add(text)
                yield {"_id": f"{name}#{number}", "title": name, "text": text}
                count += 1
                if limit and count >= limit:
                    return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--limit", type=int, default=4000, help="at most this many paragraphs")
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as file:
        written = sum(file.write(json.dumps(doc, ensure_ascii=False) + "\n") > 0 for doc in documents(args.limit))
    print(f"wrote {written} standard-library docstring paragraphs to {args.out}")


if __name__ == "__main__":
    main()
