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


def _split_long(unit: str, budget: int, count: TokenCounter) -> list[tuple[str, int]]:
    """Split a paragraph into sentences, and a sentence into word runs, that fit;
    each piece with its token count."""
    pieces = [p for p in _SENTENCE_RE.split(unit) if p.strip()]
    if len(pieces) > 1:
        out = []
        for piece, n in zip(pieces, count(pieces)):
            out.extend([(piece, n)] if n <= budget else _split_long(piece, budget, count))
        return out
    words = unit.split()
    if len(words) <= 1:  # one unbreakable token run: _fit halves it by characters
        return [(unit, count([unit])[0])] if words else []
    return _pack(words, count(words), budget, " ")


def _pack(units: Sequence[str], sizes: Sequence[int], budget: int, sep: str) -> list[tuple[str, int]]:
    """Greedy packing of consecutive units into runs of at most `budget` tokens
    (by the sum of the units' counts), each run with that sum."""
    runs, current, used = [], [], 0
    for unit, size in zip(units, sizes):
        if current and used + size > budget:
            runs.append((sep.join(current), used))
            current, used = [], 0
        current.append(unit)
        used += size
    if current:
        runs.append((sep.join(current), used))
    return runs


def _fit(texts: list[str], limit: int, count: TokenCounter) -> list[tuple[str, int]]:
    """Counts of joined pieces are only nearly additive for some tokenizers:
    recount whole chunks once (the counts stored with them), halve the few
    that overflow."""
    out = []
    for text, n in zip(texts, count(texts)):
        if n <= limit:
            out.append((text, n))
            continue
        words = text.split(" ")
        if len(words) > 1:
            mid = len(words) // 2
            halves = [" ".join(words[:mid]), " ".join(words[mid:])]
        else:
            halves = [text[: len(text) // 2], text[len(text) // 2:]]
        out.extend(_fit(halves, limit, count))
    return out


def counted_chunks(title: str, body: str, count: TokenCounter, limit: int, additive: bool = False
                   ) -> list[tuple[str, int]]:
    """(text, tokens) of the chunks of one node, each at most `limit` tokens, in
    document order. The tokenizer sees the paragraphs once (their counts are
    packed); unless counts are `additive` (`counts_add_up`), it sees the finished
    chunks once more, to verify them and store their exact counts."""
    header = title.strip()
    paragraphs = [" ".join(p.split()) for p in _PARAGRAPH_RE.split(body)]
    paragraphs = [p for p in paragraphs if p]
    counts = count(([header + "\n"] if header else []) + paragraphs)
    header_tokens = counts.pop(0) if header else 0
    budget = max(limit - header_tokens, limit // 2)
    units: list[tuple[str, int]] = []
    for paragraph, n in zip(paragraphs, counts):
        units.extend([(paragraph, n)] if n <= budget else _split_long(paragraph, budget, count))
    if not units:
        return [(header, header_tokens)] if header else []
    passages = _pack([u for u, _ in units], [n for _, n in units], budget, "\n")
    texts = [f"{header}\n{p}" if header else p for p, _ in passages]
    if not additive:
        return _fit(texts, limit, count)
    out = []
    for text, (_, n) in zip(texts, passages):
        total = header_tokens + n
        out.extend([(text, total)] if total <= limit else _fit([text], limit, count))
    return out


def chunk_text(title: str, body: str, count: TokenCounter, limit: int, additive: bool = False) -> list[str]:
    """Chunk texts of one node, each at most `limit` tokens, in document order."""
    return [text for text, _ in counted_chunks(title, body, count, limit, additive)]


def chunk_rows(node_id: str, page_id: str, title: str, body: str, count: TokenCounter, limit: int,
               additive: bool = False) -> list[dict]:
    """Rows of the chunks table (CHUNKS_SCHEMA) for one node of page `page_id`."""
    rows = []
    for ordinal, (text, n_tokens) in enumerate(counted_chunks(title, body, count, limit, additive)):
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


# Pre-tokenizers that split at every whitespace (and normalizers that map
# characters one by one): with them, a text joined from parts at whitespace has
# exactly the sum of its parts' token counts. Byte-level BPE and SentencePiece
# tokenizers mark word starts, so their counts are verified instead.
_SPLITTING_PRE_TOKENIZERS = {"BertPreTokenizer", "Whitespace", "WhitespaceSplit"}
_CHARACTER_NORMALIZERS = {"BertNormalizer", "NFC", "NFD", "NFKC", "NFKD", "Lowercase", "StripAccents"}


def counts_add_up(tokenizer) -> bool:
    """Whether the token count of texts joined at whitespace is the sum of their counts."""
    import json

    config = json.loads(tokenizer.backend_tokenizer.to_str())
    normalizer, pre_tokenizer = config.get("normalizer"), config.get("pre_tokenizer") or {}
    normalizers = (normalizer.get("normalizers", [normalizer]) if normalizer else [])
    return (config.get("model", {}).get("type") == "WordPiece"
            and pre_tokenizer.get("type") in _SPLITTING_PRE_TOKENIZERS
            and all(n.get("type") in _CHARACTER_NORMALIZERS for n in normalizers))


def tokenizer_counter(tokenizer) -> TokenCounter:
    from tokenizers import Tokenizer

    # A private copy of the Rust tokenizer: the model's tokenizer.json may switch on
    # padding and truncation, which would make every count the batch's longest.
    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.no_padding()
    backend.no_truncation()
    fast = getattr(backend, "encode_batch_fast", backend.encode_batch)  # no offsets: faster

    def count(texts: Sequence[str]) -> list[int]:
        if not texts:
            return []
        return [len(e.ids) for e in fast(list(texts), add_special_tokens=False)]

    return count


def node_chunker(spec: EmbedderSpec) -> Callable[[dict], list[dict]]:
    """Node row -> its chunk rows, tokens counted by the tokenizer of `spec`'s
    model (loaded here, once). Virtual and site nodes hold no text: no chunks."""
    tokenizer = load_tokenizer(spec)
    count, limit = tokenizer_counter(tokenizer), model_token_limit(spec, tokenizer)
    additive = counts_add_up(tokenizer)

    def chunk(node: dict) -> list[dict]:
        if node["kind"] in ("site", "virtual"):
            return []
        return chunk_rows(node["node_id"], node["page_id"], node["title"], node["body"], count, limit, additive)

    return chunk


class ChunkNodesFn(beam.DoFn):
    """Node rows -> chunk rows, counting tokens with the embedding model's tokenizer."""

    def __init__(self, spec: EmbedderSpec):
        self._spec = spec
        self._chunks = beam.metrics.Metrics.counter("ritrag.chunk", "chunks")

    def setup(self):
        self._chunk = node_chunker(self._spec)

    def process(self, node: dict):
        rows = self._chunk(node)
        self._chunks.inc(len(rows))
        yield from rows
