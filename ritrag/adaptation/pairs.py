"""Training pairs drawn from an index's own forest, for adapting its embedder.

Two kinds of (anchor, positive) pairs, each with an optional hard negative:

- `path`: a node's path ("Flask > API > Configuration", ritrag/representation.py)
  -> the body of one of its chunks. The positive is the chunk's paragraphs
  without its title line: with the path in it, the pair would be solved by
  copying words, and the model would learn nothing about what a title is about.
- `anchor`: the text another page links a node with -> the body of the node's
  first chunk. Links that say nothing of their target ("here", "next") are
  left out.

A hard negative is the first chunk of a look-alike of the positive's node: a
sibling (the same parent) or a node of the same title on another site, the
nodes GetToC confuses. Pairs without one (a node without look-alikes that hold
text) keep only in-batch negatives.

Sampling is deterministic and bounded, whatever the index's size: every
chunk, edge and node is ranked by a keyed hash of its id and the seed, and the
smallest ranks are kept (at most `limit` of each kind), so the same index and
seed give the same pairs. Tables stream in record batches: chunk ids first
(no text), then the texts of the chosen chunks only; the nodes table is read
without bodies. Memory is bounded by `limit`, not by the index.
"""
from __future__ import annotations

import hashlib
import heapq
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ritrag.schema import EDGES_KIND
from ritrag.reader import IndexReader
from ritrag.representation import Representation
from ritrag.storage import open_parquet

BATCH_ROWS = 65_536  # rows per record batch read: what a pass holds of a table at a time
LOOK_ALIKES_KEPT = 3  # candidates kept per parent and per title (the first that holds text is used)
# Link texts that name no topic: as anchors they would teach the model nothing.
GENERIC_ANCHORS = frozenset({"here", "click here", "link", "this", "this page", "more", "read more", "next",
                             "previous", "prev", "back", "top", "source", "edit", "permalink", "#", "¶"})
MIN_ANCHOR_CHARS = 3


@dataclass(frozen=True)
class TrainingPair:
    kind: str  # "path" or "anchor"
    anchor: str
    positive: str
    negative: str | None  # a look-alike node's first chunk; None: in-batch negatives only
    rank: int  # the sampling rank (smallest first): the order the pairs are used in


def mix64(values: np.ndarray, seed: int) -> np.ndarray:
    """A keyed 64-bit hash of int64 ids (splitmix64's finalizer over id ^ key):
    vectorized, so 30M chunk ids are ranked in numpy, not in Python."""
    key = np.uint64(int.from_bytes(hashlib.blake2b(str(seed).encode(), digest_size=8).digest(), "little"))
    with np.errstate(over="ignore"):
        x = values.astype(np.int64).view(np.uint64) ^ key
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def text_rank(seed: int, text: str) -> int:
    """A keyed 64-bit hash of a string id (the seed is the key)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8,
                                          key=str(seed).encode()).digest(), "little")


def _batches(reader: IndexReader, kind: str, columns: list[str]) -> Iterator[pa.RecordBatch]:
    """The live rows of `kind`, `BATCH_ROWS` at a time, only `columns` read."""
    for live_file in reader.files(kind):
        id_column = live_file.id_column
        wanted = columns if id_column in columns else [id_column, *columns]
        for batch in open_parquet(live_file.path).iter_batches(batch_size=BATCH_ROWS, columns=wanted):
            yield batch.filter(pa.array(live_file.live_mask(batch.column(id_column))))


def body_of(chunk_text: str) -> str:
    """A chunk's paragraphs: its stored text less the title line it starts with."""
    return chunk_text.partition("\n")[2].strip()


def usable_anchor(text: str) -> bool:
    text = " ".join(text.split())
    return (len(text) >= MIN_ANCHOR_CHARS and text.casefold() not in GENERIC_ANCHORS
            and any(c.isalpha() for c in text))


