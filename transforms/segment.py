"""The sink of a segment, as every job that writes one applies it (build,
update, compact): its tables (transforms/tables.py), its BM25 postings and
vocabulary (transforms/sparse.py), its serving form once those are written
(transforms/serving_files.py), and its dense and vector shards
(transforms/dense.py). docs/ARCHITECTURE.md "On-disk format" says what each
file holds."""
from __future__ import annotations

import apache_beam as beam

from ritrag.schema import TABLES
from ritrag.transforms.dense import TRAINED, VECTORS, WriteDenseIndex
from ritrag.transforms.serving_files import WriteServingForm
from ritrag.transforms.sparse import WriteSparseIndex
from ritrag.transforms.tables import WriteSegmentTables

SPARSE = "sparse"  # BuildSparseIndex's output


class WriteSegment(beam.PTransform):
    """{each table kind of ritrag.schema.TABLES: its rows, SPARSE: the
    segment's postings and statistics (BuildSparseIndex), VECTORS: (chunk id,
    vector) pairs, TRAINED: the one TrainedIndex} -> every file of the segment
    written into `segment_dir`, in `num_shards` shards; outputs WriteDenseIndex's
    (kind, number of vectors) pairs."""

    def __init__(self, segment_dir: str, num_shards: int):
        super().__init__()
        self._segment_dir, self._num_shards = segment_dir, num_shards

    def expand(self, parts):  # {name: PCollection}, unannotated: Beam warns of it
        segment_dir, num_shards = self._segment_dir, self._num_shards
        written = ({kind: parts[kind] for kind in TABLES}
                   | "WriteTables" >> WriteSegmentTables(segment_dir, num_shards))
        sparse_written = parts[SPARSE] | "WriteSparse" >> WriteSparseIndex(segment_dir, num_shards)
        # The serving form is made of the tables and postings written (each shard's
        # files and every node file): it waits for them all.
        tables_written = ((written["nodes"], written["chunks"], written["edges"], sparse_written)
                          | "TablesWritten" >> beam.Flatten())
        ({"edges": parts["edges"], "written": tables_written}
         | "WriteServingForm" >> WriteServingForm(segment_dir, num_shards))
        return ({VECTORS: parts[VECTORS], TRAINED: parts[TRAINED]}
                | "WriteDense" >> WriteDenseIndex(segment_dir, num_shards))
