"""Compaction: the live version's segments merged into one, dead rows dropped.

    python -m ritrag.pipelines.compact --index INDEX [runner options]

Every live row of the nodes, pages, chunks and edges tables is rewritten into one
new segment; postings and BM25 statistics are recomputed from the live chunks; the
dense shards are rebuilt from the stored vectors into the live trained index, so
nothing is re-parsed or re-embedded. The result is published as a new version
that answers exactly like the one it compacts.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import time
from typing import Iterable

import apache_beam as beam
import numpy as np

from ritrag.pipelines.launcher import (IndexOptions, PublishOptions, job_options, prepare_job,
                                       publish_and_prune, required, run_pipeline)
from ritrag.pipelines.options import JobFlags
from ritrag.layout import BM25_STATS_FILE, new_manifest
from ritrag.reader import IndexReader, LiveFile, read_trained_dense_index
from ritrag.storage import open_read
from ritrag.schema import TABLES
from ritrag.vectors import VectorShard
from ritrag.transforms.dense import TRAINED, VECTORS, ReadTrainedIndex
from ritrag.transforms.segment import SPARSE, WriteSegment
from ritrag.transforms.sparse import BuildSparseIndex
from ritrag.transforms.tables import ReadLiveRows

LOG = logging.getLogger("ritrag.compact")
FLAGS: JobFlags = {IndexOptions: None, PublishOptions: None}


def live_vectors(live_file: LiveFile) -> Iterable[tuple[int, np.ndarray]]:
    """(chunk id, float16 vector) of one vectors file, but for the dead chunks."""
    dead = live_file.dead
    for ids, vectors in VectorShard(live_file.path).batches():
        for chunk_id, vector in zip(ids.tolist(), vectors):
            if chunk_id not in dead:
                yield chunk_id, vector


def compact_pipeline(p: beam.Pipeline, live: IndexReader, segment_dir: str) -> None:
    """Stages compute the live rows, postings and statistics; sinks write them, one segment into `segment_dir`."""
    num_shards = live.manifest.settings.index.num_shards
    # Every table of the segment, rewritten from its live rows read as the build writes them.
    rows = {kind: p | f"Live{kind.title()}" >> ReadLiveRows(live, kind) for kind in TABLES}
    sparse = rows["chunks"] | "Sparse" >> BuildSparseIndex(live.manifest.settings.index.representation)
    vectors = (p
               | "VectorFiles" >> beam.Create(live.files("vectors"))
               | "LiveVectors" >> beam.FlatMap(live_vectors))
    trained = p | "LiveTrainedIndex" >> ReadTrainedIndex(functools.partial(read_trained_dense_index,
                                                                           live.trained_dense_source()))

    ({**rows, SPARSE: sparse, VECTORS: vectors, TRAINED: trained}
     | "WriteSegment" >> WriteSegment(segment_dir, num_shards))


def run(argv: list[str] | None = None) -> str:
    """Compact the live version; returns the published version name."""
    options = job_options(argv, FLAGS)
    opts = required(options, IndexOptions, "index")
    with prepare_job(options, opts.index, "compact") as (layout, segment_id, segment_dir):
        live = IndexReader(layout)
        live.share_dead_ids()  # with the stages that carry its files
        started = time.time()
        LOG.info("compacting %s (%d segments) into %s", live.manifest.version, len(live.manifest.segments),
                 segment_dir)
        run_pipeline(options, segment_dir, lambda p: compact_pipeline(p, live, segment_dir))
        with open_read(os.path.join(segment_dir, BM25_STATS_FILE)) as fh:
            bm25 = json.load(fh)
        segment = layout.describe_segment(segment_id, live.manifest.settings.index.num_shards, {})
        manifest = new_manifest(layout, segments=[segment],
                                stats={**live.manifest.stats, "bm25": bm25,
                                       "compact_seconds": round(time.time() - started, 1)},
                                config=live.manifest.config)
        published = publish_and_prune(layout, manifest, options)
        LOG.info("published %s in %.1f s", published, time.time() - started)
        return published


if __name__ == "__main__":
    # force: importing Beam has already configured the root logger (at WARNING)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", force=True)
    run()
