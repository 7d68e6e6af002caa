"""Chunks cut inside one node: never across a node boundary, never over the limit.

A chunk is the node's title line followed by a run of whole paragraphs (a
paragraph too long on its own is split at sentence ends, and a sentence too
long at word boundaries). The title line makes a chunk findable by the name of
its node, and a node with a title but no body still gets one chunk. Tokens are
counted with the embedding model's own tokenizer, so the limit is the one the
model really sees.
"""
from __future__ import annotations

import re
from typing import Callable, Sequence

import apache_beam as beam

from ritrag.embedder import EmbedderSpec, load_tokenizer, model_token_limit
from ritrag.ids import chunk_id_for, content_hash

TokenCounter = Callable[[Sequence[str]], list[int]]

_PARAGRAPH_RE = re.compile(r"\n\s*\n")
_SENTENCE_RE = re.compile(r"(?<=[.!?;:])\s+(?=\S)")


def _split_long(unit: str, budget: int, count: TokenCounter) -> list[str]:
    """Split a paragraph into sentences, and a sentence into word runs, that fit."""
    pieces = [p for p in _SENTENCE_RE.split(unit) if p.strip()]
    if len(pieces) > 1:
        out = []
        for piece, n in zip(pieces, count(pieces)):
            out.extend([piece] if n <= budget else _split_long(piece, budget, count))
        return out
    words = unit.split()
    if len(words) <= 1:
        return [unit] if words else []  # one unbreakable token run; _fit halves it by characters
    return _pack(words, count(words), budget, " ")


def _pack(units: Sequence[str], sizes: Sequence[int], budget: int, sep: str) -> list[str]:
    """Greedy packing of consecutive units into runs of at most `budget` tokens."""
    runs, current, used = [], [], 0
    for unit, size in zip(units, sizes):
        if current and used + size > budget:
            runs.append(sep.join(current))
            current, used = [], 0
        current.append(unit)
        used += size
    if current:
        runs.append(sep.join(current))
    return runs


def _fit(texts: list[str], limit: int, count: TokenCounter) -> list[str]:
    """Token counts are not exactly additive: recount whole chunks, halve the few
    that overflow."""
    out = []
    for text, n in zip(texts, count(texts)):
        if n <= limit:
            out.append(text)
            continue
        words = text.split(" ")
        if len(words) > 1:
            mid = len(words) // 2
            halves = [" ".join(words[:mid]), " ".join(words[mid:])]
        else:
            halves = [text[: len(text) // 2], text[len(text) // 2:]]
        out.extend(_fit(halves, limit, count))
    return out


def chunk_text(title: str, body: str, count: TokenCounter, limit: int) -> list[str]:
    """Chunk texts of one node, each at most `limit` tokens, in document order."""
    header = title.strip()
    header_tokens = count([header + "\n"])[0] if header else 0
    budget = max(limit - header_tokens, limit // 2)
    paragraphs = [" ".join(p.split()) for p in _PARAGRAPH_RE.split(body)]
    paragraphs = [p for p in paragraphs if p]
    units: list[str] = []
    for paragraph, n in zip(paragraphs, count(paragraphs) if paragraphs else []):
        units.extend([paragraph] if n <= budget else _split_long(paragraph, budget, count))
    if not units:
        return [header] if header else []
    passages = _pack(units, count(units), budget, "\n")
    texts = [f"{header}\n{p}" if header else p for p in passages]
    return _fit(texts, limit, count)


def chunk_rows(node_id: str, page_id: str, title: str, body: str, count: TokenCounter, limit: int
               ) -> list[dict]:
    """Rows of the chunks table (CHUNKS_SCHEMA) for one node of page `page_id`."""
    texts = chunk_text(title, body, count, limit)
    rows = []
    for ordinal, (text, n_tokens) in enumerate(zip(texts, count(texts) if texts else [])):
        rows.append({
            "chunk_id": chunk_id_for(node_id, ordinal, text),
            "node_id": node_id,
            "page_id": page_id,
            "ordinal": ordinal,
            "text": text,
            "text_hash": content_hash(text),
            "n_tokens": n_tokens,
        })
    return rows


def tokenizer_counter(tokenizer) -> TokenCounter:
    tokenizer.model_max_length = 1 << 30  # we count long texts on purpose; silence the warning
    def count(texts: Sequence[str]) -> list[int]:
        if not texts:
            return []
        encoded = tokenizer(list(texts), add_special_tokens=False, return_attention_mask=False,
                            return_token_type_ids=False)
        return [len(ids) for ids in encoded["input_ids"]]

    return count


class ChunkNodesFn(beam.DoFn):
    """Node rows -> chunk rows, counting tokens with the embedding model's tokenizer."""

    def __init__(self, spec: EmbedderSpec):
        self._spec = spec
        self._chunks = beam.metrics.Metrics.counter("ritrag.chunk", "chunks")

    def setup(self):
        tokenizer = load_tokenizer(self._spec)
        self._count = tokenizer_counter(tokenizer)
        self._limit = model_token_limit(self._spec, tokenizer)

    def process(self, node: dict):
        if node["kind"] in ("site", "virtual"):
            return
        rows = chunk_rows(node["node_id"], node["page_id"], node["title"], node["body"], self._count,
                          self._limit)
        self._chunks.inc(len(rows))
        yield from rows
