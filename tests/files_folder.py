"""A folder of real files, as a person keeps them, made by the tests: Markdown, HTML, reStructuredText, text, a
PDF of several pages, a Word file; beside them what a build must skip: a damaged PDF, an encrypted one, a file in
an unknown encoding, a binary, hidden files, ignored files and a symbolic link loop."""

from __future__ import annotations

import os
from pathlib import Path

# Each readable file's last sentence: a query that must find it.
LAST_SENTENCES = {
    "notes/garden.md": "The tomatoes ripen late when the nights stay cold in August.",
    "notes/recipes/bread.markdown": "Knead the dough for ten minutes until it springs back under a finger.",
    "site/index.html": "Our lighthouse keeper logs every passing ship in a leather ledger.",
    "docs/install.rst": "The installer verifies each package signature before unpacking it.",
    "journal.txt": "Snow fell on the harbour and the ferries stayed moored all morning.",
    "reports/annual.pdf": "The observatory recorded forty meteor showers during the final quarter.",
    "letters/offer.docx": "The violin workshop ships instruments to customers on three continents.",
}
UNREADABLE = {"reports/broken.pdf", "reports/locked.pdf", "legacy/latin1.txt"}


def make_folder(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)

    def write(relative: str, content: str | bytes) -> Path:
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
        return path

    write("notes/garden.md", "---\ntags: [garden]\n---\n# Garden diary\n\nPlanted **basil** and `mint` in the "
          "raised bed.\n\n```python\nwater(plants, litres=2)\n```\n\n" + LAST_SENTENCES["notes/garden.md"] + "\n")
    write("notes/recipes/bread.markdown", "Sourdough starter needs feeding twice a day.\n\n## Shaping\n\n"
          + LAST_SENTENCES["notes/recipes/bread.markdown"] + "\n")
    write("site/index.html", "<html><head><title>The lighthouse</title><style>p { color: red }</style>"
          "<script>var tracking = 1;</script></head><body><h1>Welcome</h1><p>The lamp turns every ten seconds.</p>"
          f"<p>{LAST_SENTENCES['site/index.html']}</p></body></html>")
    write("docs/install.rst", "Installing the tool\n===================\n\nRun the installer as an administrator.\n\n"
          ".. note::\n\n   Keep a backup first.\n\n" + LAST_SENTENCES["docs/install.rst"] + "\n")
    write("journal.txt", "A quiet week in the village.\nThe baker opened a second shop.\n"
          + LAST_SENTENCES["journal.txt"] + "\n")
    filler = [" ".join(f"Section {page}.{line}: the committee reviewed budgets, staffing, visitor numbers and "
                       f"maintenance of building {line} in detail." for line in range(8)) for page in range(3)]
    write_pdf(write, "reports/annual.pdf", ["The observatory opened its new dome in spring. " + filler[0],
                                            "Funding came from the regional science council. " + filler[1],
                                            filler[2] + " " + LAST_SENTENCES["reports/annual.pdf"]],
              title="Annual report")
    _docx(root / "letters/offer.docx", "An offer of partnership", ["Dear colleagues,",
                                                                  LAST_SENTENCES["letters/offer.docx"]])
    # What a build must skip, and say so
    write("reports/broken.pdf", b"%PDF-1.4\n1 0 obj << /Type /Catalog >>\nthis is not a finished pdf")
    write_pdf(write, "reports/locked.pdf", ["A secret page."], password="hunter2")
    write("legacy/latin1.txt", "Caf\u00e9 cr\u00e8me au comptoir".encode("latin-1"))
    # What a build leaves out without a word: other formats, hidden and ignored files
    write("photos/cat.png", b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    write(".hidden/secret.md", "# Hidden\n\nNot to be read.")
    write(".gitignore", "build/\n*.log\n")
    write("build/output.md", "# Generated\n\nNot to be read.")
    write("debug.log", "not a document")
    os.symlink(root / "notes", root / "notes" / "again")  # a loop: notes/again/again/...
    return root


def write_pdf(write, relative: str, pages: list[str], title: str | None = None,
              password: str | None = None) -> None:
    from fpdf import FPDF

    pdf = FPDF()
    if title:
        pdf.set_title(title)
    if password:
        pdf.set_encryption(owner_password=password, user_password=password)
    pdf.set_font("Helvetica", size=12)
    for text in pages:
        pdf.add_page()
        pdf.multi_cell(0, 10, text)
    write(relative, bytes(pdf.output()))


def _docx(path: Path, title: str, paragraphs: list[str]) -> None:
    import docx

    document = docx.Document()
    document.add_heading(title, level=1)
    for paragraph in paragraphs:
        document.add_paragraph(paragraph)
    path.parent.mkdir(parents=True, exist_ok=True)
    document.save(str(path))
