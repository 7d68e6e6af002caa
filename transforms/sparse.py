"""Sharded BM25 postings with exact global statistics (what the server scores
with: ritrag/bm25.py).

Each shard file holds (term, chunk_id, tf) rows of the chunks it owns, sorted by
term then chunk. Statistics that BM25 needs across shards are computed by Beam
combiners over the whole corpus: the document frequency of every term
(`vocabulary-SSSSS-of-NNNNN.parquet`, sharded by term, sorted) and N and the
total number of terms (`bm25.json`), so a sharded index scores exactly like an
unsharded one. No worker holds the whole vocabulary.
"""
from __future__ import annotations

import json
import os

import apache_beam as beam
import pyarrow as pa
from apache_beam.transforms.window import GlobalWindows

from ritrag.analyzer import term_frequencies
from ritrag.bm25 import KIND_FIELDS, corpus_stats, row_kind
from ritrag.layout import BM25_STATS_FILE
from ritrag.representation import Representation
from ritrag.schema import POSTINGS_SCHEMA, VOCABULARY_SCHEMA, ChunkRow
from ritrag.transforms import records  # noqa: F401  (the records' RowCoder)
from ritrag.transforms.tables import WriteShards, write_bytes, write_sorted_table



ChunkTerms = tuple[int, dict[str, int], int]  # (chunk_id, term -> tf, BM25 field: ritrag.bm25.row_kind)


def chunk_terms(chunk_id: int, ordinal: int, text: str, representation: Representation) -> ChunkTerms:
    """(chunk_id, term -> tf, field) of one chunks-table row (a chunk's body,
    a node document or an anchor document) by its id, ordinal and stored
    text, as `representation` indexes it."""
    tf, _ = term_frequencies(representation.bm25_text(text, ordinal))
    return chunk_id, dict(tf), row_kind(ordinal)


def row_terms(chunk: ChunkRow, representation: Representation) -> ChunkTerms:
    """`chunk_terms` of a chunk row."""
    return chunk_terms(chunk.chunk_id, chunk.ordinal, chunk.text, representation)


def postings_table(chunks: list[ChunkTerms]) -> pa.Table:
    """POSTINGS_SCHEMA rows of chunks' terms, in no particular order."""
    terms = [t for _, tf, _ in chunks for t in tf]
    chunk_ids = [cid for cid, tf, _ in chunks for _ in range(len(tf))]
    tfs = [n for _, tf, _ in chunks for n in tf.values()]
    return pa.table({"term": terms, "chunk_id": chunk_ids, "tf": tfs}, schema=POSTINGS_SCHEMA)


def write_postings_file(path: str, postings: pa.Table) -> int:
    return write_sorted_table(path, postings, POSTINGS_SCHEMA, ["term", "chunk_id"])


def vocabulary_table(term_dfs: list[tuple[str, tuple[int, ...]]]) -> pa.Table:
    """VOCABULARY_SCHEMA rows of (term, df per field in KIND_FIELDS order) pairs."""
    by_field = {f"df_{name}": [df[kind] for _, df in term_dfs] for kind, name in enumerate(KIND_FIELDS)}
    return pa.table({"term": [t for t, _ in term_dfs], "df": [sum(df) for _, df in term_dfs], **by_field},
                    schema=VOCABULARY_SCHEMA)


def write_vocabulary_file(path: str, vocabulary: pa.Table) -> int:
    return write_sorted_table(path, vocabulary, VOCABULARY_SCHEMA, ["term"])


def write_bm25_stats(stats: dict, out_dir: str) -> None:
    write_bytes(os.path.join(out_dir, BM25_STATS_FILE), json.dumps(stats, sort_keys=True).encode())


class _CountTermsFn(beam.DoFn):
    """(term -> tf, field, sign) per chunk -> (term, signed number of chunks
    per field) per bundle: counting in a dict costs far less than one Beam
    element per (term, chunk)."""

    def start_bundle(self):
        self._counts: dict[str, list[int]] = {}

    def process(self, tf_kind_sign: tuple[dict[str, int], int, int]):
        tf, kind, sign = tf_kind_sign
        counts = self._counts
        for term in tf:
            per_field = counts.get(term)
            if per_field is None:
                per_field = counts[term] = [0] * len(KIND_FIELDS)
            per_field[kind] += sign

    def finish_bundle(self):
        for term, per_field in self._counts.items():
            yield GlobalWindows.windowed_value((term, tuple(per_field)))
        self._counts = {}