def sample_chunks(reader: IndexReader, limit: int, seed: int) -> list[tuple[int, int, str]]:
    """(rank, chunk id, node id) of the `limit` body chunks (ordinal >= 0) of
    smallest rank, smallest first. One pass over ids only."""
    ranks = np.empty(0, np.uint64)
    ids = np.empty(0, np.int64)
    nodes = np.empty(0, object)
    for batch in _batches(reader, "chunks", ["chunk_id", "node_id", "ordinal"]):
        batch = batch.filter(pc.greater_equal(batch.column("ordinal"), 0))
        batch_ids = batch.column("chunk_id").to_numpy()
        ranks = np.concatenate([ranks, mix64(batch_ids, seed)])
        ids = np.concatenate([ids, batch_ids])
        nodes = np.concatenate([nodes, np.asarray(batch.column("node_id").to_pylist(), object)])
        if len(ranks) > limit:
            keep = np.lexsort((ids, ranks))[:limit]
            ranks, ids, nodes = ranks[keep], ids[keep], nodes[keep]
    order = np.lexsort((ids, ranks))
    return [(int(ranks[i]), int(ids[i]), nodes[i]) for i in order]


def sample_anchors(reader: IndexReader, limit: int, seed: int) -> list[tuple[int, str, str]]:
    """(rank, anchor text, target node id) of `limit` distinct usable link texts
    of smallest rank. A text and target linked from many pages is one pair:
    its rank is taken of the (text, target), so its copies collapse."""
    kept: list[tuple[int, str, str]] = []  # a max-heap by negated rank, at most `limit` entries
    seen: set[tuple[str, str]] = set()
    for batch in _batches(reader, EDGES_KIND, ["target_node_id", "anchor_text"]):
        for target, text in zip(batch.column("target_node_id").to_pylist(), batch.column("anchor_text").to_pylist()):
            if not usable_anchor(text):
                continue
            text = " ".join(text.split())
            key = (text.casefold(), target)
            if key in seen:
                continue
            rank = text_rank(seed, f"{key[0]}\0{target}")
            if len(kept) < limit:
                heapq.heappush(kept, (-rank, text, target))
                seen.add(key)
            elif -kept[0][0] > rank:
                _, old_text, old_target = heapq.heapreplace(kept, (-rank, text, target))
                seen.discard((old_text.casefold(), old_target))
                seen.add(key)
    return sorted((-negated, text, target) for negated, text, target in kept)


@dataclass
class _LookAlikes:
    """The `LOOK_ALIKES_KEPT` nodes of smallest rank per parent and per title."""

    by_parent: dict[str, list[tuple[int, str, str]]]  # parent id -> [(rank, node id, site)]
    by_title: dict[str, list[tuple[int, str, str]]]  # title (lowercased) -> [(rank, node id, site)]

    def candidates(self, node: dict[str, Any]) -> list[str]:
        """Look-alikes of `node` (a node row), best rank first: its siblings and
        the nodes of its title on other sites."""
        found = [entry for entry in self.by_parent.get(node["parent_id"], ()) if entry[1] != node["node_id"]]
        found += [entry for entry in self.by_title.get(node["title"].lower(), ())
                  if entry[2] != node["site"] and entry[1] != node["node_id"]]
        return [node_id for _, node_id, _ in sorted(set(found))]


def _keep_smallest(table: dict[str, list], key: str, entry: tuple[int, str, str]) -> None:
    entries = table.setdefault(key, [])
    if len(entries) < LOOK_ALIKES_KEPT:
        entries.append(entry)
        entries.sort()
    elif entry < entries[-1]:
        entries[-1] = entry
        entries.sort()


def read_nodes(reader: IndexReader, node_ids: set[str]) -> dict[str, dict[str, Any]]:
    """The rows (no body) of `node_ids`, by id."""
    wanted = pa.array(sorted(node_ids), pa.string())
    out: dict[str, dict[str, Any]] = {}
    for batch in _batches(reader, "nodes", ["node_id", "parent_id", "site", "title", "ancestor_titles"]):
        for row in batch.filter(pc.is_in(batch.column("node_id"), wanted)).to_pylist():
            out[row["node_id"]] = row
    return out


def find_look_alikes(reader: IndexReader, nodes: Sequence[dict[str, Any]], seed: int) -> _LookAlikes:
    """The siblings and same-titled nodes of `nodes`, `LOOK_ALIKES_KEPT` per key."""
    parents = pa.array(sorted({n["parent_id"] for n in nodes if n["parent_id"]}), pa.string())
    titles = pa.array(sorted({n["title"].lower() for n in nodes if n["title"].strip()}), pa.string())
    look_alikes = _LookAlikes({}, {})
    for batch in _batches(reader, "nodes", ["node_id", "parent_id", "site", "title"]):
        match = pc.or_(pc.fill_null(pc.is_in(batch.column("parent_id"), parents), False),
                       pc.is_in(pc.utf8_lower(batch.column("title")), titles))
        for row in batch.filter(match).to_pylist():
            entry = (text_rank(seed, row["node_id"]), row["node_id"], row["site"])
            if row["parent_id"] is not None:
                _keep_smallest(look_alikes.by_parent, row["parent_id"], entry)
            _keep_smallest(look_alikes.by_title, row["title"].lower(), entry)
    return look_alikes


