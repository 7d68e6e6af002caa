"""Chunks cut inside one node: never across a node boundary, never over the limit.

A chunk is stored as the node's title line followed by a run of whole
paragraphs (a paragraph too long on its own is split at sentence ends, and a
sentence too long at word boundaries); a node with a title but no body still
gets one chunk. What the model embeds is the index's representation of the
chunk (ritrag/representation.py: by default its node's path, then its
paragraphs): the limit holds for that text, the path's tokens reserved before
paragraphs are packed. Tokens are counted with the embedding model's own
tokenizer, so the limit is the one the model really sees.
"""
from __future__ import annotations

import re
from typing import Callable, Iterable, Sequence

import apache_beam as beam

from ritrag.embedder import EmbedderSpec, load_tokenizer, model_token_limit
from ritrag.ids import chunk_id_for, content_hash
from ritrag.representation import ANCHOR_DOC_ORDINAL, LEGACY, NODE_DOC_ORDINAL, Representation
from ritrag.schema import ChunkRow, NodeRow
from ritrag.transforms import records  # noqa: F401  (the records' RowCoder)

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


def _fit(passages: list[str], render: Callable[[str], str], limit: int, count: TokenCounter
         ) -> list[tuple[str, str, int]]:
    """Counts of joined pieces are only nearly additive for some tokenizers:
    recount whole rendered chunks once (the counts stored with them), halve the
    passages of the few that overflow. A passage of one character is kept as it
    is (a header longer than the limit is the model's to truncate)."""
    out = []
    rendered = [render(p) for p in passages]
    for passage, text, n in zip(passages, rendered, count(rendered)):
        if n <= limit or len(passage) <= 1:
            out.append((passage, text, n))
            continue
        words = passage.split(" ")
        if len(words) > 1:
            mid = len(words) // 2
            halves = [" ".join(words[:mid]), " ".join(words[mid:])]
        else:
            halves = [passage[: len(passage) // 2], passage[len(passage) // 2:]]
        out.extend(_fit(halves, render, limit, count))
    return out


def counted_passages(body: str, render: Callable[[str], str], count: TokenCounter, limit: int,
                     additive: bool = False) -> list[tuple[str, str, int]]:
    """(passage, rendered text, tokens of the rendered text) of the chunks of one
    node body, in document order: `render(passage)` is what the model embeds
    (`render("")` is the header whose tokens every chunk reserves) and holds at
    most `limit` tokens. The tokenizer sees the paragraphs once (their counts are
    packed); unless counts are `additive` (`counts_add_up`), it sees the finished
    chunks once more, to verify them and store their exact counts."""
    header = render("")
    paragraphs = [" ".join(p.split()) for p in _PARAGRAPH_RE.split(body)]
    paragraphs = [p for p in paragraphs if p]
    counts = count(([header] if header else []) + paragraphs)
    header_tokens = counts.pop(0) if header else 0
    budget = max(limit - header_tokens, limit // 2)
    units: list[tuple[str, int]] = []
    for paragraph, n in zip(paragraphs, counts):
        units.extend([(paragraph, n)] if n <= budget else _split_long(paragraph, budget, count))
    if not units:
        return [("", header, header_tokens)] if header else []
    passages = _pack([u for u, _ in units], [n for _, n in units], budget, "\n")
    if not additive:
        return _fit([p for p, _ in passages], render, limit, count)
    out = []
    for passage, n in passages:
        total = header_tokens + n
        out.extend([(passage, render(passage), total)] if total <= limit else _fit([passage], render, limit, count))
    return out


def _title_line(title: str) -> Callable[[str], str]:
    """The stored form of a chunk: the node's title line, then its passage."""
    header = title.strip()
    return lambda passage: f"{header}\n{passage}" if header and passage else header or passage


def counted_chunks(title: str, body: str, count: TokenCounter, limit: int, additive: bool = False
                   ) -> list[tuple[str, int]]:
    """(stored text, tokens) of the chunks of one node, the title line counted in,
    each at most `limit` tokens, in document order."""
    return [(text, n) for _, text, n in counted_passages(body, _title_line(title), count, limit, additive)]


def chunk_text(title: str, body: str, count: TokenCounter, limit: int, additive: bool = False) -> list[str]:
    """Chunk texts of one node, each at most `limit` tokens, in document order."""
    return [text for text, _ in counted_chunks(title, body, count, limit, additive)]


def _truncated(text: str, limit: int, count: TokenCounter) -> tuple[str, int]:
    """`text` cut at a word boundary to at most `limit` tokens, with its count."""
    n = count([text])[0]
    words = text.split(" ")
    while n > limit and len(words) > 1:
        words = words[: max(1, len(words) * limit // (n + 1))]
        text = " ".join(words)
        n = count([text])[0]
    return text, n


def node_chunk_rows(node: NodeRow, representation: Representation, count: TokenCounter, limit: int,
                    additive: bool = False) -> list[ChunkRow]:
    """Rows of the chunks table for one node row: its chunks and, if the
    representation has them, its node document (ordinal -1), each with what
    the model embeds of it (`ChunkRow.embedded_text`)."""
    title_line = _title_line(node.title)
    passages = counted_passages(node.body, representation.renderer(node), count, limit, additive)
    pieces = [(ordinal, title_line(passage), embedded, n)
              for ordinal, (passage, embedded, n) in enumerate(passages)]
    doc = representation.node_doc(node) if representation.node_docs else ""
    if doc:  # a node with neither title nor path nor metadata has nothing to match
        doc, n = _truncated(doc, limit, count)
        pieces.insert(0, (NODE_DOC_ORDINAL, doc, doc, n))
    return [ChunkRow(chunk_id=chunk_id_for(node.node_id, ordinal, embedded), node_id=node.node_id,
                     page_id=node.page_id, ordinal=ordinal, text=text, text_hash=content_hash(embedded),
                     n_tokens=n_tokens, embedded_text=embedded)
            for ordinal, text, embedded, n_tokens in pieces]


def anchor_doc_row(node_id: str, page_id: str, anchors: Sequence[str], count: TokenCounter) -> ChunkRow:
    """The chunks-table row of a node's anchor document (ordinal -2): the anchor
    texts of its in-links, one a line. Never embedded: its `embedded_text` is ""."""
    text = "\n".join(anchors)
    return ChunkRow(chunk_id=chunk_id_for(node_id, ANCHOR_DOC_ORDINAL, text), node_id=node_id, page_id=page_id,
                    ordinal=ANCHOR_DOC_ORDINAL, text=text, text_hash=content_hash(text), n_tokens=count([text])[0],
                    embedded_text="")


def chunk_rows(node_id: str, page_id: str, title: str, body: str, count: TokenCounter, limit: int,
               additive: bool = False) -> list[ChunkRow]:
    """Chunk rows of a page node known by its title and body alone, at the
    root of no site (LEGACY representation: the title is all it renders)."""
    node = NodeRow(node_id=node_id, parent_id=None, page_id=page_id, site="", kind="page", position=0, depth=0,
                   title=title, url=None, ancestor_ids=[], ancestor_titles=[], body=body, summary="", keywords=[],
                   source_summary="", source_keywords=[], metadata_key="", content_hash="", trail_method="",
                   source_kind="")
    return node_chunk_rows(node, LEGACY, count, limit, additive)


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


# Characters Python's str.split() splits at that BERT's normalizer deletes
# (control characters), joining the words around them: a text holding one is
# counted whole. Every other separator is whitespace to both.
_JOINING_CONTROLS = re.compile("[\x0b\x0c\x1c-\x1f\x85]")
_WORD_CACHE_LIMIT = 1 << 18  # distinct words remembered (~30 MiB), then forgotten at once


def word_counter(count: TokenCounter) -> TokenCounter:
    """`count` for a tokenizer whose counts add up over whitespace
    (`counts_add_up`), computed as the sum of each word's count, every distinct
    word tokenized once: the same numbers, without tokenizing the same words of
    a corpus again and again (the tokenizer was the build's largest CPU stage)."""
    cache: dict[str, int] = {}

    def count_words(texts: Sequence[str]) -> list[int]:
        words = [None if _JOINING_CONTROLS.search(t) else t.split() for t in texts]
        if len(cache) > _WORD_CACHE_LIMIT:
            cache.clear()
        new = list({w for ws in words if ws for w in ws if w not in cache})
        if new:
            cache.update(zip(new, count(new)))
        whole = [t for t, ws in zip(texts, words) if ws is None]
        counted = iter(count(whole))
        return [next(counted) if ws is None else sum(map(cache.__getitem__, ws)) for ws in words]

    return count_words


def model_counter(spec: EmbedderSpec) -> tuple[TokenCounter, int, bool]:
    """(token counter, token limit, whether counts add up) of `spec`'s model,
    its tokenizer loaded here, once."""
    tokenizer = load_tokenizer(spec)
    count, limit = tokenizer_counter(tokenizer), model_token_limit(spec, tokenizer)
    additive = counts_add_up(tokenizer)
    return (word_counter(count) if additive else count), limit, additive


class Chunker:
    """Node row -> its chunk rows in `representation`, tokens counted by the
    tokenizer of `spec`'s model: the one chunking of the build, the update and
    the tests. Virtual and site nodes hold no text: no chunks and no node
    document. It pickles as its spec and representation (what a Beam stage
    carries to its workers); the tokenizer is loaded at first use, once per
    process."""

    def __init__(self, spec: EmbedderSpec, representation: Representation):
        self.spec, self.representation = spec, representation
        self._counter: tuple[TokenCounter, int, bool] | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_counter": None}

    def __call__(self, node: NodeRow) -> list[ChunkRow]:
        if node.kind in ("site", "virtual"):
            return []
        if self._counter is None:
            self._counter = model_counter(self.spec)
        count, limit, additive = self._counter
        return node_chunk_rows(node, self.representation, count, limit, additive)


@beam.typehints.with_input_types(NodeRow)
@beam.typehints.with_output_types(ChunkRow)
class ChunkNodesFn(beam.DoFn):
    """Node rows -> chunk rows, counting tokens with the embedding model's tokenizer."""

    def __init__(self, chunker: Chunker):
        self._chunker = chunker
        self._chunks = beam.metrics.Metrics.counter("ritrag.chunk", "chunks")

    def process(self, node: NodeRow) -> Iterable[ChunkRow]:
        rows = self._chunker(node)
        self._chunks.inc(len(rows))
        yield from rows


@beam.typehints.with_output_types(ChunkRow)
class AnchorDocFn(beam.DoFn):
    """(node id, page id, anchor texts) -> the node's anchor-document chunk row,
    its tokens counted with the embedding model's tokenizer like every chunk's."""

    def __init__(self, spec: EmbedderSpec):
        self._spec = spec
        self._docs = beam.metrics.Metrics.counter("ritrag.chunk", "anchor_docs")
        self._count: TokenCounter | None = None

    def process(self, node_page_anchors: tuple[str, str, tuple[str, ...]]) -> Iterable[ChunkRow]:
        # The tokenizer is loaded at the first element, as the Chunker loads it: an
        # update whose links changed no anchor text never loads it (1.6 s).
        if self._count is None:
            self._count, _, _ = model_counter(self._spec)
        node_id, page_id, anchors = node_page_anchors
        self._docs.inc()
        yield anchor_doc_row(node_id, page_id, anchors, self._count)
