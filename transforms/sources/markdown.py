"""Markdown document -> `ParsedPage` (markdown-it-py, CommonMark with tables).

* Front matter (a YAML block between `---` lines at the top): `title`,
  `description`, `tags`/`keywords`, each a scalar of bounded length
  (`common.meta_text`: a list or mapping is no title). Read by the one docs YAML
  loader (`common.load_yaml`): front matter it refuses (aliases expanding past
  its cap, an alias bomb; nesting past its depth) makes the document a dead
  letter (`refused_yaml`).
* Title: the front matter's title, else a first-level heading that opens the
  document, else the nav entry's title (`mkdocs.yml`), else the file name. A
  heading used as the title (an opening one equal to the front matter's title,
  too) opens no section: its text is the document's own.
* Headings below the title cut the text into `Section`s; anchors are the ones
  MkDocs gives (Python-Markdown's toc slugs), so section URLs are the published ones.
* Text is the rendered plain text, never markup: paragraphs apart by a blank
  line, list items and table rows a line each (cells " | "), code verbatim,
  inline HTML reduced to its text; comments, `<script>` and `<style>` dropped
  (as the HTML parser drops them).
* Placement: the `mkdocs.yml` nav when one sits in the document's folder or
  above it (inside the input), else the folders (transforms/sources/nav.py).
* Links: the text's links to other documents (a relative path, as the file it
  names is served: `../setup.md#usage`, the fragment a heading's anchor) and to
  the web (`common.document_links`), inline ones and reference ones alike
  (`[text][ref]` with `[ref]: other.md`: markdown-it resolves the definitions).
"""
from __future__ import annotations

import re

import yaml
from markdown_it import MarkdownIt
from markdown_it.token import Token

from ritrag.schema import ParsedPage, Section
from ritrag.transforms.sources.common import (SourceFile, RefusedYaml, UnparseablePage, document_links, document_page,
                                              heading_anchor, html_text, load_yaml, meta_text, section_path,
                                              url_segment_title)
from ritrag.transforms.sources.nav import document_trail

# The deepest markdown-it nests blocks (each list counts two levels, with its
# item, a blockquote one). Past it markdown-it drops the rest of the block
# silently; CommonMark's preset stops at 20, which a list 10 deep reaches. 100
# (markdown-it's default preset) is far past real documents and within the
# interpreter's stack (markdown-it recurses once a level); a document nested
# deeper is a dead letter `too_deep`, as HTML past libxml2's limit is.
MAX_MARKDOWN_NESTING = 100
_MARKDOWN = MarkdownIt("commonmark", {"maxNesting": MAX_MARKDOWN_NESTING}).enable(["table", "strikethrough"])
_FRONT_MATTER = re.compile(r"\A---[ \t]*\r?\n(.*?)\r?\n(?:---|\.\.\.)[ \t]*(?:\r?\n|\Z)", re.DOTALL)


def split_front_matter(text: str) -> tuple[dict, str]:
    """(front matter as a dict, the Markdown after it); a block that is not a
    YAML mapping is left in the text, as MkDocs leaves it; YAML the loader
    refuses raises UnparseablePage("refused_yaml")."""
    match = _FRONT_MATTER.match(text)
    if not match:
        return {}, text
    try:
        meta = load_yaml(match.group(1))
    except RefusedYaml as exc:
        raise UnparseablePage("refused_yaml", f"front matter: {exc.problem}") from exc
    except yaml.YAMLError:
        return {}, text
    return (meta, text[match.end():]) if isinstance(meta, dict) else ({}, text)


# Inline HTML opening or closing an element whose content is code, not text.
_HIDDEN_TAG = re.compile(r"<(/?)(script|style)\b[^>]*>", re.IGNORECASE)


class _InlineText:
    """The plain text of inline tokens, in document order. The content of an
    inline `<script>` or `<style>` is dropped up to its closing tag, across
    paragraphs, as an HTML parser reads it (block-level ones are html blocks,
    which `html_text` strips). `links`, when given, receives the (href, text)
    of each link, in document order."""

    def __init__(self, links: list[tuple[str, str]] | None = None):
        self._hidden: str | None = None  # the script/style element open, if any
        self._links = links

    def __call__(self, token: Token) -> str:
        parts: list[str] = []
        link: tuple[str, int] | None = None  # the open link's href, and where its text starts in parts
        for child in token.children or ():
            if child.type == "html_inline":
                tag = _HIDDEN_TAG.match(child.content)
                closing, name = (tag.group(1), tag.group(2).lower()) if tag else ("", None)
                if name and not closing and not self._hidden:
                    self._hidden = name
                elif name and closing and name == self._hidden:
                    self._hidden = None
            elif self._hidden:
                continue
            elif child.type == "link_open" and self._links is not None:
                link = (str(child.attrGet("href") or ""), len(parts))
            elif child.type == "link_close" and link is not None:
                self._links.append((link[0], "".join(parts[link[1]:])))
                link = None
            elif child.type in ("text", "code_inline"):
                parts.append(child.content)
            elif child.type == "softbreak":
                parts.append(" ")
            elif child.type == "hardbreak":
                parts.append("\n")
            elif child.type == "image":
                parts.append(self(child) or child.attrGet("alt") or "")
        return "".join(parts).strip()