def read_chunk_texts(reader: IndexReader, chunk_ids: set[int], first_of: set[str]
                     ) -> tuple[dict[int, str], dict[str, str]]:
    """(chunk id -> text of `chunk_ids`, node id -> text of the first chunk of
    each node of `first_of`): the one pass that reads chunk text."""
    wanted_ids = pa.array(sorted(chunk_ids), pa.int64())
    wanted_nodes = pa.array(sorted(first_of), pa.string())
    by_id: dict[int, str] = {}
    first: dict[str, str] = {}
    for batch in _batches(reader, "chunks", ["chunk_id", "node_id", "ordinal", "text"]):
        is_first = pc.and_(pc.equal(batch.column("ordinal"), 0), pc.is_in(batch.column("node_id"), wanted_nodes))
        picked = batch.filter(pc.or_(pc.is_in(batch.column("chunk_id"), wanted_ids), is_first))
        for row in picked.to_pylist():
            if row["chunk_id"] in chunk_ids:
                by_id[row["chunk_id"]] = row["text"]
            if row["ordinal"] == 0 and row["node_id"] in first_of:
                first[row["node_id"]] = row["text"]
    return by_id, first


@dataclass(frozen=True)
class PairSample:
    pairs: list[TrainingPair]  # smallest rank first
    counts: dict[str, int]  # what was drawn and what was left out, for the training record


def sample_pairs(reader: IndexReader, limit: int, seed: int, hard_negatives: bool = True,
                 representation: Representation | None = None) -> PairSample:
    """At most `limit` training pairs of the version `reader` reads (both kinds
    mixed by rank), each with a hard negative where `hard_negatives` and one
    is found. `representation` makes the paths (default: the index's own)."""
    representation = representation or reader.manifest.settings.index.representation
    chunks = sample_chunks(reader, limit, seed)
    anchors = sample_anchors(reader, limit, seed)
    nodes = read_nodes(reader, {node for _, _, node in chunks} | {target for _, _, target in anchors})
    subjects = [nodes[n] for n in sorted({node for _, _, node in chunks} | {t for _, _, t in anchors}) if n in nodes]
    look_alikes = find_look_alikes(reader, subjects, seed) if hard_negatives else _LookAlikes({}, {})
    candidates = {n["node_id"]: look_alikes.candidates(n) for n in subjects}
    texts, first = read_chunk_texts(reader, {chunk_id for _, chunk_id, _ in chunks},
                                    {t for _, _, t in anchors} | {c for cs in candidates.values() for c in cs})

    def negative(node_id: str, positive: str) -> str | None:
        """The first look-alike of `node_id` that holds text other than `positive`."""
        for candidate in candidates.get(node_id, ()):
            body = body_of(first.get(candidate, ""))
            if body and body != positive:
                return body
        return None

    pairs: list[TrainingPair] = []
    counts = {"chunks_sampled": len(chunks), "anchors_sampled": len(anchors), "without_body": 0}
    for rank, chunk_id, node_id in chunks:
        body = body_of(texts.get(chunk_id, ""))
        node = nodes.get(node_id)
        if not body or node is None:
            counts["without_body"] += 1
            continue
        pairs.append(TrainingPair("path", representation.path(node["title"], node["ancestor_titles"]), body,
                                  negative(node_id, body), rank))
    for rank, text, target in anchors:
        body = body_of(first.get(target, ""))
        if not body:
            counts["without_body"] += 1
            continue
        pairs.append(TrainingPair("anchor", text, body, negative(target, body), rank))
    pairs = [p for p in pairs if p.anchor.strip()]
    pairs.sort(key=lambda p: (p.rank, p.kind, p.anchor, p.positive))
    pairs = pairs[:limit]
    counts.update(pairs=len(pairs), path_pairs=sum(p.kind == "path" for p in pairs),
                  anchor_pairs=sum(p.kind == "anchor" for p in pairs),
                  hard_negatives=sum(p.negative is not None for p in pairs))
    return PairSample(pairs, counts)
