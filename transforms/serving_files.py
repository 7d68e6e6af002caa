"""The sink of a segment's serving form (ritrag/serving_form.py): one serving
file per shard, written once the shard's tables are. A shard's serving file is
made of its chunks, postings, vocabulary and edges files, of the segment's
node ids, and of the segment's edges whose target the shard owns (grouped
here by target shard: they come from every edges shard). So the stage waits
for every table written (a side input of their writes is complete only when
all are), then writes the shards in parallel, one per worker: memory and time
per worker follow one shard, and no launcher reads the whole segment."""
from __future__ import annotations

import apache_beam as beam
import pyarrow as pa

from ritrag.ids import shard_of
from ritrag.schema import EDGES_SCHEMA
from ritrag.serving_form import LINK_COLUMNS, segment_node_ids, write_shard_serving_form

_LINKS_SCHEMA = pa.schema([EDGES_SCHEMA.field(name) for name in LINK_COLUMNS])


def _in_link(edge: dict, num_shards: int) -> tuple[int, tuple[str, str]]:
    """An edges row -> (the shard that owns its target, (source, target))."""
    return shard_of(edge["target_node_id"], num_shards), (edge["source_node_id"], edge["target_node_id"])


def _write_shard(shard_links: tuple[int, dict], segment_dir: str, num_shards: int, tables_written: list) -> str:
    del tables_written  # waited for: the shard's tables and every node file exist now
    shard, grouped = shard_links
    pairs = list(grouped["in_links"])
    in_links = pa.table([pa.array([p[i] for p in pairs], pa.string()) for i in range(2)], schema=_LINKS_SCHEMA)
    return write_shard_serving_form(segment_dir, shard, num_shards, segment_node_ids(segment_dir, num_shards),
                                    in_links)


class WriteServingForm(beam.PTransform):
    """{"edges": the segment's edges rows, "written": the writes of its
    tables, flattened ((kind, rows) per shard file, as the table sinks output
    them)} -> the path of each shard's serving file."""

    def __init__(self, segment_dir: str, num_shards: int):
        super().__init__()
        self._segment_dir, self._num_shards = segment_dir, num_shards

    def expand(self, parts):  # {name: PCollection}: no annotation, which Beam would warn of
        num_shards, written = self._num_shards, parts["written"]
        shards = written.pipeline | "Shards" >> beam.Create([(shard, None) for shard in range(num_shards)])
        in_links = parts["edges"] | "InLinks" >> beam.Map(_in_link, num_shards)
        return ({"shard": shards, "in_links": in_links}
                | "ByTargetShard" >> beam.CoGroupByKey()
                | "OnePerWorker" >> beam.Reshuffle()
                | "WriteShard" >> beam.Map(_write_shard, self._segment_dir, num_shards,
                                           beam.pvalue.AsList(written)))