class _Heading:
    def __init__(self, level: int, title: str):
        self.level, self.title = level, title


def rendered_blocks(markdown: str, links: list[tuple[str, str]] | None = None
                    ) -> list[_Heading | tuple[str, bool]]:
    """The document as headings and text blocks, in order; a block is (text,
    tight): tight blocks (list items after the first of a list run) follow the
    one before on the next line instead of after a blank line. `links`, when
    given, receives the (href, text) of each link of the text, in order."""
    out: list[_Heading | tuple[str, bool]] = []
    tokens = _MARKDOWN.parse(markdown)
    # Content is dropped only inside a block opened at the last level (a paragraph there loses nothing,
    # but is refused too: one rule, a level short of the limit).
    if any(t.level >= MAX_MARKDOWN_NESTING - 1 and t.nesting == 1 for t in tokens):
        raise UnparseablePage("too_deep", f"blocks nested {MAX_MARKDOWN_NESTING} levels deep (a list counts two)")
    inline_text = _InlineText(links)
    list_depth, in_list_run = 0, False
    row: list[str] = []
    rows: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        kind = token.type
        if kind == "heading_open":
            out.append(_Heading(int(token.tag[1:]), inline_text(tokens[i + 1])))
            in_list_run = False
            i += 3
            continue
        if kind in ("bullet_list_open", "ordered_list_open"):
            list_depth += 1
        elif kind in ("bullet_list_close", "ordered_list_close"):
            list_depth -= 1
            in_list_run = in_list_run and list_depth > 0
        elif kind == "inline" and tokens[i - 1].type in ("th_open", "td_open"):
            row.append(inline_text(token))
        elif kind == "tr_close":
            rows.append(" | ".join(row))
            row = []
        elif kind == "table_close":
            out.append(("\n".join(rows), False))
            rows = []
        elif kind in ("inline", "fence", "code_block", "html_block"):
            text = (inline_text(token) if kind == "inline" else
                    token.content.rstrip("\n") if kind != "html_block" else html_text(token.content))
            if text:
                out.append((text, in_list_run))
                in_list_run = list_depth > 0
        i += 1
    return out


def parse_markdown(file: SourceFile) -> list[tuple[str | None, ParsedPage]]:
    try:
        text = file.data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UnparseablePage("undecodable", f"Markdown is read as UTF-8: {exc}") from exc
    meta, markdown = split_front_matter(text)
    links: list[tuple[str, str]] = []
    blocks = rendered_blocks(markdown, links)
    title = meta_text(meta.get("title"))
    if not blocks and not title:
        raise UnparseablePage("no_content", "neither text nor a heading")
    trail, method, nav_title, nav_order = document_trail(file)
    if blocks and isinstance(blocks[0], _Heading) and blocks[0].level == 1 and (
            not title or blocks[0].title == title):
        title = title or blocks[0].title
        blocks = blocks[1:]
    title = title or nav_title or url_segment_title(file.url)
    sections: list[tuple[str, int, str, tuple[str, ...], list[str]]] = [(title, 0, "", (), [])]
    anchors: dict[str, int] = {}
    open_titles: list[tuple[int, str]] = []
    for block in blocks:
        if isinstance(block, _Heading):
            path = section_path(open_titles, block.level, block.title)
            sections.append((block.title, block.level, heading_anchor(block.title, anchors), path, []))
            continue
        text, tight = block
        pieces = sections[-1][4]
        if pieces:
            pieces.append("\n" if tight else "\n\n")
        pieces.append(text)
    keywords = meta.get("tags") or meta.get("keywords") or []
    keywords = tuple(k for k in map(meta_text, keywords if isinstance(keywords, list) else [keywords]) if k)
    page = document_page(
        file, title=title, trail=trail, trail_method=method, nav_order=nav_order,
        description=meta_text(meta.get("description")), keywords=keywords, links=document_links(file, links),
        sections=tuple(Section(t, level, anchor, "".join(pieces), path)
                       for t, level, anchor, path, pieces in sections))
    return [(None, page)]
