"""reStructuredText document -> `ParsedPage` (docutils' own parser).

* Title: the document title docutils lifts from a lone top-level section, else
  the file name. Sections: docutils' section tree, nested as heading levels,
  anchored by the ids docutils (and so Sphinx) gives them.
* Text is the plain text of the doctree, never markup: paragraphs apart by a
  blank line, list items a line each, literal blocks verbatim; comments,
  targets, substitution definitions and docutils' own messages dropped.
* Sphinx sources use directives and roles plain docutils does not know
  (`note`, `code-block`, `:ref:`, `:py:func:`, ...): each such name the file
  uses is read as a generic one, a directive's content parsed as body text (its
  options ignored), a role's as its text (`Title <target>` -> "Title"), so no
  markup or error message leaks into the text. `include` and `raw` are off:
  a document never reads other files or passes markup through.
* Placement: folders (transforms/sources/nav.py), as Sphinx's own URLs follow
  them; a `toctree` gives the document's `nav_order`, so the documents it lists
  (relative names, in its folder or below) keep the toctree's order under it.
* Links: hyperlinks to other documents (a relative path, as the file it names
  is served) and to the web (`common.document_links`), and Sphinx's
  cross-references, the same link records in document order: `:doc:` names a
  document by its path without suffix, relative to the document's folder or,
  from "/", to its project's (the `conf.py` folder, else the input), linked to
  the page it is served as; `:ref:` names a label (`.. _log-files:`) of any
  document of its project and site (transforms/sources/rst_labels.py), linked
  to the section the label stands before (page URL and the section's anchor,
  which is the section node where sections are nodes), else to the label's
  page; an implicit `:ref:` shows the section's title and an implicit `:doc:`
  the document's, as Sphinx renders them.
  A `:ref:` to a label no document defines is a link to nothing (URL "", the
  label as fragment): counted among the links no node answers
  (`links_unresolved`, `ritrag inspect`'s "links to nothing"), never kept.
"""
from __future__ import annotations

import io
import posixpath
import re
from typing import Any, NamedTuple

from docutils import nodes
from docutils.core import publish_doctree
from docutils.parsers.rst import Directive, directives, roles
from docutils.utils import SystemMessage

from ritrag.schema import ParsedPage, Section
from ritrag.transforms.sources.common import (SourceFile, UnparseablePage, document_links, document_page, link_target,
                                              section_path, url_segment_title)
from ritrag.transforms.sources.nav import document_trail
from ritrag.transforms.sources.rst_labels import document_title, find_label, label_key, sphinx_project

RST_SUFFIX = ".rst"
_SETTINGS = {"report_level": 5, "halt_level": 5, "file_insertion_enabled": False, "raw_enabled": False,
             "warning_stream": io.StringIO(), "input_encoding": "unicode", "doctitle_xform": True,
             "sectsubtitle_xform": False, "syntax_highlight": "none"}
_DIRECTIVE_NAME = re.compile(r"^\s*\.\.\s+([\w:+.-]+)::", re.MULTILINE)
_ROLE_NAME = re.compile(r":([\w:+.-]+):`")
_DROPPED = (nodes.comment, nodes.target, nodes.substitution_definition, nodes.system_message, nodes.title,
            nodes.subtitle, nodes.problematic, nodes.raw)
_LISTS = (nodes.bullet_list, nodes.enumerated_list, nodes.definition_list, nodes.field_list, nodes.option_list)
TOCTREE = "toctree"
LITERAL_DIRECTIVES = ("code-block", "sourcecode")  # Sphinx's code directives: content verbatim


class _AnyOption(dict):
    """An option_spec taking any option (a Sphinx directive's options are not ours to check)."""

    def __missing__(self, name: str):
        return directives.unchanged


class _ContentDirective(Directive):
    """A directive plain docutils does not know: its content, parsed as body text."""

    optional_arguments = 100
    final_argument_whitespace = True
    has_content = True
    option_spec = _AnyOption()

    def run(self) -> list[nodes.Node]:
        if self.name == TOCTREE:
            self.state.document.setdefault("toctree", []).extend(line.strip() for line in self.content)
            return []
        if self.name in LITERAL_DIRECTIVES:
            return [nodes.literal_block(text="\n".join(self.content))]
        # Arguments are what an object description documents (`py:function:: read(name)`).
        container = nodes.container()
        if self.arguments:
            container += nodes.paragraph(text=" ".join(self.arguments))
        self.state.nested_parse(self.content, self.content_offset, container)
        return container.children


def _role_text(name, rawtext, text, lineno, inliner, options=None, content=None):
    """A role plain docutils does not know: its text (`Title <target>` -> Title)."""
    shown = text[:text.rindex("<")].strip() if text.endswith(">") and "<" in text else text
    return [nodes.Text(shown.lstrip("~!"))], []


class CrossReference(NamedTuple):
    """A Sphinx cross-reference role (`:ref:`, `:doc:`) as read: what it names."""

    role: str  # "ref" or "doc"
    target: str  # the label or document name
    explicit_title: bool  # `Title <target>`: its text is its own


# Sphinx's cross-reference roles that name another place of the project (the std domain's, bare or prefixed).
CROSS_REFERENCE_ROLES = ("ref", "doc", "std:ref", "std:doc")


def _cross_reference_role(name, rawtext, text, lineno, inliner, options=None, content=None):
    """A `:ref:` or `:doc:`: a reference node holding the CrossReference, its text shown as `_role_text` shows it."""
    explicit = text.endswith(">") and "<" in text
    target = text[text.rindex("<") + 1:-1].strip() if explicit else text.strip()
    shown = _role_text(name, rawtext, text, lineno, inliner)[0][0].astext()
    xref = CrossReference(name.rpartition(":")[2], target, explicit)
    return [nodes.reference(rawtext, shown, cross_reference=xref)], []