class _SumTuples(beam.CombineFn):
    """Element-wise sums of equal-length tuples of ints."""

    def __init__(self, width: int):
        self._width = width

    def create_accumulator(self):
        return (0,) * self._width

    def add_input(self, acc, values):
        return tuple(a + v for a, v in zip(acc, values))

    def merge_accumulators(self, accs):
        return tuple(map(sum, zip(*accs))) if accs else self.create_accumulator()

    def extract_output(self, acc):
        return acc


# The outputs of BuildSparseIndex, what WriteSparseIndex writes.
POSTINGS = "postings"  # (chunk_id, term -> tf) per chunk row
VOCABULARY = "vocabulary"  # (term, df per field) per term, signed in a delta, never all 0
CORPUS_STATS = "corpus_stats"  # one `ritrag.bm25.corpus_stats` dict (signed in a delta)


class BuildSparseIndex(beam.PTransform):
    """Chunk rows (ChunkRow) -> {POSTINGS, VOCABULARY, CORPUS_STATS}, the terms of each row
    as `representation` indexes them. Node documents (ordinal -1) share the
    postings with chunks; the server tells the two fields apart by ordinal and
    keeps separate statistics for each.

    `removed`, for a delta segment, holds the (chunk_id, term -> tf) of the chunks
    it tombstones: the vocabulary and statistics are then signed differences, so
    that the sums over a version's segments stay the exact global statistics.
    """

    def __init__(self, representation: Representation, removed: beam.PCollection | None = None):
        super().__init__()
        self._representation = representation
        self._removed = removed

    def expand(self, chunks: beam.PCollection[ChunkRow]):  # -> {name: PCollection}, unannotated: Beam warns of it
        terms = chunks | "AnalyzeChunks" >> beam.Map(row_terms, self._representation)
        signed = terms | "Added" >> beam.Map(lambda ct: (ct[1], ct[2], 1))
        if self._removed is not None:
            signed = ((signed, self._removed | "Removed" >> beam.Map(lambda ct: (ct[1], ct[2], -1)))
                      | "AddedAndRemoved" >> beam.Flatten())
        vocabulary = (signed
                      | "TermsOncePerChunk" >> beam.ParDo(_CountTermsFn())
                      | "DocumentFrequency" >> beam.CombinePerKey(_SumTuples(len(KIND_FIELDS)))
                      | "NonZero" >> beam.Filter(lambda term_df: any(term_df[1])))
        stats = (signed
                 | "ChunkLengths" >> beam.Map(lambda tf_kind_sign: (tf_kind_sign[2],
                                                                    tf_kind_sign[2] * sum(tf_kind_sign[0].values())))
                 | "CorpusTotals" >> beam.CombineGlobally(_SumTuples(2))
                 | "CorpusStats" >> beam.MapTuple(corpus_stats))
        return {POSTINGS: terms, VOCABULARY: vocabulary, CORPUS_STATS: stats}


class WriteSparseIndex(beam.PTransform):
    """BuildSparseIndex's outputs -> postings and vocabulary shards and bm25.json
    in `out_dir`. Outputs one (kind, number of rows) pair per shard file."""

    def __init__(self, out_dir: str, num_shards: int):
        super().__init__()
        self._out_dir = out_dir
        self._num_shards = num_shards

    def expand(self, sparse) -> beam.PCollection:  # {name: PCollection}: no annotation, which Beam would warn of
        out_dir, num_shards = self._out_dir, self._num_shards
        sparse[CORPUS_STATS] | "WriteBm25Stats" >> beam.Map(write_bm25_stats, out_dir)
        vocabulary = sparse[VOCABULARY] | "WriteVocabulary" >> WriteShards(
            out_dir, "vocabulary", num_shards, shard_key=lambda td: td[0], to_table=vocabulary_table,
            write=write_vocabulary_file)
        postings = sparse[POSTINGS] | "WritePostings" >> WriteShards(
            out_dir, "postings", num_shards, shard_key=lambda ct: ct[0], to_table=postings_table,
            write=write_postings_file)
        return (vocabulary, postings) | "Written" >> beam.Flatten()
