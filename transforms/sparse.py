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

import collections
import json
import os

import apache_beam as beam
import pyarrow as pa
from apache_beam.transforms.window import GlobalWindows

from ritrag.analyzer import term_frequencies
from ritrag.bm25 import corpus_stats
from ritrag.layout import BM25_STATS_FILE
from ritrag.representation import Representation
from ritrag.schema import POSTINGS_SCHEMA, VOCABULARY_SCHEMA
from ritrag.transforms.tables import WriteShards, write_bytes, write_sorted_table



def chunk_terms(chunk: dict, representation: Representation) -> tuple[int, dict[str, int]]:
    """(chunk_id, term -> tf) of one chunks-table row (a chunk's body, or a node
    document), as `representation` indexes it."""
    tf, _ = term_frequencies(representation.bm25_text(chunk))
    return chunk["chunk_id"], dict(tf)


def postings_table(chunks: list[tuple[int, dict[str, int]]]) -> pa.Table:
    """POSTINGS_SCHEMA rows of (chunk_id, term -> tf) pairs, in no particular order."""
    terms = [t for _, tf in chunks for t in tf]
    chunk_ids = [cid for cid, tf in chunks for _ in range(len(tf))]
    tfs = [n for _, tf in chunks for n in tf.values()]
    return pa.table({"term": terms, "chunk_id": chunk_ids, "tf": tfs}, schema=POSTINGS_SCHEMA)


def write_postings_file(path: str, postings: pa.Table) -> int:
    return write_sorted_table(path, postings, POSTINGS_SCHEMA, ["term", "chunk_id"])


def vocabulary_table(term_dfs: list[tuple[str, int]]) -> pa.Table:
    return pa.table({"term": [t for t, _ in term_dfs], "df": [n for _, n in term_dfs]}, schema=VOCABULARY_SCHEMA)


def write_vocabulary_file(path: str, vocabulary: pa.Table) -> int:
    return write_sorted_table(path, vocabulary, VOCABULARY_SCHEMA, ["term"])


def write_bm25_stats(stats: dict, out_dir: str) -> None:
    write_bytes(os.path.join(out_dir, BM25_STATS_FILE), json.dumps(stats, sort_keys=True).encode())


class _CountTermsFn(beam.DoFn):
    """(term -> tf, sign) per chunk -> (term, signed number of chunks) per bundle:
    counting in a dict costs far less than one Beam element per (term, chunk)."""

    def start_bundle(self):
        self._counts: collections.Counter = collections.Counter()

    def process(self, tf_sign: tuple[dict[str, int], int]):
        tf, sign = tf_sign
        counts = self._counts
        for term in tf:
            counts[term] += sign

    def finish_bundle(self):
        for term_count in self._counts.items():
            yield GlobalWindows.windowed_value(term_count)
        self._counts = collections.Counter()


class _SumPairs(beam.CombineFn):
    def create_accumulator(self):
        return 0, 0

    def add_input(self, acc, pair):
        return acc[0] + pair[0], acc[1] + pair[1]

    def merge_accumulators(self, accs):
        a, b = zip(*accs) if accs else ((), ())
        return sum(a), sum(b)

    def extract_output(self, acc):
        return acc


# The outputs of BuildSparseIndex, what WriteSparseIndex writes.
POSTINGS = "postings"  # (chunk_id, term -> tf) per chunk row
VOCABULARY = "vocabulary"  # (term, df) per term, df signed in a delta, never 0
CORPUS_STATS = "corpus_stats"  # one `ritrag.bm25.corpus_stats` dict (signed in a delta)


class BuildSparseIndex(beam.PTransform):
    """Chunk rows -> {POSTINGS, VOCABULARY, CORPUS_STATS}, the terms of each row
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

    def expand(self, chunks: beam.PCollection) -> dict[str, beam.PCollection]:
        terms = chunks | "AnalyzeChunks" >> beam.Map(chunk_terms, self._representation)
        signed = terms | "Added" >> beam.Map(lambda ct: (ct[1], 1))
        if self._removed is not None:
            signed = ((signed, self._removed | "Removed" >> beam.Map(lambda ct: (ct[1], -1)))
                      | "AddedAndRemoved" >> beam.Flatten())
        vocabulary = (signed
                      | "TermsOncePerChunk" >> beam.ParDo(_CountTermsFn())
                      | "DocumentFrequency" >> beam.CombinePerKey(sum)
                      | "NonZero" >> beam.Filter(lambda term_df: term_df[1] != 0))
        stats = (signed
                 | "ChunkLengths" >> beam.Map(lambda tf_sign: (tf_sign[1], tf_sign[1] * sum(tf_sign[0].values())))
                 | "CorpusTotals" >> beam.CombineGlobally(_SumPairs())
                 | "CorpusStats" >> beam.MapTuple(corpus_stats))
        return {POSTINGS: terms, VOCABULARY: vocabulary, CORPUS_STATS: stats}


class WriteSparseIndex(beam.PTransform):
    """BuildSparseIndex's outputs -> postings and vocabulary shards and bm25.json
    in `out_dir`. Outputs one (kind, number of rows) pair per shard file."""

    def __init__(self, out_dir: str, num_shards: int):
        super().__init__()
        self._out_dir = out_dir
        self._num_shards = num_shards

    def expand(self, sparse: dict[str, beam.PCollection]) -> beam.PCollection:
        out_dir, num_shards = self._out_dir, self._num_shards
        sparse[CORPUS_STATS] | "WriteBm25Stats" >> beam.Map(write_bm25_stats, out_dir)
        vocabulary = sparse[VOCABULARY] | "WriteVocabulary" >> WriteShards(
            out_dir, "vocabulary", num_shards, shard_key=lambda td: td[0], to_table=vocabulary_table,
            write=write_vocabulary_file)
        postings = sparse[POSTINGS] | "WritePostings" >> WriteShards(
            out_dir, "postings", num_shards, shard_key=lambda ct: ct[0], to_table=postings_table,
            write=write_postings_file)
        return (vocabulary, postings) | "Written" >> beam.Flatten()
