"""Counts that a manifest records or a later step reads, computed as data.

Beam metrics are for watching a job, not for its results: runners differ in
what they report (committed values, or only attempted ones, which count a
retried bundle twice; Beam's DirectRunner commits a retried bundle's failed
attempts too; the DaskRunner reports none). So a count that a manifest
records, that the page accounting compares or that the crawl returns is
counted by a `CountingDoFn`: each `count(name, n)` increments its Beam
counter (progress and monitoring) and adds to the bundle's tally, which
`finish_bundle` emits as (name, n) elements on the COUNTS output. A retried
bundle's outputs are discarded with it, so these elements count each input
exactly once.

A transform that applies such a DoFn passes its outputs to `record_counts`
(or counts a PCollection's elements with `CountElements`); the job's last
step, `WriteCounts`, sums every count recorded in its pipeline into one small
JSON object (COUNTS_FILE) in the directory it writes, which the launcher reads
back with `read_counts`. Recording is per pipeline, so the stages keep their
outputs and the jobs need not thread a counts collection through them.
Counts are emitted in the global window: every job here is a batch job.
"""
from __future__ import annotations

import collections
import json
import os
import weakref
from typing import Iterable, Iterator

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from ritrag.layout import COUNTS_FILE
from ritrag.storage import open_read
from ritrag.transforms.tables import write_bytes

COUNTS = "counts"  # the tagged output of (counter name, n) elements

# Per pipeline under construction: the PCollections of (name, n) recorded so
# far (weak references: the pipeline holds them, and a pipeline that never
# writes its counts must not be kept alive by them), and whether WriteCounts
# has summed them (a count recorded after it would be lost, so it is refused).
_RECORDED: "weakref.WeakKeyDictionary[beam.Pipeline, list[weakref.ref]]" = weakref.WeakKeyDictionary()
_WRITTEN: "weakref.WeakSet[beam.Pipeline]" = weakref.WeakSet()


class CountingDoFn(beam.DoFn):
    """A DoFn whose counts are data: `count` increments the Beam counter of
    `namespace` and the bundle's tally, emitted on COUNTS when the bundle ends.
    Apply it `.with_outputs(COUNTS, ...)` and pass the result to `record_counts`."""

    def __init__(self, namespace: str):
        super().__init__()
        self._namespace = namespace
        self._metrics: dict[str, beam.metrics.metricbase.Counter] = {}
        self._tally: collections.Counter = collections.Counter()

    def count(self, name: str, n: int = 1) -> None:
        if name not in self._metrics:
            self._metrics[name] = beam.metrics.Metrics.counter(self._namespace, name)
        self._metrics[name].inc(n)
        self._tally[name] += n

    def start_bundle(self) -> None:
        self._tally = collections.Counter()  # nothing of a failed bundle carries over

    def finish_bundle(self) -> Iterator[beam.pvalue.TaggedOutput]:
        tally, self._tally = self._tally, collections.Counter()
        for name, n in sorted(tally.items()):
            yield beam.pvalue.TaggedOutput(COUNTS, WindowedValue((name, n), MIN_TIMESTAMP, (GlobalWindow(),)))


def record_counts(outputs: beam.pvalue.DoOutputsTuple) -> beam.pvalue.DoOutputsTuple:
    """Record the COUNTS output of a CountingDoFn's ParDo for its pipeline's
    WriteCounts; returns `outputs`."""
    _record(outputs[COUNTS])
    return outputs


def _record(counts: beam.PCollection) -> None:
    if counts.pipeline in _WRITTEN:
        raise RuntimeError(f"{counts.producer.full_label}: counts recorded after the pipeline's WriteCounts")
    _RECORDED.setdefault(counts.pipeline, []).append(weakref.ref(counts))


class CountElements(beam.PTransform):
    """Record the number of elements of a PCollection as the count `name`;
    returns the PCollection, unchanged."""

    def __init__(self, name: str):
        super().__init__()
        self._name = name

    def expand(self, pcoll):
        name = self._name
        _record(pcoll
                | "Count" >> beam.combiners.Count.Globally()
                | "Named" >> beam.Map(lambda n: (name, n)))
        return pcoll


class WriteCounts(beam.PTransform):
    """pbegin -> every count recorded in the pipeline, summed by name and
    written as one JSON object to `directory`/COUNTS_FILE. Applied once, after
    every stage that records counts."""

    def __init__(self, directory: str):
        super().__init__()
        self._directory = directory

    def expand(self, pbegin):
        p = pbegin.pipeline
        _WRITTEN.add(p)
        parts = [ref() for ref in _RECORDED.pop(p, [])] or [p | "NoCounts" >> beam.Create([])]
        path = os.path.join(self._directory, COUNTS_FILE)
        return (tuple(parts)
                | "AllCounts" >> beam.Flatten()
                | "Sum" >> beam.CombinePerKey(sum)
                | "ToDict" >> beam.combiners.ToDict()
                | "Write" >> beam.Map(lambda counts: write_bytes(
                    path, json.dumps(counts, sort_keys=True, indent=1).encode())))


def read_counts(directory: str, expected: Iterable[str] = ()) -> dict[str, int]:
    """The counts WriteCounts wrote in `directory`; `expected` ones are present even if never counted."""
    with open_read(os.path.join(directory, COUNTS_FILE)) as fh:
        return {**dict.fromkeys(expected, 0), **json.load(fh)}
