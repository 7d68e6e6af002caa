"""A paper's JSON -> one document `ParsedPage`, its sections as heading sections.

Shapes read (one paper per file):
* S2ORC: `title`, `abstract` (a string or a list of `{text}`), `body_text`: a
  list of paragraphs `{section, sec_num, text}`; consecutive paragraphs of one
  section make one section, titled "<sec_num> <section>".
* QASPER: `title`, `abstract`, `full_text`: a list of `{section_name,
  paragraphs}`; a name "A ::: B" is section B nested in A.
* Plain: `title`, `abstract`, `sections`: a list of `{heading (or title),
  paragraphs (a list) or text, level}`.
A section whose shape gives it no level (S2ORC always, QASPER without `:::`,
Plain without `level`) is nested by the number its title starts with, as
numbered headings are read: "2 Method", "2.1 Data" put 2.1 under 2 ("3.2" is
level 2), whether the number came as `sec_num` or in the section's name (S2ORC
often leaves `sec_num` empty and writes "2.1 Data" as the section).
The abstract is the document's own text (before the first section); the
authors (`authors`: names or `{first, last}`) its description. Placement: the
folders (transforms/sources/nav.py).
"""
from __future__ import annotations

import re

from ritrag.schema import ParsedPage, Section
from ritrag.transforms.sources.common import (SourceFile, UnparseablePage, document_page, heading_anchor, meta_text,
                                              section_path, url_segment_title)
from ritrag.transforms.sources.discourse import load_json_object
from ritrag.transforms.sources.nav import document_trail


def _text(value) -> str:
    """A string, or the texts of a list of strings / {text} objects, a paragraph
    each (one level: deeper lists are no paragraphs)."""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, list):
        texts = (v.get("text") if isinstance(v, dict) else v for v in value)
        return "\n\n".join(t.strip() for t in texts if isinstance(t, str) and t.strip())
    return ""


def _author(author) -> str:
    if isinstance(author, dict):
        return " ".join(str(author.get(k) or "") for k in ("first", "last")).strip() or str(author.get("name") or "")
    return str(author)


# A section number opening a title: "2", "2.1", "3.2.1." or an appendix's "A.1",
# then a space or nothing. A lone letter ("A Study of ...") is no number.
_SECTION_NUMBER = re.compile(r"(\d+|[A-Z](?=\.\d))((?:\.\d+)*)\.?(?:\s|$)")


def numbered_level(title: str) -> int:
    """The level the number opening `title` gives it ("2.1 Data": 2), 1 for none."""
    number = _SECTION_NUMBER.match(title)
    return 1 + number[2].count(".") if number else 1


def paper_sections(paper: dict) -> list[tuple[str, int, str]]:
    """(title, level, text) of every section, in order (module doc: the three shapes)."""
    out: list[tuple[str, int, str]] = []
    if isinstance(paper.get("body_text"), list):
        for paragraph in paper["body_text"]:
            if not isinstance(paragraph, dict):
                continue
            number, name = meta_text(paragraph.get("sec_num")).strip(), meta_text(paragraph.get("section")).strip()
            title = f"{number} {name}".strip() or "Body"
            text = _text(paragraph.get("text"))
            if out and out[-1][0] == title:
                out[-1] = (title, out[-1][1], "\n\n".join(t for t in (out[-1][2], text) if t))
            else:
                out.append((title, numbered_level(title), text))
    elif isinstance(paper.get("full_text"), list):
        for section in paper["full_text"]:
            if isinstance(section, dict):
                names = [n.strip() for n in str(section.get("section_name") or "Body").split(":::")]
                name = meta_text(names[-1]) or "Body"
                out.append((name, len(names) if len(names) > 1 else numbered_level(name),
                            _text(section.get("paragraphs"))))
    elif isinstance(paper.get("sections"), list):
        for section in paper["sections"]:
            if isinstance(section, dict):
                level = section.get("level")
                name = meta_text(section.get("heading") or section.get("title")).strip() or "Body"
                out.append((name, level if isinstance(level, int) and level > 0 else numbered_level(name),
                            _text(section.get("paragraphs") or section.get("text"))))
    return out


def parse_paper(file: SourceFile) -> list[tuple[str | None, ParsedPage]]:
    paper = load_json_object(file.data, "a paper")
    title = " ".join(meta_text(paper.get("title")).split()) or url_segment_title(file.url)
    abstract = _text(paper.get("abstract"))
    found = paper_sections(paper)
    if not abstract and not any(text for _, _, text in found):
        raise UnparseablePage("no_content", "a paper without an abstract or section text")
    anchors: dict[str, int] = {}
    open_titles: list[tuple[int, str]] = []
    sections = [Section(title, 0, "", abstract, ())]
    sections += [Section(name, level, heading_anchor(name, anchors), text, section_path(open_titles, level, name))
                 for name, level, text in found]
    authors = paper.get("authors")
    description = ", ".join(a for a in map(_author, authors) if a) if isinstance(authors, list) else ""
    trail, method, _, _ = document_trail(file)
    return [(None, document_page(file, title=title, trail=trail, trail_method=method, description=description,
                                 sections=tuple(sections)))]
