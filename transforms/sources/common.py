"""What every non-HTML source shares: the file it reads (`SourceFile`), heading
anchors, the links of its text (`document_links`: what a relative path names),
the assembly of a `ParsedPage` (finished as the HTML parser finishes its pages:
sections capped, and the content hash that lets updates find unchanged
documents alike), and
the one YAML loader of docs metadata (front matter, `mkdocs.yml`, category files)
with the one rule for the texts taken from it (`meta_text`)."""
from __future__ import annotations

import dataclasses
import posixpath
import re
from typing import Any, Callable, Iterable
from urllib.parse import unquote

import lxml.html
import yaml
from lxml import etree

from ritrag.schema import MAX_ANCHOR_CHARS, MAX_PAGE_LINKS, MAX_TREE_DEPTH, Crumb, Link, ParsedPage, Section
# What a kind's parser takes from the HTML parser, in one place: the error that
# dead-letters an input, the title a URL gives, the finishing of a page.
from ritrag.transforms.parse import UnparseablePage
from ritrag.transforms.parse.location import url_segment_title
from ritrag.transforms.parse.page import finished_page
from ritrag.urls import is_web_url, normalize_url


@dataclasses.dataclass(frozen=True)
class SourceFile:
    """One input file and where it sits: `url` (normalized) and `site` as the job
    locates it; `root` the input directory; `url_of` the URL the job gives any
    other input path (a nav file names documents by path)."""

    path: str
    data: bytes
    url: str
    site: str
    root: str = ""
    url_of: Callable[[str], str] | None = None


# The most nodes a YAML document may stand for once its aliases are expanded. A
# real nav or front matter is a few thousand nodes; 9 aliases to 9 aliases ...
# 8 levels deep (a "billion laughs" of 391 bytes) stand for 43 million, and an
# alias inside its own anchor (`&x [*x]`) for infinitely many.
MAX_YAML_NODES = 100_000
# The deepest a YAML document may nest (PyYAML composes nodes recursively: a
# deeper document would exhaust the stack). Real metadata nests a few levels.
MAX_YAML_DEPTH = 100
# The longest title, tag or description taken from YAML metadata (longer values are cut).
MAX_META_CHARS = 1000


class RefusedYaml(yaml.composer.ComposerError):
    """A YAML document nested deeper than MAX_YAML_DEPTH, or whose aliases expand
    past MAX_YAML_NODES nodes (or into themselves)."""


class DocsYamlLoader(yaml.SafeLoader):
    """safe_load for docs metadata: the tags MkDocs themes use (`!!python/name:...`,
    `!ENV`) read as null; a document nested deeper than MAX_YAML_DEPTH, or whose
    aliases expand past MAX_YAML_NODES (or into themselves), refused
    (`RefusedYaml`) before anything is built from it, so its cost stays that of
    its text. Aliases within the cap are read as PyYAML reads them."""

    _depth = 0

    def compose_node(self, parent, index):
        if self._depth >= MAX_YAML_DEPTH:
            raise RefusedYaml(None, None, f"it nests deeper than {MAX_YAML_DEPTH} levels", self.peek_event().start_mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self):
        node = super().compose_document()
        _refuse_alias_bombs(node)
        return node


DocsYamlLoader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)
DocsYamlLoader.add_multi_constructor("!", lambda loader, suffix, node: None)


def _refuse_alias_bombs(root: yaml.Node | None) -> None:
    """Count the nodes of `root` as the tree its aliases expand to, stopping at the cap."""
    seen, stack = 0, [root] if root is not None else []
    while stack:
        node = stack.pop()
        seen += 1
        if seen > MAX_YAML_NODES:
            raise RefusedYaml(
                None, None, f"its aliases expand past {MAX_YAML_NODES} nodes (or into themselves)", node.start_mark)
        if isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            stack.extend(part for pair in node.value for part in pair)


def load_yaml(text: str | bytes):
    """A YAML document read with DocsYamlLoader; raises yaml.YAMLError."""
    return yaml.load(text, Loader=DocsYamlLoader)  # noqa: S506 (a SafeLoader subclass)


def meta_text(value) -> str:
    """A title, tag or description from metadata (YAML front matter and navs,
    JSON fields): a scalar as text, at most MAX_META_CHARS long; "" for an empty
    value and anything else (a list or mapping is no title)."""
    if not value or isinstance(value, (list, dict, set, tuple)):
        return ""
    return str(value)[:MAX_META_CHARS]


_NOT_SLUG = re.compile(r"[^\w\s-]")
_SPACES = re.compile(r"[-\s]+")


