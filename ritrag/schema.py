"""The one definition of every record that crosses a module boundary.

In-pipeline records are frozen dataclasses (small, picklable by Beam's coders);
table rows are plain dicts whose columns are fixed by the Arrow schemas below,
which are also the on-disk Parquet schemas of the index.
"""
from __future__ import annotations

from dataclasses import dataclass, field

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

    @property
    def body(self) -> str:
        return "\n\n".join(s.text for s in self.sections if s.text)


@dataclass(frozen=True)
class DeadLetter:
    """An input that produced no node, and why; every input is accounted for."""

    source: str
    stage: str
    reason: str
    detail: str = ""


NODE_KINDS = ("site", "page", "virtual", "section")

NODES_SCHEMA = pa.schema(
    [
        pa.field("node_id", pa.string(), nullable=False),
        pa.field("parent_id", pa.string()),
        pa.field("site", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("position", pa.int32(), nullable=False),
        pa.field("depth", pa.int32(), nullable=False),
        pa.field("title", pa.string(), nullable=False),
        pa.field("url", pa.string()),
        pa.field("ancestor_ids", pa.list_(pa.string()), nullable=False),
        pa.field("ancestor_titles", pa.list_(pa.string()), nullable=False),
        pa.field("body", pa.string(), nullable=False),
        pa.field("summary", pa.string(), nullable=False),
        pa.field("keywords", pa.list_(pa.string()), nullable=False),
        pa.field("content_hash", pa.string(), nullable=False),
        pa.field("trail_method", pa.string(), nullable=False),
    ]
)

CHUNKS_SCHEMA = pa.schema(
    [
        pa.field("chunk_id", pa.int64(), nullable=False),
        pa.field("node_id", pa.string(), nullable=False),
        pa.field("ordinal", pa.int32(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("n_tokens", pa.int32(), nullable=False),
        pa.field("n_terms", pa.int32(), nullable=False),  # BM25 document length
    ]
)

DEAD_LETTERS_SCHEMA = pa.schema(
    [
        pa.field("source", pa.string(), nullable=False),
        pa.field("stage", pa.string(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("detail", pa.string(), nullable=False),
    ]
)

# Sparse postings of one shard: one row per (term, chunk), sorted by term then chunk.
POSTINGS_SCHEMA = pa.schema(
    [
        pa.field("term", pa.string(), nullable=False),
        pa.field("chunk_id", pa.int64(), nullable=False),
        pa.field("tf", pa.int32(), nullable=False),
    ]
)

# Document frequency of every term over the whole segment (all shards).
VOCABULARY_SCHEMA = pa.schema(
    [
        pa.field("term", pa.string(), nullable=False),
        pa.field("df", pa.int64(), nullable=False),
    ]
)

TABLE_SCHEMAS = {
    "nodes": NODES_SCHEMA,
    "chunks": CHUNKS_SCHEMA,
    "dead_letters": DEAD_LETTERS_SCHEMA,
    "postings": POSTINGS_SCHEMA,
    "vocabulary": VOCABULARY_SCHEMA,
}
