"""The one definition of every record that crosses a module boundary.

In-pipeline records are frozen dataclasses (small, picklable by Beam's coders);
the Arrow schemas below are the on-disk Parquet schemas of the index. Node and
chunk rows are typed records made from their schemas (`NodeRow`, `ChunkRow`:
NamedTuples; ritrag/transforms/records.py gives them Beam's RowCoder); the
other tables' rows are plain dicts whose columns their schemas fix. Rows read
back in part are typed records of the columns read (`ChunkRef`, `NodeSkeleton`,
...), made from the schemas too.
"""
from __future__ import annotations

import collections
import json
import re
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Optional, Sequence


import pyarrow as pa


@dataclass(frozen=True)
class Crumb:
    """One entry of a breadcrumb trail; `url` is normalized, or None for a label
    without a link."""

    title: str
    url: str | None


@dataclass(frozen=True)
class Section:
    """Text under one heading that belongs to no sub-heading.

    The first section of a page (level 0, empty anchor) holds the text before the
    first heading. `path` is the chain of heading titles from the page down to
    this section (excluded the page title), so that a section is addressable.
    """

    title: str
    level: int
    anchor: str
    text: str
    path: tuple[str, ...] = ()


@dataclass(frozen=True)
class Link:
    """A link of a page's own text (never its navigation chrome) to another page.

    `url` is the target's normalized URL (the key of its page node); `fragment`
    the place in it the link names (percent-decoded, "" for none), which is a
    section node's anchor where the target has that section; `position` the
    link's ordinal among the kept links of its page.
    """

    url: str
    fragment: str
    anchor_text: str  # whitespace collapsed, at most MAX_ANCHOR_CHARS
    position: int


# The most links kept of one page (the rest are counted, in ParsedPage.links_past_cap),
# and the longest anchor text kept of one link: a link list or an anchor past these
# is generated, not written, and its cost must stay bounded.
MAX_PAGE_LINKS = 1000
MAX_ANCHOR_CHARS = 200
TOC_INDUCED_COUNTER_PREFIX = "toc_induced_"  # + ParsedPage.toc_induced: documents whose ToC was induced, by how


@dataclass(frozen=True)
class ParsedPage:
    """Everything the index keeps of one HTML page; the raw HTML is dropped."""

    url: str  # normalized location: the key of the page node
    canonical_url: str  # normalized <link rel=canonical>, else == url
    site: str  # key of the forest root this page belongs to
    title: str
    trail: tuple[Crumb, ...]  # root first; neither the site root nor the page itself
    trail_method: str  # which rule placed the page: "jsonld", "microdata", ..., "url"
    sections: tuple[Section, ...]
    description: str = ""
    keywords: tuple[str, ...] = ()
    language: str = ""
    content_hash: str = ""
    nav_order: tuple[str, ...] = field(default=())  # child URLs in the page's own nav order
    source: str = ""  # the input file, set by the job that read it
    raw_hash: str = ""  # hash of the input bytes: unchanged pages are found without parsing
    # The input file's size and modification time as listed before it was read
    # (transforms/pages.py `file_stamp`), on the page of a file of one page; ""
    # where none is trusted: an update keeps a file whose stamp is unchanged
    # without reading it.
    source_stamp: str = ""
    # Trail rules whose markup the page has but that named nothing in the site (only
    # the page, the root, or places outside the site), in cascade order: build counters.
    trail_passed_over: tuple[str, ...] = ()
    source_kind: str = ""  # the parser that read it (SOURCE_KINDS), set by the job that read it
    # Its text's links to other pages, first occurrence of each target, in document
    # order: at most MAX_PAGE_LINKS; links_past_cap counts the link elements after them.
    links: tuple[Link, ...] = ()
    links_past_cap: int = 0
    # Link elements left out as navigation: menus, breadcrumbs, footers, pagers,
    # tables of contents (a build counter: what a site-wide menu would have cost).
    links_navigation: int = 0
    # Sections past MAX_PAGE_SECTIONS (transforms/parse/sections.py), merged into
    # their parents: a build counter.
    sections_past_cap: int = 0
    # How a document without a table of contents of its own got its sections
    # ("layout": headings induced from a PDF's fonts; "pages": one per page), ""
    # when it had one: a build counter (TOC_INDUCED_COUNTER_PREFIX + how).
    toc_induced: str = ""

    @property
    def body(self) -> str:
        return "\n\n".join(s.text for s in self.sections if s.text)