def heading_anchor(title: str, taken: dict[str, int]) -> str:
    """The anchor static-site generators give a heading (Python-Markdown's toc:
    lowercase, punctuation dropped, spaces to hyphens, repeats suffixed _1, _2).
    `taken`: the page's anchors so far, each with the last suffix tried for it, so
    that a title repeated n times costs n tries in all, not n squared."""
    slug = _SPACES.sub("-", _NOT_SLUG.sub("", title).strip().lower()) or "section"
    n = taken.get(slug, 0)  # every suffix below it is taken already
    anchor = f"{slug}_{n}" if n else slug
    while anchor in taken:
        n += 1
        anchor = f"{slug}_{n}"
    taken[anchor] = 0
    taken[slug] = n
    return anchor


def link_target(file: SourceFile, href: str) -> tuple[str, str] | None:
    """(normalized URL, fragment) a link of a document names: an http(s) URL as
    written, a relative path as the input file it names is served
    (`guide/setup.md#usage` -> `.../guide/setup.html`, "usage"). None for a
    fragment alone, a path outside the input or from the root, or anything but
    the web."""
    path, _, fragment = href.strip().partition("#")
    local = path.partition("?")[0]
    if is_web_url(path):
        url = normalize_url(path)
    elif not local or local.startswith("/") or ":" in local.split("/", 1)[0] or file.url_of is None:
        url = None  # from the root, protocol-relative, another scheme, or a document not served
    else:
        target = posixpath.normpath(posixpath.join(posixpath.dirname(file.path), unquote(local)))
        url = file.url_of(target) if target.startswith(file.root) else None
    return None if url is None else (url, unquote(fragment))


def document_links(file: SourceFile, links: Iterable[tuple[Any, str]], url: str | None = None,
                   target_of: Callable[[SourceFile, Any], tuple[str, str] | None] = link_target
                   ) -> tuple[tuple[Link, ...], int]:
    """A document's (href, text) links as ParsedPage.links and links_past_cap,
    as the HTML parser keeps them (transforms/parse/links.py): each target once,
    at its first link, text collapsed and cut, at most MAX_PAGE_LINKS, none to
    the page itself; `url` for a record other than the file itself;
    `target_of` the (URL, fragment) a link names (a format's cross-references
    name more than an href: transforms/sources/rst.py)."""
    kept: dict[tuple[str, str], Link] = {}
    links = iter(links)
    for href, text in links:
        if len(kept) == MAX_PAGE_LINKS:
            return tuple(kept.values()), 1 + sum(1 for _ in links)
        target = target_of(file, href)
        if target is not None and target[0] != (url or file.url) and target not in kept:
            kept[target] = Link(*target, " ".join(text.split())[:MAX_ANCHOR_CHARS], len(kept))
    return tuple(kept.values()), 0


def document_page(file: SourceFile, *, url: str | None = None, title: str, trail: tuple[Crumb, ...],
                  trail_method: str, sections: tuple[Section, ...], description: str = "",
                  keywords: tuple[str, ...] = (), nav_order: tuple[str, ...] = (),
                  links: tuple[tuple[Link, ...], int] = ((), 0)) -> ParsedPage:
    """A document's ParsedPage, finished as an HTML page is (`finished_page`:
    sections capped, content-hashed); `url` for a record other than the file
    itself; `links` as `document_links` gives them."""
    page = ParsedPage(url=url or file.url, canonical_url=url or file.url, site=file.site, title=title,
                      trail=trail, trail_method=trail_method, sections=sections, description=description,
                      keywords=keywords, nav_order=nav_order, links=links[0], links_past_cap=links[1])
    return finished_page(page)


def with_sections(page: ParsedPage, sections: tuple[Section, ...]) -> ParsedPage:
    """A document's page cut into other sections, finished again as `document_page` finishes it."""
    return finished_page(dataclasses.replace(page, sections=sections))


def section_path(open_titles: list[tuple[int, str]], level: int, title: str) -> tuple[str, ...]:
    """The heading path of a section at `level`, updating `open_titles` (the
    enclosing (level, title) pairs, outermost first) in place. A section nested
    deeper than a tree is placed (MAX_TREE_DEPTH) keeps the outermost titles and
    its own, so a path costs at most that much whatever the nesting."""
    while open_titles and open_titles[-1][0] >= level:
        open_titles.pop()
    open_titles.append((level, title))
    kept = open_titles if len(open_titles) <= MAX_TREE_DEPTH else [*open_titles[:MAX_TREE_DEPTH - 1], open_titles[-1]]
    return tuple(t for _, t in kept)


def html_text(html: str) -> str:
    """Rendered HTML as plain text: one paragraph per top-level block."""
    if not html.strip():
        return ""
    try:
        fragment = lxml.html.fragment_fromstring(html, create_parent="div")
    except (etree.ParserError, ValueError):
        return ""
    etree.strip_elements(fragment, etree.Comment, "script", "style", with_tail=False)
    blocks = [fragment.text or "", *(f"{child.text_content()}{child.tail or ''}" for child in fragment)]
    return "\n\n".join(" ".join(b.split()) for b in blocks if b.split())
