"""The metadata cache: one JSON object a line, `{"key", "model",
"prompt_version", "summary", "keywords", "tokens_in", "tokens_out"}`, keyed by
`metadata_key` (the model, the prompt version and the node's own text), in
files `records-<job>-<random>-00000-of-00001.jsonl` under the cache folder (by default
`<index>/metadata_cache/`; any local path or object-store prefix). Each job
adds its own files and never rewrites another's, so a job that fails leaves
the cache as it was plus whatever it wrote completely; a key found twice is
the same question, and either answer serves. A line that does not read back
as a valid record is passed over and counted, never trusted.
"""
from __future__ import annotations

import json
import os
import secrets
from typing import Iterable

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.fileio import EmptyMatchTreatment

from ritrag.storage import write_atomic
from ritrag.transforms.counts import COUNTS, CountingDoFn, record_counts
from ritrag.transforms.metadata.base import PROMPT_VERSION, MetadataFailure, NodeMetadata, parse_answer

CACHE_DIR_NAME = "metadata_cache"  # inside the index directory, unless --metadata_cache names another
RECORDS_PATTERN = "records-*.jsonl"
BAD_RECORDS_COUNTER = "metadata_cache_bad_records"


def default_cache_dir(index_dir: str) -> str:
    return os.path.join(index_dir, CACHE_DIR_NAME)


def cache_record(key: str, model: str, metadata: NodeMetadata, tokens_in: int, tokens_out: int) -> str:
    return json.dumps({"key": key, "model": model, "prompt_version": PROMPT_VERSION, "summary": metadata.summary,
                       "keywords": list(metadata.keywords), "tokens_in": tokens_in, "tokens_out": tokens_out},
                      ensure_ascii=False, sort_keys=True)


def read_record(line: str) -> tuple[str, NodeMetadata]:
    """(key, metadata) of one cache line; MetadataFailure when it is not a valid record."""
    try:
        record = json.loads(line)
        key = record["key"]
        answer = json.dumps({"summary": record["summary"], "keywords": record["keywords"]})
    except (ValueError, KeyError, TypeError):
        raise MetadataFailure("not a cache record") from None
    if not isinstance(key, str) or not key:
        raise MetadataFailure("a cache record without a key")
    return key, parse_answer(answer)  # the answer's own checks, again


class ParseRecordsFn(CountingDoFn):
    def __init__(self):
        super().__init__("ritrag.metadata")

    def process(self, readable: fileio.ReadableFile) -> Iterable[tuple[str, NodeMetadata]]:
        with readable.open(compression_type=CompressionTypes.UNCOMPRESSED) as fh:
            for raw in fh:
                line = raw.decode("utf-8", "replace").strip()
                if not line:
                    continue
                try:
                    yield read_record(line)
                except MetadataFailure:
                    self.count(BAD_RECORDS_COUNTER)


class ReadMetadataCache(beam.PTransform):
    """pbegin -> (key, NodeMetadata) of every valid record in the cache folder
    (none when the folder does not exist yet)."""

    def __init__(self, cache_dir: str):
        super().__init__()
        self._pattern = os.path.join(cache_dir, RECORDS_PATTERN)

    def expand(self, pbegin):
        return record_counts(
            pbegin
            | "Match" >> fileio.MatchFiles(self._pattern, EmptyMatchTreatment.ALLOW)
            | "Open" >> fileio.ReadMatches()
            | "Parse" >> beam.ParDo(ParseRecordsFn()).with_outputs(COUNTS, main="records")).records


class WriteMetadataCache(beam.PTransform):
    """Cache lines -> this job's records files in the cache folder (nothing written when there are none)."""

    def __init__(self, cache_dir: str, job: str):
        super().__init__()
        # The random part: a job run again under the same name (a failed build's
        # segment id is reused) must not replace the records its first run wrote.
        self._prefix = os.path.join(cache_dir, f"records-{job}-{secrets.token_hex(4)}")

    def expand(self, lines):
        prefix = self._prefix
        return (lines
                | "OneList" >> beam.combiners.ToList()
                | "Write" >> beam.Map(_write_records, prefix))


def _write_records(lines: list[str], prefix: str) -> None:
    """All of a job's new records as one file, written whole (a failed
    attempt leaves no half file: `write_atomic`)."""
    if lines:
        write_atomic(f"{prefix}-00000-of-00001.jsonl", ("\n".join(sorted(lines)) + "\n").encode("utf-8"))
