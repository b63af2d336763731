"""A person's files as documents: each file's text as a reader sees it (no markup; code blocks kept as text), its
title, and for paged formats where each page starts.

A reader is picked by the file's suffix (`reader_for`). Each wraps a well-kept parser: markdown-it-py (Markdown,
CommonMark) and Beautiful Soup (HTML, and Markdown's rendering), installed with the package; docutils
(reStructuredText), pypdf (PDF) and python-docx (Word), with the `files` extra (`pip install 'retriever[files]'`). A
missing one is one line naming the format and the package. Plain text needs nothing. A file a reader cannot read
(damaged, encrypted, not UTF-8) raises `UnreadableFile` with one line saying why; the folder reader
(`retriever.files.folder`) skips it and says so.

Another format is one more `Reader`: a name, its suffixes and `read(data) -> FileText` (the file's bytes, read once).
"""

from __future__ import annotations

import importlib
import io
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from retriever.errors import RetrieverError

EXTRA = "files"
_LINE_BREAKS = re.compile(r"\r\n|[\r\x0b\x0c]")
_BLANK_RUNS = re.compile(r"\n(?:[ \t]*\n)+")  # blank lines; the next line's indentation stays
_LEADING_BLANK_LINES = re.compile(r"^(?:[^\S\n]*\n)+")
_TRAILING = re.compile(r"[ \t]+\n")
# C0 but tab and the line breaks (LF, CR; VT and FF end a line too), and DEL
_CONTROLS = re.compile(r"[\x00-\x08\x0e-\x1f\x7f]")
# A terminal's escape sequences (ECMA-48: colours, cursor moves, a window title), whole: taking out only their ESC
# left "[31m" in the text of a saved terminal log. A window title's is taken only with its terminator, within a
# line: one cut short takes its ESC ] alone, not the rest of the file up to some later BEL.
_ESCAPES = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b\n]{0,512}(?:\x07|\x1b\\)|[ -/]*[0-~])")


class UnreadableFile(Exception):
    """A file its reader cannot read; the message says why, in a few words."""


class NoText(UnreadableFile):
    """A file read whole that holds no text: not a failure to read it (a sync deletes what it held)."""


@dataclass(frozen=True)
class FileText:
    """What a reader found: TEXT, a TITLE where the file names one, and PAGE_STARTS (paged formats): the character
    offset in TEXT where each page starts, the first 0."""

    text: str
    title: str | None = None
    page_starts: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Reader:
    """NAME (the metadata's `type`), the SUFFIXES it reads (lower case, with the dot) and READ(the file's bytes)."""

    name: str
    suffixes: tuple[str, ...]
    read: Callable[[bytes], FileText]


# The parsers the `files` extra installs; the others come with the package.
EXTRA_PACKAGES = ("docutils", "pypdf", "python-docx")


