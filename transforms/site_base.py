"""The public base URL of each site of a mirrored corpus, from what its pages say
about themselves.

A page read from a folder gets the URL ``base_url + its path in the input``.
Without ``--base_url`` that is a made-up ``http://localhost/...``, and a mirror's
absolute links (JSON-LD breadcrumbs, canonical links) point at the host it was
copied from: outside the site, so its trails resolve to nothing. Pages often
name their own URL (`ritrag.transforms.parse.declared_page_urls`); where such a URL
ends with the page's path inside its site, what comes before that path is the
site's public base, and the build gives every page of the site
``public base + path inside the site``, as ``--base_url`` would have.

A site is given a base only when every page that names one agreeing with its
path names the same one, and no other site infers that base too; a site whose
pages name several, or none, or whose base another site infers as well (two
folders mirrored from one place: their pages would share URLs and be merged
into one another), keeps its input URLs, and the manifest says which
(``site_bases``, status ``conflict`` with the sites it shares the base with).
"""
from __future__ import annotations

import posixpath
from collections import Counter, defaultdict
from typing import Iterable, NamedTuple
from urllib.parse import unquote, urlsplit

import apache_beam as beam
from apache_beam.io import fileio

from ritrag.transforms.parse import declared_page_urls
from ritrag.transforms.parse.declared import HEAD_WINDOW
from ritrag.urls import is_web_url, normalize_url, origin_of, path_segments, site_of

INFERRED, SEVERAL, NONE, CONFLICT = "inferred", "several", "none", "conflict"
_PAGE_SUFFIXES = (".html", ".htm", ".xhtml", ".shtml", ".php", ".asp", ".aspx")
_MAX_LISTED_CANDIDATES = 5


def _segments(url: str) -> list[str]:
    return [unquote(s) for s in path_segments(url)]


def _same_name(local: str, declared: str) -> bool:
    """A file name and the name a page gives itself: equal, or the same without
    the suffix that servers of "pretty" URLs leave off."""
    if local == declared:
        return True
    stem, suffix = posixpath.splitext(local)
    return suffix.lower() in _PAGE_SUFFIXES and stem == declared


def base_candidate(page_url: str, site: str, declared_url: str) -> str | None:
    """The public base of `site` that `declared_url` implies for the page at
    `page_url` (a URL inside `site`), or None when the declared URL does not end
    with the page's path inside the site (a canonical link to another page, to a
    home page, or relative to nothing)."""
    if not is_web_url(declared_url):
        return None
    page_url = normalize_url(page_url)
    site_segments, page_segments = _segments(site), _segments(page_url)
    if origin_of(page_url) != origin_of(site) or page_segments[:len(site_segments)] != site_segments:
        return None
    inside = page_segments[len(site_segments):]
    named = _segments(declared_url)
    if len(named) < len(inside) or urlsplit(page_url).query != urlsplit(declared_url).query:
        return None
    tail = named[len(named) - len(inside):]
    if inside and (tail[:-1] != inside[:-1] or not _same_name(inside[-1], tail[-1])):
        return None
    return normalize_url(origin_of(declared_url) + "/" + "/".join(named[:len(named) - len(inside)]))


class SiteBase(NamedTuple):
    """What the build decided for one site (as the input URLs name it)."""

    status: str  # INFERRED, SEVERAL, NONE or CONFLICT
    base: str | None  # the public base when INFERRED
    pages: int  # pages that named a base agreeing with their path
    candidates: dict[str, int]  # the bases named, by pages naming each (the most named first)
    shared_with: tuple[str, ...] = ()  # CONFLICT: the other sites that inferred the same base

    def to_dict(self) -> dict:
        return self._asdict()


