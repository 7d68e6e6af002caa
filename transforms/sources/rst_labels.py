"""Sphinx labels across a project: what a `:ref:` names in another file.

A label (`.. _log-files:`) is global to its Sphinx project, so a document's
`:ref:` may name a label of any other document of it. The project is the
folder of the nearest `conf.py` at or above the document (Sphinx's source
folder), else the input; a label names a document of the referring one's
site only.

Each reStructuredText file of the project is scanned once per worker (cached by project
folder, as the nav files are: transforms/sources/nav.py): one pass over its
lines, no docutils parse, so the index costs the size of the project's text,
not a parse of every file for every document. A label followed (past blank
lines and the labels chained to it) by a section title names that section: its
anchor is the id docutils gives the title (`nodes.make_id`), the anchor the
document's parser gives the section (transforms/sources/rst.py), and its title
is what an implicit `:ref:` shows (a document's first title what an implicit
`:doc:` shows); a title repeated in its file (docutils then
gives the section another id) or any other labelled element names the label's
own id (`#fig-1`), which no section node has, so the link lands on the page.
A name defined twice keeps its first definition in path order (Sphinx warns of
the duplicate). A document's parser asks only for the labels its `:ref:`s name.

Documents read as they were when the worker first scanned the project: a build
that edits them while it runs may resolve labels by either version; an update
parses only changed documents, so an unchanged document's `:ref:` keeps the
target it had when it was parsed (its page's links are stored, as an HTML
page's rendered href is), though a page whose nodes change is linked again.
"""
from __future__ import annotations

import functools
import posixpath
import re
from typing import NamedTuple

from apache_beam.io.filesystems import FileSystems
from docutils import nodes

from ritrag.transforms.sources.common import SourceFile
from ritrag.transforms.sources.kinds import RST_SUFFIXES
from ritrag.transforms.sources.nav import file_exists

SPHINX_CONFIG = "conf.py"
# The largest file scanned for labels: past it a file is no document a person
# wrote (the parser itself refuses inputs past the job's --max_page_bytes).
MAX_LABEL_FILE_BYTES = 1 << 24
# `.. _name:` alone on its line (a name in backquotes may hold colons); `.. _name: uri` is a hyperlink.
_LABEL = re.compile(r"^\.\. _(`[^`]+`|[^`:][^:]*):[ \t]*$")
# A section adornment: one punctuation character repeated (docutils' set: 7-bit ASCII punctuation).
_ADORNMENT = re.compile(r"^([!-/:-@\[-`{-~])\1+[ \t]*$")


class Label(NamedTuple):
    path: str  # the document that defines it
    anchor: str  # the section's anchor, else the label's own id
    title: str  # the section's title, "" for another element


def label_key(name: str) -> str:
    """A label name as Sphinx compares them: backquotes off, case and blanks normalized."""
    return nodes.fully_normalize_name(name.strip().strip("`"))


def _title_at(lines: list[str], i: int) -> tuple[str, int] | None:
    """(title, line after it) of a section title starting at line i, None if none does."""
    def adornment(j: int) -> str | None:
        return lines[j].rstrip() if j < len(lines) and _ADORNMENT.match(lines[j]) else None

    over = adornment(i)
    start = i + 1 if over else i
    if start >= len(lines) or not lines[start].strip() or lines[start][:1].isspace() and not over:
        return None
    title, under = lines[start].strip(), adornment(start + 1)
    if under is None or (over and over[0] != under[0]) or (not over and len(under) < min(len(title), 4)):
        return None
    return title, start + 2


class Outline(NamedTuple):
    """What other documents name of one: its labels and its title."""

    labels: list[tuple[str, str, str]]  # (label key, anchor, section title or ""), in order
    title: str  # its first section title ("" without one): what an implicit `:doc:` shows


def document_outline(text: str) -> Outline:
    """The labels a reStructuredText document defines and its title (module doc)."""
    lines = text.splitlines()
    out: list[tuple[str, str, str]] = []
    first_title = ""
    pending: list[str] = []  # labels waiting for the element they name
    seen_titles: set[str] = set()
    i = 0
    while i < len(lines):
        line = lines[i]
        label = _LABEL.match(line)
        if label:
            pending.append(label.group(1))
            i += 1
            continue
        if not line.strip():
            i += 1
            continue
        if pending and line[:1].isspace() and i > 0 and _LABEL.match(lines[i - 1]):
            pending.clear()  # `.. _name:` with its URI on the next line: a hyperlink target
        title = _title_at(lines, i)
        anchor = nodes.make_id(title[0]) if title else ""
        named = title[0] if title and anchor and anchor not in seen_titles else ""
        for name in pending:
            out.append((label_key(name), anchor if named else nodes.make_id(name), named))
        pending.clear()
        if title:
            seen_titles.add(anchor)
            first_title = first_title or title[0]
            i = title[1]
        else:
            i += 1
    out.extend((label_key(name), nodes.make_id(name), "") for name in pending)
    return Outline(out, first_title)


class Project(NamedTuple):
    labels: dict[str, Label]  # by label key: the first definition in path order
    titles: dict[str, str]  # document path -> its title


@functools.lru_cache(maxsize=16)
def project_outline(project: str) -> Project:
    """The labels and titles of the reStructuredText files under the folder `project`."""
    labels: dict[str, Label] = {}
    titles: dict[str, str] = {}
    matched = FileSystems.match([project + "**"])[0].metadata_list
    for path in sorted(m.path for m in matched
                       if m.path.lower().endswith(RST_SUFFIXES) and m.size_in_bytes <= MAX_LABEL_FILE_BYTES):
        try:
            with FileSystems.open(path) as fh:
                text = fh.read(MAX_LABEL_FILE_BYTES).decode("utf-8-sig", "replace")
        except OSError:
            continue
        outline = document_outline(text)
        titles[path] = outline.title
        for key, anchor, title in outline.labels:
            labels.setdefault(key, Label(path, anchor, title))
    return Project(labels, titles)


def sphinx_project(file: SourceFile) -> str:
    """The folder (ending in "/") of the nearest `conf.py` at or above the
    document, within the input; else the input."""
    folders = file.path[len(file.root):].split("/")[:-1]
    for depth in range(len(folders), -1, -1):
        folder = file.root + "".join(f"{name}/" for name in folders[:depth])
        if file_exists(folder + SPHINX_CONFIG):
            return folder
    return file.root


def _readable(file: SourceFile) -> bool:
    return bool(file.root) and file.url_of is not None and file.path.startswith(file.root)


def find_label(file: SourceFile, name: str) -> Label | None:
    """The label `name` of the document's project, where it names a document of the document's site."""
    label = project_outline(sphinx_project(file)).labels.get(label_key(name)) if _readable(file) else None
    if label is None:
        return None
    url, site = file.url_of(label.path), file.site.rstrip("/")
    return label if url == site or url.startswith(site + "/") else None


def document_title(file: SourceFile, path: str) -> str:
    """The title of the project's document at `path` ("" when there is none)."""
    return project_outline(sphinx_project(file)).titles.get(path, "") if _readable(file) else ""