def _library(module: str, package: str, what: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        install = f"'retriever[{EXTRA}]'" if package in EXTRA_PACKAGES else package
        raise RetrieverError(f"reading {what} needs {package}: pip install {install}") from None


def tidy(text: str) -> str:
    """TEXT with terminal escape sequences and control characters gone (a terminal would act on them), trailing
    spaces gone and blank runs one blank line, stripped (the first line's indentation kept: code may start a
    text)."""
    text = _CONTROLS.sub("", _LINE_BREAKS.sub("\n", _ESCAPES.sub("", text)))
    return _LEADING_BLANK_LINES.sub("", _BLANK_RUNS.sub("\n\n", _TRAILING.sub("\n", text))).rstrip()


def decoded(data: bytes) -> str:
    """DATA as text: UTF-8 (a byte-order mark dropped), or UTF-16 where a byte-order mark says so; else
    `UnreadableFile` naming the first byte that is not UTF-8."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        try:
            return data.decode("utf-16")
        except UnicodeDecodeError as error:
            raise UnreadableFile(f"not UTF-16 text after its byte-order mark (byte {error.start:,})") from None
    if b"\x00" in data:
        raise UnreadableFile("binary content (a NUL byte)")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise UnreadableFile(f"not UTF-8 text: byte 0x{data[error.start]:02x} at offset {error.start:,} (an "
                             "unknown encoding; save it as UTF-8)") from None


def read_text(data: bytes) -> FileText:
    return FileText(tidy(decoded(data)))


# YAML front matter between --- lines (Jekyll, Hugo, Obsidian), or TOML between +++ lines (Hugo).
_FRONT_MATTER = re.compile(r"\A(---|\+\+\+)[ \t]*\n(.*?\n)\1[ \t]*\n", re.S)


def _front_title(fence: str, block: str) -> str | None:
    """The title front matter gives (FENCE --- : YAML, +++ : TOML): its top-level `title`, where that is text, read
    by the format's own parser (a pattern took `'It''s here' # comment` as written, `>` for a folded title, and a
    `title` inside TOML's [params]); None where it gives none or does not parse (the first heading then titles)."""
    try:
        if fence == "---":
            import yaml  # PyYAML

            data = yaml.safe_load(block)
        else:
            import tomllib

            data = tomllib.loads(block)
    except Exception:  # noqa: BLE001 - front matter that does not parse names no title
        return None
    title = data.get("title") if isinstance(data, dict) else None
    return " ".join(title.split()) if isinstance(title, str) and title.strip() else None


def read_markdown(data: bytes) -> FileText:
    markdown_it = _library("markdown_it", "markdown-it-py", "Markdown")
    # Line ends as one: front matter written on Windows (CR LF) was read as text, its closing --- a heading rule
    source = _LINE_BREAKS.sub("\n", decoded(data))
    title = None
    front = _FRONT_MATTER.match(source)
    if front:  # not text a reader sees; its title is the file's
        title = _front_title(front.group(1), front.group(2))
        source = source[front.end():]
    # CommonMark, with GitHub's tables (a table's rows laid out as rows, not as one paragraph of pipes)
    parser = markdown_it.MarkdownIt("commonmark").enable("table")
    tokens = parser.parse(source)
    if title is None:
        title = next((_inline_text(tokens[i + 1]) for i, token in enumerate(tokens[:-1])
                      if token.type == "heading_open"), None)
    # A paragraph's source line breaks are spaces, as rendered Markdown shows them: a hard-wrapped note's
    # sentences read whole.
    return FileText(html_text(parser.renderer.render(tokens, parser.options, {}), "Markdown")[0], title or None)


def _inline_text(token) -> str:
    """A Markdown inline token's text as shown: no emphasis marks, code spans' code, inline HTML (a <br>) a space."""
    shown = "".join(child.content if child.type in ("text", "code_inline") else
                    " " if child.type in ("softbreak", "hardbreak", "html_inline") else ""
                    for child in token.children or ())
    return _WHITE_SPACE.sub(" ", shown).strip()


def html_text(html: str, what: str = "HTML") -> tuple[str, str | None]:
    """The text a browser shows of HTML (scripts, styles and the head left out; block elements on lines of their
    own, preformatted text as it is) and its title (<title>, else the first heading). WHAT: the format read, for
    the line saying a parser is missing."""
    bs4 = _library("bs4", "beautifulsoup4", what)
    soup = bs4.BeautifulSoup(html, "html.parser")
    title_tag = soup.find("title")
    title = title_tag.get_text(" ", strip=True) if title_tag else None
    if not title:
        heading = soup.find(["h1", "h2", "h3", "h4", "h5", "h6"])
        title = heading.get_text(" ", strip=True) if heading else None
    for hidden in soup(["script", "style", "noscript", "template", "head"]):
        hidden.decompose()
    for image in soup.find_all("img"):  # an image is its words where it has some (a sentence may name it)
        image.replace_with(image.get("alt") or "")
    return _shown_text(soup, bs4), title or None


# Elements a browser lays out as blocks of their own: a line break before and after each. Everything else (a link,
# inline code, emphasis) flows inside its line.
_BLOCKS = ("address", "article", "aside", "blockquote", "caption", "center", "dd", "details", "dialog", "div", "dl",
           "dt", "fieldset", "figcaption", "figure", "footer", "form", "h1", "h2", "h3", "h4", "h5", "h6", "header",
           "hgroup", "hr", "legend", "li", "main", "menu", "nav", "ol", "optgroup", "option", "p", "pre", "section",
           "summary", "table", "tr", "ul")
# Marks in the text being laid out (control characters, which a browser shows none of, are taken out of the text
# first: `_CONTROLS`): a block's edge, a <br>, the edges of preformatted text.
_BLOCK_EDGE, _LINE_BREAK, _PRE = "\x00", "\x02", "\x01"
_BLOCK_EDGES = re.compile(r"[ \t]*\x00[\x00 \t]*")
_AFTER_BREAK = re.compile(r"[ \t]*\x02[ \t]*\n?[ \t]*")  # a <br> and the source's line break after it: one
_SPACE_RUNS = re.compile(r"[^\S\n]{2,}")
_WHITE_SPACE = re.compile(r"\s+")


def _shown_text(soup, bs4) -> str:
    """SOUP's text laid out as a browser lays out its blocks: each on lines of its own (a blank line between two
    where the source had space between them), inline elements (a link, inline code) inside their line, runs of
    white space (the source's line breaks too) one space, preformatted text as it is."""
    for string in soup.find_all(string=True):  # what a browser shows none of, and the marks below would misread
        if _CONTROLS.search(string):
            string.replace_with(_CONTROLS.sub("", string))
    for tag in soup.find_all("br"):
        tag.replace_with("\n" if tag.find_parent("pre") else _LINE_BREAK)
    for tag in soup.find_all(_BLOCKS):
        if tag.find_parent("pre"):  # a highlighter's line: its text as it is, a line break after it
            tag.insert_after("\n")
        else:
            tag.insert_before(_BLOCK_EDGE)
            tag.insert_after(_BLOCK_EDGE)
    for tag in soup.find_all(["td", "th"]):
        tag.insert_after(" ")  # a row's cells side by side
    parts = []
    for string in soup.find_all(string=True):
        if isinstance(string, (bs4.Comment, bs4.Declaration, bs4.Doctype, bs4.ProcessingInstruction)):
            continue
        text = str(string)
        parts.append(_PRE + text + _PRE if string.find_parent("pre") else _WHITE_SPACE.sub(" ", text))
    # Between the marks of preformatted text (odd pieces) nothing changes; the flow between them is laid out.
    pieces = "".join(parts).split(_PRE)
    for number in range(0, len(pieces), 2):
        flow = _AFTER_BREAK.sub("\n", _SPACE_RUNS.sub(" ", pieces[number]))
        flow = _BLOCK_EDGES.sub(lambda found: "\n\n" if found.group().count(_BLOCK_EDGE) > 1 else "\n", flow)
        pieces[number] = re.sub(r"\n[ \t]+", "\n", flow)
    pieces[0] = pieces[0].lstrip(" \t")
    return tidy("".join(pieces))


# Labels HTML reads as windows-1252 (the Encoding Standard, which every browser follows): a page that says latin-1
# or ASCII and holds a curly quote or a euro sign (0x80-0x9f) means windows-1252's characters there.
_WINDOWS_1252 = frozenset({"ascii", "us-ascii", "iso-8859-1", "iso8859-1", "iso_8859-1", "latin1", "latin-1", "l1",
                           "cp819", "ibm819", "iso-ir-100", "csisolatin1", "windows-1252", "cp1252", "x-cp1252"})


def html_decoded(data: bytes) -> str:
    """HTML's bytes as text: as `decoded` reads any file (UTF-8, or UTF-16 by its byte-order mark), else in the
    encoding the page declares in its first 1,024 bytes (`<meta charset>`, or the `http-equiv` Content-Type), as a
    browser reads it. UTF-8 comes first: a page declaring a legacy encoding whose bytes are valid UTF-8 was saved
    as UTF-8 since (a legacy text of any length is almost never valid UTF-8)."""
    try:
        return decoded(data)
    except UnreadableFile as not_utf8:
        from bs4.dammit import EncodingDetector  # Beautiful Soup is installed with the package

        label = EncodingDetector.find_declared_encoding(data[:1024], is_html=True)
        if not label or label.lower().replace("_", "-") in ("utf-8", "utf8", "utf-16", "utf-16le", "utf-16be"):
            raise not_utf8
        label = label.lower()
        try:
            return data.decode("cp1252" if label in _WINDOWS_1252 else label)
        except LookupError:
            raise UnreadableFile(f"not UTF-8 text, and the encoding it declares is one Python does not know: "
                                 f"{label!r} (save it as UTF-8)") from None
        except UnicodeDecodeError as error:
            raise UnreadableFile(f"not {label} text as it declares: byte 0x{data[error.start]:02x} at offset "
                                 f"{error.start:,}") from None


def read_html(data: bytes) -> FileText:
    text, title = html_text(html_decoded(data))
    return FileText(text, title)


def read_rst(data: bytes) -> FileText:
    core = _library("docutils.core", "docutils", "reStructuredText")
    nodes = _library("docutils.nodes", "docutils", "reStructuredText")
    # No file inclusion or raw passthrough: a document reads only itself. Problems in the markup are not errors:
    # what docutils parses is kept as text.
    settings = {"report_level": 5, "halt_level": 5, "file_insertion_enabled": False, "raw_enabled": False,
                "warning_stream": False, "input_encoding": "unicode"}
    try:
        tree = core.publish_doctree(decoded(data), settings_overrides=settings)
    except UnreadableFile:
        raise
    except Exception as error:  # noqa: BLE001 - docutils raises its own kinds for markup it gives up on
        raise UnreadableFile(f"reStructuredText docutils cannot parse ({type(error).__name__})") from None
    # Not the document's text: docutils' own messages (an unknown directive's, Sphinx's `toctree` and `:ref:` in
    # most real files, with the directive's source), comments, substitution definitions (their text stands where
    # they are used), the table of contents a `contents` directive repeats, and raw passthrough.
    left_out = [node for node in tree.findall(lambda node: isinstance(node, (
        nodes.system_message, nodes.comment, nodes.substitution_definition, nodes.raw)) or (
        isinstance(node, nodes.topic) and "contents" in node.get("classes", [])))]
    for node in left_out:
        if node.parent is not None:
            node.parent.remove(node)
    title = tree.get("title") or next((node.astext() for node in tree.findall(nodes.title)), None)
    return FileText(tidy(tree.astext()), title or None)


def read_pdf(data: bytes) -> FileText:
    pypdf = _library("pypdf", "pypdf", "PDF")
    # pypdf logs what it repairs in a damaged file; the folder reader says in one line what it skipped instead.
    logging.getLogger("pypdf").setLevel(logging.CRITICAL)
    try:
        pdf = pypdf.PdfReader(io.BytesIO(data))
        if pdf.is_encrypted and not pdf.decrypt(""):
            raise UnreadableFile("an encrypted PDF (it needs a password)")
        # Pages with text joined by a blank line; a page without (a blank cover) starts where the next text does: a
        # text opening on separators lost them to the document's own trimming, and every page number was one low.
        pages, starts, at = [], [], 0
        for page in pdf.pages:
            text = tidy(page.extract_text() or "")
            if text and pages:
                at += 2
            starts.append(at)
            if text:
                pages.append(text)
                at += len(text)
        title = (pdf.metadata.title if pdf.metadata else None) or None
    except UnreadableFile:
        raise
    except Exception as error:  # noqa: BLE001 - pypdf's errors for damaged files are of many kinds
        raise UnreadableFile(f"a damaged PDF ({type(error).__name__}: {str(error).splitlines()[0][:80] if str(error) else ''})"
                             ) from None
    text = "\n\n".join(pages)
    if not text.strip():
        raise NoText("a PDF with no text (scanned pages need OCR first)")
    return FileText(text, title.strip() if isinstance(title, str) and title.strip() else None, tuple(starts))


def read_docx(data: bytes) -> FileText:
    docx = _library("docx", "python-docx", "Word files")
    try:
        document = docx.Document(io.BytesIO(data))
        title = (document.core_properties.title or "").strip() or None
        # The body's blocks in their order, read from the XML: python-docx's paragraphs and tables lists put every
        # table after every paragraph, repeat a merged cell once per column it spans, and leave out content
        # controls and nested tables. Then the headers and footers (each once) and the footnotes.
        lines = _word_blocks(document.element.body)
        seen = set()
        for section in document.sections:
            for part in (section.header, section.footer):
                if not part.is_linked_to_previous and id(part.part) not in seen:
                    seen.add(id(part.part))
                    lines += _word_blocks(part._element)
        footnotes = next((related.target_part for related in document.part.rels.values()
                          if related.reltype.endswith("/footnotes") and not related.is_external), None)
        if footnotes is not None:
            from lxml import etree  # python-docx's own XML library

            lines += _word_blocks(etree.fromstring(footnotes.blob))
    except Exception as error:  # noqa: BLE001 - a damaged or not-Word file: zip, XML or package errors
        raise UnreadableFile(f"a damaged Word file ({type(error).__name__})") from None
    if title is None:
        title = next((text for style, text in lines if style.startswith(("Title", "Heading")) and text), None)
    return FileText(tidy("\n".join(text for _, text in lines)), title)


_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"


def _word_blocks(element) -> list[tuple[str, str]]:
    """(style id, text) of each paragraph and table row under a Word XML ELEMENT, in order: a row's cells joined
    by tabs (a cell's own paragraphs and nested tables by spaces); content controls read as their content; deleted
    text (w:delText) left out, inserted text kept."""
    found = []
    for child in element:
        if child.tag == f"{_W}p":
            style = child.find(f"{_W}pPr/{_W}pStyle")
            text = "".join(node.text or "" if node.tag == f"{_W}t" else " "  # a tab or a line break: a space
                           for node in child.iter(f"{_W}t", f"{_W}tab", f"{_W}br", f"{_W}cr"))
            found.append(("" if style is None else style.get(f"{_W}val", ""), text.strip()))
        elif child.tag == f"{_W}tbl":
            for row in child.findall(f"{_W}tr"):  # its own rows: a nested table's are read within their cell
                cells = [" ".join(text for _, text in _word_blocks(cell) if text) for cell in row.findall(f"{_W}tc")]
                found.append(("", "\t".join(cells)))
        elif child.tag in (f"{_W}sdt", f"{_W}sdtContent", f"{_W}ins", f"{_W}customXml", f"{_W}smartTag",
                           f"{_W}footnote", f"{_W}endnote", f"{_W}hdr", f"{_W}ftr"):
            found += _word_blocks(child)
    return found


READERS: tuple[Reader, ...] = (
    Reader("markdown", (".md", ".markdown"), read_markdown),
    Reader("html", (".html", ".htm"), read_html),
    Reader("rst", (".rst",), read_rst),
    Reader("text", (".txt", ".text"), read_text),
    Reader("pdf", (".pdf",), read_pdf),
    Reader("docx", (".docx",), read_docx),
)
_BY_SUFFIX = {suffix: reader for reader in READERS for suffix in reader.suffixes}


def reader_for(path: Path) -> Reader | None:
    """The reader of PATH's suffix, or None for a format no reader reads."""
    return _BY_SUFFIX.get(path.suffix.lower())