def choose_base(named: Counter) -> SiteBase:
    """The site's base from the bases its pages named (a page naming several
    counts for each)."""
    ranked = sorted(named.items(), key=lambda kv: (-kv[1], kv[0]))
    listed = dict(ranked[:_MAX_LISTED_CANDIDATES])
    if not ranked:
        return SiteBase(NONE, None, 0, {})
    if len(ranked) > 1:
        return SiteBase(SEVERAL, None, sum(named.values()), listed)
    return SiteBase(INFERRED, ranked[0][0], ranked[0][1], listed)


def refuse_shared_bases(decided: dict[str, SiteBase]) -> dict[str, SiteBase]:
    """Every site's decision, with a base that several sites inferred refused to
    each of them (CONFLICT): their pages would take one set of URLs, and inputs
    at one URL are merged into one page, so one site's pages would displace the
    other's. Each keeps its input URLs instead, a site of its own."""
    claimed: dict[str, list[str]] = defaultdict(list)
    for site, d in decided.items():
        if d.status == INFERRED:
            claimed[d.base].append(site)
    out = dict(decided)
    for sites in claimed.values():
        for site in sites if len(sites) > 1 else ():
            out[site] = decided[site]._replace(status=CONFLICT, base=None,
                                               shared_with=tuple(sorted(set(sites) - {site})))
    return out


def page_bases(page_url: str, site: str, declared: Iterable[str]) -> set[str]:
    """The bases of `site` that one page's declared URLs imply."""
    return {b for b in (base_candidate(page_url, site, url) for url in declared) if b}


def public_url(url: str, site: str, base: str) -> str:
    """`url` (inside `site`, as the input names it) under the site's public `base`."""
    site_prefix = site.rstrip("/")
    rest = url[len(site_prefix):] if url.startswith(site_prefix) else url
    return base.rstrip("/") + "/" + rest.lstrip("/")


class _NamedBasesFn(beam.DoFn):
    """An HTML file -> (its site, the bases its head implies); pages naming none
    give (site, empty), so that every site of the input is decided. Files the
    parse dead-letters unread give nothing."""

    def __init__(self, parser, suffixes: tuple[str, ...]):
        self._parser = parser  # pipelines.build.PageParser: the same URLs as the parse
        self._suffixes = suffixes

    def process(self, readable: fileio.ReadableFile):
        path = readable.metadata.path
        # Files the parse refuses (not HTML, outside the input, not regular) are not opened here either.
        if not path.lower().endswith(self._suffixes) or self._parser.refusal(path) is not None:
            return
        url = self._parser.input_url(path)
        site = site_of(url, self._parser.site_depth)
        try:
            # Its head alone: a file of any size costs this pass what it reads.
            with readable.open() as fh:
                head = fh.read(min(HEAD_WINDOW, self._parser.max_page_bytes + 1))
            declared = declared_page_urls(head, self._parser.max_page_bytes)
        except OSError:
            declared = ()  # the parse dead-letters what cannot be read
        yield site, Counter(page_bases(url, site, declared))


class InferSiteBases(beam.PTransform):
    """Files matching `pattern` -> one dict {site as the input names it:
    SiteBase.to_dict()}, from the files whose names end with `suffixes`; no two
    sites are given one base (`refuse_shared_bases`)."""

    def __init__(self, pattern: str, parser, suffixes: tuple[str, ...]):
        super().__init__()
        self._pattern = pattern
        self._parser = parser
        self._suffixes = suffixes

    def expand(self, pbegin):
        return (
            pbegin
            | "MatchFiles" >> fileio.MatchFiles(self._pattern)
            | "ReadMatches" >> fileio.ReadMatches()
            | "NamedBases" >> beam.ParDo(_NamedBasesFn(self._parser, self._suffixes))
            | "CountBySite" >> beam.CombinePerKey(lambda counters: sum(counters, Counter()))
            | "Choose" >> beam.MapTuple(lambda site, named: (site, choose_base(named)))
            | "AsDict" >> beam.combiners.ToDict()
            | "RefuseShared" >> beam.Map(lambda decided: {site: d.to_dict()
                                                          for site, d in refuse_shared_bases(decided).items()})
        )