def page_json(page: ParsedPage) -> bytes:
    """A parsed page as JSON (ASCII: lone surrogates survive), for a job's own
    spill files; `page_from_json` gives back an equal ParsedPage."""
    return json.dumps(vars(page), default=vars).encode("ascii")


def page_from_json(data: bytes) -> ParsedPage:
    fields = json.loads(data)
    return ParsedPage(**{
        **fields,
        "trail": tuple(Crumb(**c) for c in fields["trail"]),
        "sections": tuple(Section(**{**s, "path": tuple(s["path"])}) for s in fields["sections"]),
        "links": tuple(Link(**link) for link in fields["links"]),
        **{name: tuple(fields[name]) for name in ("keywords", "nav_order", "trail_passed_over")},
    })


@dataclass(frozen=True)
class PageSkeleton:
    """What the per-site forest step needs of a page: no body, so a whole site's
    skeleton fits in one worker even at millions of pages."""

    url: str
    canonical_url: str
    site: str
    title: str
    trail: tuple[Crumb, ...]
    trail_method: str
    nav_order: tuple[str, ...] = ()
    source_kind: str = ""
    source: str = ""  # ParsedPage.source: of inputs at one URL, the forest places the one the node rows read

    @classmethod
    def of(cls, page: ParsedPage) -> "PageSkeleton":
        return cls(page.url, page.canonical_url, page.site, page.title, page.trail,
                   page.trail_method, page.nav_order, page.source_kind, page.source)

    @classmethod
    def from_row(cls, row: "StoredSkeleton") -> "PageSkeleton":
        """The skeleton a live pages row stores."""
        return cls(row.url, row.canonical_url, row.site, row.title,
                   tuple(Crumb(c["title"], c["url"]) for c in row.trail), row.trail_method,
                   tuple(row.nav_order), row.source_kind, row.source)


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _escaped_surrogate(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"


def has_lone_surrogate(text: str) -> bool:
    """Whether `text` holds a lone surrogate: a byte of a file name that is not
    UTF-8, as Python gives it (surrogateescape), which UTF-8 text cannot hold."""
    return not text.isascii() and _LONE_SURROGATE.search(text) is not None


def table_text(text: str) -> str:
    """A file name, or text that names one (a page's source, a dead letter's
    detail), as a table's string holds it. Python gives each byte of a name that
    is not UTF-8 as a lone surrogate (surrogateescape, U+DC80-U+DCFF), which no
    Parquet string can hold: such text is stored with each such byte written
    `\\xNN` and each backslash doubled, so that `codecs.escape_decode` gives
    the name's bytes back. Text without a lone surrogate is stored as it is."""
    if not has_lone_surrogate(text):
        return text
    return _LONE_SURROGATE.sub(_escaped_surrogate, text.replace("\\", "\\\\"))


def page_row(page: ParsedPage) -> dict:
    """The PAGES_SCHEMA row of a parsed page."""
    return {
        "url": page.url, "source": table_text(page.source), "raw_hash": page.raw_hash,
        "source_stamp": page.source_stamp,
        "content_hash": page.content_hash, "canonical_url": page.canonical_url, "site": page.site,
        "title": page.title, "trail": [{"title": c.title, "url": c.url} for c in page.trail],
        "trail_method": page.trail_method, "nav_order": list(page.nav_order), "source_kind": page.source_kind,
        "links": [{"url": link.url, "fragment": link.fragment, "anchor_text": link.anchor_text}
                  for link in page.links],
        "links_navigation": page.links_navigation,
    }


def row_links(row: "PageLinks") -> tuple[Link, ...]:
    """The links a live pages row stores (its list position is each link's)."""
    return tuple(Link(link["url"], link["fragment"], link["anchor_text"], position)
                 for position, link in enumerate(row.links))


@dataclass(frozen=True)
class PageSource:
    """Where a parsed page came from: what the build shuffles instead of its text,
    to read and parse the page again once it is placed."""

    url: str
    source: str
    raw_hash: str
    content_hash: str
    source_stamp: str = ""  # ParsedPage.source_stamp: what the first read listed, kept by a second parse

    @classmethod
    def of(cls, page: ParsedPage) -> "PageSource":
        return cls(page.url, page.source, page.raw_hash, page.content_hash, page.source_stamp)


@dataclass(frozen=True)
class NodePlacement:
    """Where the forest put one node; joined with the page's text into a node row."""

    node_id: str
    parent_id: str | None
    site: str
    kind: str  # one of NODE_KINDS
    position: int
    depth: int
    title: str
    url: str | None
    ancestor_ids: tuple[str, ...]
    ancestor_titles: tuple[str, ...]
    trail_method: str
    source_kind: str = ""  # a page's and its sections': their page's; a site or virtual node's: see SOURCE_KINDS


@dataclass(frozen=True)
class DeadLetter:
    """An input that produced no node, and why; every input is accounted for."""

    source: str
    stage: str
    reason: str
    detail: str = ""


NODE_KINDS = ("site", "page", "virtual", "section")
# The deepest a node is placed (the site root has depth 0). A deeper chain (a
# reply to a reply to ..., sections nested without end) is attached at this
# depth and counted, so that a node's ancestor lists stay bounded (memory linear
# in the input) and every face (JSON over HTTP and MCP, the outline, the CLI)
# can answer every tree a build produces. Real documentation trees are a few
# levels deep; 64 is far past them and far below JSON parsers' nesting limits.
MAX_TREE_DEPTH = 64
# source_kind: the parser that read a page, one of SOURCE_KINDS, the names of the
# registry of input kinds (transforms/sources/kinds.py, which the sniffer decides
# by). A page node and its sections carry their page's; a site or virtual node
# carries the kind of every page below it when they all share one, else "" (none
# below, or several kinds: a folder of Markdown next to a PDF).

NODES_SCHEMA = pa.schema(
    [
        pa.field("node_id", pa.string(), nullable=False),
        pa.field("parent_id", pa.string()),
        # The page whose text this node holds (itself for a page, its page for a
        # section, null for virtual and site nodes): updates work page by page.
        pa.field("page_id", pa.string()),
        pa.field("site", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("position", pa.int32(), nullable=False),
        pa.field("depth", pa.int32(), nullable=False),
        pa.field("title", pa.string(), nullable=False),
        pa.field("url", pa.string()),
        pa.field("ancestor_ids", pa.list_(pa.string()), nullable=False),
        pa.field("ancestor_titles", pa.list_(pa.string()), nullable=False),
        pa.field("body", pa.string(), nullable=False),
        # What the index shows and matches of a node: the model's summary and
        # keywords when metadata_key is set (transforms/metadata/), else its
        # source's own (source_summary, source_keywords: a page's meta
        # description and declared tags, kept either way).
        pa.field("summary", pa.string(), nullable=False),
        pa.field("keywords", pa.list_(pa.string()), nullable=False),
        pa.field("source_summary", pa.string(), nullable=False),
        pa.field("source_keywords", pa.list_(pa.string()), nullable=False),
        pa.field("metadata_key", pa.string(), nullable=False),  # the metadata cache's key, "" when none
        pa.field("content_hash", pa.string(), nullable=False),
        pa.field("trail_method", pa.string(), nullable=False),
        pa.field("source_kind", pa.string(), nullable=False),  # SOURCE_KINDS, or "" (see there)
    ]
)

CHUNKS_SCHEMA = pa.schema(
    [
        pa.field("chunk_id", pa.int64(), nullable=False),
        pa.field("node_id", pa.string(), nullable=False),
        pa.field("page_id", pa.string(), nullable=False),
        pa.field("ordinal", pa.int32(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("text_hash", pa.string(), nullable=False),  # key of the embedding cache
        pa.field("n_tokens", pa.int32(), nullable=False),
    ]
)


def _python_type(arrow_field: pa.Field) -> Any:
    """The Python type of a record field holding `arrow_field`'s values."""
    arrow_type = arrow_field.type
    if pa.types.is_string(arrow_type):
        python_type = str
    elif pa.types.is_integer(arrow_type):
        python_type = int
    elif pa.types.is_list(arrow_type) and pa.types.is_string(arrow_type.value_type):
        python_type = Sequence[str]
    elif (pa.types.is_list(arrow_type) and pa.types.is_struct(arrow_type.value_type)
          and all(pa.types.is_string(member.type) for member in arrow_type.value_type)):
        # A list of structs of strings (a page's trail, its links): Arrow gives
        # each struct as a dict, which Beam encodes as a map.
        python_type = Sequence[Mapping[str, Optional[str]]]
    else:
        raise TypeError(f"no record field type for {arrow_field}")
    return Optional[python_type] if arrow_field.nullable else python_type


def table_record(name: str, schema: pa.Schema, columns: Sequence[str] | None = None,
                 extra: Sequence[tuple[str, type]] = (), defaults: Mapping[str, Any] | None = None) -> type:
    """A NamedTuple of `schema`'s columns (or of those `columns` name, in that
    order), then the `extra` fields (in-pipeline data that is no column: a
    table sink writes the schema's columns only; `defaults` gives the last of
    them a value when none is given). Made from the schema so that the columns
    are defined once, by the on-disk format. A NamedTuple rather than a
    dataclass: Beam infers its schema, so it encodes one field by field
    (RowCoder) and checks the element types declared on transforms against it
    when a pipeline is built. Made as typing.NamedTuple makes one (a
    namedtuple and its fields' types): one made by a call takes no defaults."""
    chosen = [schema.field(column) for column in columns] if columns is not None else list(schema)
    annotations = {f.name: _python_type(f) for f in chosen} | dict(extra)
    names = list(annotations)
    trailing = [defaults[field_name] for field_name in names[len(names) - len(defaults):]] if defaults else []
    # Pickled by reference: ritrag.schema.<name>.
    record = collections.namedtuple(name, names, defaults=trailing, module=__name__)
    record.__annotations__ = annotations
    return record


# A NODES_SCHEMA row: what the forest, the metadata stage and the update emit per
# node, and what the chunker and the nodes table read. List columns hold lists.
NodeRow = table_record("NodeRow", NODES_SCHEMA)
# A CHUNKS_SCHEMA row, and `embedded_text`: what the model embeds of it (the
# representation's rendering of the chunk, ritrag/representation.py; "" for an
# anchor document, never embedded, and for a row read back: compaction embeds
# nothing). It is no column: the stored text and its hash are, and the embed
# stages read it here rather than render the chunk again.
ChunkRow = table_record("ChunkRow", CHUNKS_SCHEMA, extra=[("embedded_text", str)], defaults={"embedded_text": ""})

CRUMB_TYPE = pa.struct([pa.field("title", pa.string()), pa.field("url", pa.string())])
# A page's Link, its position being its place in the list.
LINK_TYPE = pa.struct([pa.field("url", pa.string(), nullable=False), pa.field("fragment", pa.string(), nullable=False),
                       pa.field("anchor_text", pa.string(), nullable=False)])

# One row per parsed input page: what an incremental update needs to diff the next
# input by URL and raw hash, to re-place unchanged pages without parsing them, and
# to resolve their links again when the pages they name appear, change or go.
PAGES_SCHEMA = pa.schema(
    [
        pa.field("url", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("raw_hash", pa.string(), nullable=False),
        pa.field("content_hash", pa.string(), nullable=False),
        pa.field("canonical_url", pa.string(), nullable=False),
        pa.field("site", pa.string(), nullable=False),
        pa.field("title", pa.string(), nullable=False),
        pa.field("trail", pa.list_(CRUMB_TYPE), nullable=False),
        pa.field("trail_method", pa.string(), nullable=False),
        pa.field("nav_order", pa.list_(pa.string()), nullable=False),
        pa.field("source_kind", pa.string(), nullable=False),
        pa.field("links", pa.list_(LINK_TYPE), nullable=False),  # ParsedPage.links, in position order
        pa.field("links_navigation", pa.int32(), nullable=False),  # ParsedPage.links_navigation
        pa.field("source_stamp", pa.string(), nullable=False),  # ParsedPage.source_stamp
    ]
)

# One row per link of an indexed page that names a node of the index (ParsedPage.links
# resolved: the section node its fragment names where the index has one, else the
# page node); links to nothing in the index are counted, not kept. A source page's
# rows are one unit: an update that changes any of them tombstones the source
# (TOMBSTONES_SCHEMA.source_node_id) and writes all of them again. Several rows of
# one (source, target) pair are one edge to a reader, at the first position.
EDGES_SCHEMA = pa.schema(
    [
        pa.field("source_node_id", pa.string(), nullable=False),  # the linking page's node
        pa.field("position", pa.int32(), nullable=False),  # Link.position: (source, position) is the row's key
        pa.field("target_node_id", pa.string(), nullable=False),  # a page or section node
        pa.field("anchor_text", pa.string(), nullable=False),  # "" for a link without text
    ]
)


@dataclass(frozen=True)
class TableSpec:
    """One table of a segment, as every job writes it and every reader reads it
    (docs/ARCHITECTURE.md, "On-disk format"): `kind` names its files
    (KIND-SSSSS-of-NNNNN.parquet); rows are sharded by `id_column` (the id that
    tombstones name; ritrag.ids.shard_of) and sorted on `sort_keys` within a
    shard; `added` holds the columns it gained after its format began, with the
    value rows of older files read as (an index built before them can still be
    updated, compacted and inspected, its old rows saying "unknown").
    `record` is the typed record its rows are written from (`table_record`),
    None for a table written from dicts."""

    kind: str
    schema: pa.Schema
    id_column: str
    sort_keys: tuple[str, ...]
    added: dict = field(default_factory=dict)
    record: type | None = None


EDGES_KIND = "edges"  # the resolved links of the segment's pages
# The segment's tables, by kind: the one definition of each.
TABLES = {spec.kind: spec for spec in (
    TableSpec("pages", PAGES_SCHEMA, "url", ("url",), {"source_kind": "", "links": [], "links_navigation": 0,
                                                       "source_stamp": ""}),
    TableSpec("nodes", NODES_SCHEMA, "node_id", ("node_id",),
              {"source_kind": "", "source_summary": "", "source_keywords": [], "metadata_key": ""}, NodeRow),
    TableSpec("chunks", CHUNKS_SCHEMA, "chunk_id", ("chunk_id",), record=ChunkRow),
    # An edges row is live unless its source was tombstoned.
    TableSpec(EDGES_KIND, EDGES_SCHEMA, "source_node_id", ("source_node_id", "position")),
)}

# Live rows read back in part, by the update's stages (ritrag.reader.LiveFile.rows
# reads a record's columns, and fills its FILE_FIELD, where it has one, with
# the table file the row was read from: what a tombstone and a point read need).
FILE_FIELD = "file"
# A live chunk without its text, and its file: what the update tombstones
# (transforms/delta.py, link_delta.py), and what a new chunk of the same text
# hash finds a stored vector by.
ChunkRef = table_record("ChunkRef", CHUNKS_SCHEMA, ("chunk_id", "node_id", "page_id", "ordinal", "text_hash"),
                        extra=[(FILE_FIELD, str)])
# A live node row without its body, and its file, where the body is read back
# from once the update knows it needs it (a row it re-places).
NodeSkeleton = table_record("NodeSkeleton", NODES_SCHEMA, [f.name for f in NODES_SCHEMA if f.name != "body"],
                            extra=[(FILE_FIELD, str)])
# The columns of a node that a link resolves against (transforms/edges.py: a link target).
TARGET_COLUMNS = ("node_id", "page_id", "kind", "url")
# A live node's link target and its site, for the update's link stages (transforms/link_delta.py).
StoredTarget = table_record("StoredTarget", NODES_SCHEMA, (*TARGET_COLUMNS, "site"))
# A live page's skeleton as its pages row stores it (`PageSkeleton.from_row`).
StoredSkeleton = table_record("StoredSkeleton", PAGES_SCHEMA, [f.name for f in fields(PageSkeleton)])
# A live page's links as its pages row stores them (`row_links`).
PageLinks = table_record("PageLinks", PAGES_SCHEMA, ("url", "links"))

DEAD_LETTERS_SCHEMA = pa.schema(
    [
        pa.field("source", pa.string(), nullable=False),
        pa.field("stage", pa.string(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("detail", pa.string(), nullable=False),
    ]
)

# Sparse postings of one shard: one row per (term, chunk), sorted by term then chunk.
# A chunk's BM25 length is the sum of its tf, so the chunks table need not carry it.
POSTINGS_SCHEMA = pa.schema(
    [
        pa.field("term", pa.string(), nullable=False),
        pa.field("chunk_id", pa.int64(), nullable=False),
        pa.field("tf", pa.int32(), nullable=False),
    ]
)

# Document frequency of every term over the whole segment (all shards): in all
# rows, and in the rows of each BM25 field (ritrag.bm25.KIND_FIELDS: chunk
# bodies, node documents, anchor documents), which a server sums over a
# version's segments without reading a posting. Signed in an update's delta.
VOCABULARY_SCHEMA = pa.schema(
    [
        pa.field("term", pa.string(), nullable=False),
        pa.field("df", pa.int64(), nullable=False),
        pa.field("df_body", pa.int64(), nullable=False),
        pa.field("df_doc", pa.int64(), nullable=False),
        pa.field("df_anchors", pa.int64(), nullable=False),
    ]
)

# Ids that a segment supersedes or deletes in the segments before it (one id per row,
# the other columns null). Later segments win; compaction drops the dead rows.
TOMBSTONES_SCHEMA = pa.schema(
    [
        pa.field("node_id", pa.string()),
        pa.field("chunk_id", pa.int64()),
        pa.field("url", pa.string()),  # a pages-table row
        pa.field("source_node_id", pa.string()),  # every edges-table row of this source
    ]
)


@dataclass(frozen=True)
class WarcPage:
    """A response record read from a WARC file: a page input like a file, whose
    URL is its WARC-Target-URI. `source` is "<warc file>#<record offset>"."""

    source: str
    url: str
    payload: bytes
    content_type: str = ""


# The crawl's state (CRAWL_DIR/crawldb.parquet), one row per URL the crawls have
# dealt with: pages, robots.txt files and sitemaps. `status` is one of
# ritrag.crawl_dir.STATUSES; warc_file (relative to CRAWL_DIR) and warc_offset
# locate the response record holding the body of a fetched or unchanged page.
CRAWLDB_SCHEMA = pa.schema(
    [
        pa.field("url", pa.string(), nullable=False),  # as fetched: fragment and tracking parameters dropped
        pa.field("kind", pa.string(), nullable=False),  # page | robots | sitemap
        pa.field("status", pa.string(), nullable=False),
        pa.field("depth", pa.int32(), nullable=False),  # link hops from a seed (sitemap entries: 1)
        pa.field("discovered_from", pa.string(), nullable=False),  # "" for seeds and re-visits
        pa.field("crawl_id", pa.string(), nullable=False),  # the crawl that wrote this row
        pa.field("fetched_at", pa.string(), nullable=False),  # ISO 8601 UTC; "" if never requested
        pa.field("http_status", pa.int32()),
        pa.field("attempts", pa.int32(), nullable=False),
        pa.field("content_type", pa.string(), nullable=False),
        pa.field("etag", pa.string(), nullable=False),
        pa.field("last_modified", pa.string(), nullable=False),
        pa.field("sha256", pa.string(), nullable=False),  # of the payload; "" if no body kept
        pa.field("final_url", pa.string(), nullable=False),  # after following recorded redirects
        pa.field("canonical_url", pa.string(), nullable=False),  # <link rel=canonical>, "" if none
        pa.field("warc_file", pa.string(), nullable=False),
        pa.field("warc_offset", pa.int64()),
        pa.field("error", pa.string(), nullable=False),
        # The re-try schedule of failed pages (transforms/crawl/crawldb.py retry_due): failures in a
        # row, and crawls since the URL was last asked for. Absent in CrawlDBs written before them.
        pa.field("failures", pa.int32(), nullable=False),
        pa.field("idle_crawls", pa.int32(), nullable=False),
    ]
)

# The failed pages a re-crawl leaves resting (not due on the re-try schedule): CRAWL_DIR/.rounds/, like targets.
RESTING_SCHEMA = pa.schema([pa.field("url", pa.string(), nullable=False)])

# A URL scheduled or discovered during a crawl (CRAWL_DIR/.rounds/, deleted when the crawl ends):
# ritrag.transforms.crawl.crawldb.CrawlTarget's fields and how the URL was found.
CRAWL_TARGET_SCHEMA = pa.schema(
    [
        pa.field("url", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("depth", pa.int32(), nullable=False),
        pa.field("discovered_from", pa.string(), nullable=False),
        pa.field("redirects", pa.int32(), nullable=False),  # hops followed to reach this URL
        pa.field("etag", pa.string(), nullable=False),  # validators of a re-visit ("" otherwise)
        pa.field("last_modified", pa.string(), nullable=False),
        pa.field("sha256", pa.string(), nullable=False),
        pa.field("warc_file", pa.string(), nullable=False),
        pa.field("warc_offset", pa.int64()),
        pa.field("content_type", pa.string(), nullable=False),
        pa.field("failures", pa.int32(), nullable=False),
        pa.field("via", pa.string(), nullable=False),  # revisit | seed | sitemap | redirect | link
    ]
)