for _name in CROSS_REFERENCE_ROLES:
    roles.register_local_role(_name, _cross_reference_role)


def cross_reference_target(file: SourceFile, xref: CrossReference) -> tuple[tuple[str, str] | None, str]:
    """((URL, fragment) the cross-reference names, or None for none in the input;
    the title an implicit one shows, "" for its own text): module doc."""
    if xref.role == "doc":
        name = xref.target
        folder = sphinx_project(file) if name.startswith("/") else posixpath.dirname(file.path) + "/"
        path = posixpath.normpath(folder + name.lstrip("/") + RST_SUFFIX)
        if not name.strip("/") or file.url_of is None or not file.root or not path.startswith(file.root):
            return None, ""
        return (file.url_of(path), ""), "" if xref.explicit_title else document_title(file, path)
    label = find_label(file, xref.target)
    if label is None:
        return ("", label_key(xref.target)), ""
    return (file.url_of(label.path), label.anchor), "" if xref.explicit_title else label.title


class _Resolved(NamedTuple):
    """A link whose target is already known (a cross-reference's)."""

    target: tuple[str, str] | None


def _link_target(file: SourceFile, href: Any) -> tuple[str, str] | None:
    return href.target if isinstance(href, _Resolved) else link_target(file, href)


def _document_links(document: nodes.document, file: SourceFile) -> list[tuple[Any, str]]:
    """(href or resolved cross-reference target, text) of the document's links,
    in document order; an implicit cross-reference's text becomes the title of
    what it names in the doctree, so the page's text reads as Sphinx renders it."""
    links = []
    for ref in document.findall(nodes.reference):
        if "refuri" in ref:  # hyperlinks with a target URI; references inside the document have none
            links.append((ref["refuri"], ref.astext()))
        elif "cross_reference" in ref:
            target, title = cross_reference_target(file, ref["cross_reference"])
            if title:
                ref.children = []
                ref += nodes.Text(title)
            links.append((_Resolved(target), ref.astext()))
    return links


def _register_unknown(source: str) -> None:
    """Read every directive and role name `source` uses that docutils does not know as a generic one."""
    known_directives = set(directives._directive_registry) | set(directives._directives)
    for name in set(_DIRECTIVE_NAME.findall(source)) - known_directives:
        directives.register_directive(name, _ContentDirective)
    known_roles = set(roles._role_registry) | set(roles._roles)
    for name in set(_ROLE_NAME.findall(source)) - known_roles:
        roles.register_local_role(name, _role_text)


def _block_text(node: nodes.Element) -> str:
    if isinstance(node, (nodes.literal_block, nodes.doctest_block, nodes.line_block)):
        return node.astext()
    if isinstance(node, _LISTS):
        return "\n".join(" ".join(item.astext().split()) for item in node.children
                         if not isinstance(item, _DROPPED))
    return " ".join(node.astext().split())


def _own_text(node: nodes.Element) -> str:
    """The text of an element's children that are neither sections nor dropped."""
    return "\n\n".join(text for child in node.children
                       if not isinstance(child, (nodes.section, *_DROPPED)) and (text := _block_text(child)))


def _toctree_order(file: SourceFile, entries: list[str]) -> tuple[str, ...]:
    """The URLs of the documents a toctree lists by relative name (`Title <name>` or `name`)."""
    if file.url_of is None:
        return ()
    folder, out = posixpath.dirname(file.path), []
    for entry in entries:
        name = entry[entry.rindex("<") + 1:-1] if entry.endswith(">") and "<" in entry else entry
        if not name or name.startswith((":", "/")) or name == "self" or "://" in name or "*" in name:
            continue
        out.append(file.url_of(posixpath.normpath(posixpath.join(folder, name + RST_SUFFIX))))
    return tuple(out)


def parse_rst(file: SourceFile) -> list[tuple[str | None, ParsedPage]]:
    try:
        source = file.data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UnparseablePage("undecodable", f"reStructuredText is read as UTF-8: {exc}") from exc
    _register_unknown(source)
    try:
        document = publish_doctree(source, source_path=file.path, settings_overrides=dict(_SETTINGS))
    except (SystemMessage, ValueError, AttributeError, IndexError, TypeError) as exc:  # docutils' bugs on odd input
        raise UnparseablePage("invalid_rst", f"{type(exc).__name__}: {exc}") from exc
    links = _document_links(document, file)
    title = document.get("title") or ""
    sections = [(title, 0, "", (), _own_text(document))]
    open_titles: list[tuple[int, str]] = []

    stack = [(iter(document.children), 1)]  # the section tree, depth first, without recursion
    while stack:
        children, level = stack[-1]
        child = next(children, None)
        if child is None:
            stack.pop()
        elif isinstance(child, nodes.section):
            heading = child.next_node(nodes.title)
            name = heading.astext() if heading is not None else ""
            # The id made of the title, as Sphinx anchors it, before a label's.
            own_id = nodes.make_id(name)
            anchor = own_id if own_id in child["ids"] else (child["ids"][0] if child["ids"] else "")
            sections.append((name, level, anchor, section_path(open_titles, level, name), _own_text(child)))
            stack.append((iter(child.children), level + 1))
    if not title and len(sections) == 1 and not sections[0][4]:
        raise UnparseablePage("no_content", "neither text nor a section")
    trail, method, _, _ = document_trail(file)
    title = title or url_segment_title(file.url)
    page = document_page(file, title=title, trail=trail, trail_method=method,
                         nav_order=_toctree_order(file, document.get("toctree", [])),
                         links=document_links(file, links, target_of=_link_target),
                         sections=tuple(Section(t if level else title, level, anchor, text, path)
                                        for t, level, anchor, path, text in sections))
    return [(None, page)]
