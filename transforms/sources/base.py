"""The contract of an input kind (`SourceKind`): how an input is known to be of
it, the URL its file is served at, whether a file holds several pages, and the
parser that reads it. A kind is declared, not coded into the sniffer: the
registry (`kinds.KINDS`) is what the sniffer, the URL rule, dispatch, the
extras check and the boundary test iterate. This module and the registry import
nothing but the standard library, so that sniffing (the crawler's too) never
loads a parser or its package: a kind's parser module is imported on first use.
"""
from __future__ import annotations

import dataclasses
import posixpath
from typing import Callable


def _served_as_is(relative: str) -> str | None:
    return None


@dataclasses.dataclass(frozen=True)
class SourceKind:
    """One input kind. The sniffer asks every kind of the registry, in its order,
    first `opens_with` (content), then `content_types` (what a web response
    declares), then `suffixes` (the file name's suffix): the first kind that
    claims the input reads it."""

    name: str  # what ParsedPage.source_kind and the nodes' source_kind say
    label: str  # what the help of every job reading input calls it (`described_kinds`)
    # "module:function" of the parser, imported on first use: function(SourceFile) ->
    # [(record key or None for the file itself, ParsedPage)]. "" for HTML, which
    # transforms/parse reads from the page's bytes and URL (transforms/pages.py).
    parser: str = ""
    # (opening: the first KiB after a byte-order mark and blanks, data: the whole
    # input) -> whether the content is of this kind; pure and bounded (a prefix read).
    opens_with: Callable[[bytes, bytes], bool] | None = None
    content_types: tuple[str, ...] = ()  # declared media types, lower case
    suffixes: tuple[str, ...] = ()  # file name suffixes, lower case, with the dot
    # The path a file is served at, relative like its input path, or None when
    # this kind leaves it as it is (the rule is by name, as a web server's is).
    url_path: Callable[[str], str | None] = _served_as_is
    multi_page: bool = False  # one file, several pages (a thread): sources `<file>#post-N`
    web: bool = False  # a web response (a fetched body, a WARC record) may be read as this kind
    packages: tuple[str, ...] = ()  # the PyPI requirements its parser imports (setup.py's SOURCES extra)

    def claims_name(self, path: str) -> bool:
        """Whether the file name's suffix is one of this kind's."""
        return posixpath.splitext(path.lower())[1] in self.suffixes


def served_as_html(suffixes: tuple[str, ...]) -> Callable[[str], str | None]:
    """The URL rule of a document a static-site generator renders: `guide/setup.md`
    -> `guide/setup.html`; `index.*` and `README.*` -> `index.html`, the folder's URL."""
    def url_path(relative: str) -> str | None:
        # the suffix test first, without splitting: an update asks it of every input file's path
        if not relative.lower().endswith(suffixes):
            return None
        folder, name = posixpath.split(relative)
        stem, suffix = posixpath.splitext(name)
        if suffix.lower() not in suffixes:  # `.md` alone is a hidden file, no suffix (splitext)
            return None
        return posixpath.join(folder, "index.html" if stem.lower() in ("index", "readme") else stem + ".html")
    return url_path


def served_without(suffix: str) -> Callable[[str], str | None]:
    """The URL rule of a file served without its suffix (`t/welcome.json` -> `t/welcome`)."""
    def url_path(relative: str) -> str | None:
        if not relative.lower().endswith(suffix):  # as served_as_html's, before splitting
            return None
        folder, name = posixpath.split(relative)
        stem, found = posixpath.splitext(name)
        return posixpath.join(folder, stem) if found.lower() == suffix else None
    return url_path
