"""The sink of a segment's serving form (ritrag/serving_form.py): one serving
file per shard, written once the shard's tables are. A shard's serving file is
made of its chunks, postings and vocabulary files and of the segment's node
ids, so the stage waits for every table written (a side input of their
writes is complete only when all are), then writes the shards in parallel,
one per worker: memory and time per worker follow one shard, and no
launcher reads the whole segment."""
from __future__ import annotations

import apache_beam as beam

from ritrag.serving_form import segment_node_ids, write_shard_serving_form


def _write_shard(shard: int, segment_dir: str, num_shards: int, tables_written: list) -> str:
    del tables_written  # waited for: the shard's tables and every node file exist now
    return write_shard_serving_form(segment_dir, shard, num_shards, segment_node_ids(segment_dir, num_shards))


class WriteServingForm(beam.PTransform):
    """The writes of a segment's tables ((kind, rows) per shard file, as the
    table sinks output them) -> the path of each shard's serving file."""

    def __init__(self, segment_dir: str, num_shards: int):
        super().__init__()
        self._segment_dir, self._num_shards = segment_dir, num_shards

    def expand(self, tables_written):
        written = tables_written | "TablesWritten" >> beam.Flatten()
        return (written.pipeline
                | "Shards" >> beam.Create(range(self._num_shards))
                | "OnePerWorker" >> beam.Reshuffle()
                | "WriteShard" >> beam.Map(_write_shard, self._segment_dir, self._num_shards,
                                           beam.pvalue.AsList(written)))
