"""The model cache: one JSON object a line, `{"key", "model",
"prompt_version", "tokens_in", "tokens_out"}` and the checked answer's fields
(a node's `summary` and `keywords`; a PDF window's `headings`), keyed by the
model, the prompt version and the text asked about, in files
`records-<job>-<random>-00000-of-00001.jsonl` under the cache folder (by default
`<index>/metadata_cache/`; any local path or object-store prefix). Each job
adds its own files and never rewrites another's, so a job that fails leaves
the cache as it was plus whatever it wrote completely; a key found twice is
the same question, and either answer serves. A stage reads the records of its
own prompt version; a line that does not read back as a valid record (its
answer is checked again) is passed over and counted, never trusted.
"""
from __future__ import annotations

import json
import os
import secrets
from typing import Any, Callable, Iterable

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.fileio import EmptyMatchTreatment

from ritrag.storage import write_atomic
from ritrag.transforms.counts import COUNTS, CountingDoFn, record_counts
from ritrag.transforms.metadata.base import PROMPT_VERSION, Answer, MetadataFailure, NodeMetadata, parse_answer

CACHE_DIR_NAME = "metadata_cache"  # inside the index directory, unless --metadata_cache names another
RECORDS_PATTERN = "records-*.jsonl"
BAD_RECORDS_COUNTER = "metadata_cache_bad_records"
ENVELOPE = ("key", "model", "prompt_version", "tokens_in", "tokens_out")  # a record's fields besides its answer's
MISSES = "misses"  # the tagged output of the questions no cached answer serves


def default_cache_dir(index_dir: str) -> str:
    return os.path.join(index_dir, CACHE_DIR_NAME)


def answer_record(key: str, model: str, prompt_version: str, answer: dict[str, Any], tokens_in: int,
                  tokens_out: int) -> str:
    """The cache line of one checked answer (its fields as the model was asked to give them)."""
    return json.dumps({**answer, "key": key, "model": model, "prompt_version": prompt_version,
                       "tokens_in": tokens_in, "tokens_out": tokens_out}, ensure_ascii=False, sort_keys=True)


def cache_record(key: str, model: str, metadata: NodeMetadata, tokens_in: int, tokens_out: int) -> str:
    return answer_record(key, model, PROMPT_VERSION, {"summary": metadata.summary,
                                                      "keywords": list(metadata.keywords)}, tokens_in, tokens_out)


def read_record(line: str, prompt_version: str = PROMPT_VERSION,
                parse: Callable[[str], Answer] = parse_answer) -> tuple[str, Answer] | None:
    """(key, answer) of one cache line of `prompt_version`, None for another
    prompt's record; MetadataFailure when it is not a valid record."""
    try:
        record = json.loads(line)
        key = record["key"]
        if record.get("prompt_version") != prompt_version:
            return None
        answer = json.dumps({name: value for name, value in record.items() if name not in ENVELOPE})
    except (ValueError, KeyError, TypeError, AttributeError):
        raise MetadataFailure("not a cache record") from None
    if not isinstance(key, str) or not key:
        raise MetadataFailure("a cache record without a key")
    return key, parse(answer)  # the answer's own checks, again


class ParseRecordsFn(CountingDoFn):
    def __init__(self, prompt_version: str, parse: Callable[[str], Any]):
        super().__init__("ritrag.metadata")
        self._prompt_version, self._parse = prompt_version, parse

    def process(self, readable: fileio.ReadableFile) -> Iterable[tuple[str, Any]]:
        with readable.open(compression_type=CompressionTypes.UNCOMPRESSED) as fh:
            for raw in fh:
                line = raw.decode("utf-8", "replace").strip()
                if not line:
                    continue
                try:
                    record = read_record(line, self._prompt_version, self._parse)
                except MetadataFailure:
                    self.count(BAD_RECORDS_COUNTER)
                    continue
                if record is not None:
                    yield record


class SplitByCacheFn(CountingDoFn):
    """(key, {"asked": what asks that question, "cached": its cached answers})
    -> what `hits` makes of the askers a cached answer serves (main), or (key,
    the askers) on MISSES. A stage says what a hit gives (`hits`) and may count
    the askers of each question (`asking`)."""

    def process(self, joined: tuple[str, dict]) -> Iterable:
        key, group = joined
        asked = list(group["asked"])
        if not asked:
            return
        self.asking(asked)
        cached = next(iter(group["cached"]), None)
        if cached is None:
            yield beam.pvalue.TaggedOutput(MISSES, (key, asked))
            return
        yield from self.hits(key, asked, cached)

    def asking(self, asked: list) -> None:
        """Counts the askers of one question; nothing by default."""

    def hits(self, key: str, asked: list, cached: Any) -> Iterable:
        raise NotImplementedError


class ReadMetadataCache(beam.PTransform):
    """pbegin -> (key, answer) of every valid record of `prompt_version` in the
    cache folder, each answer checked by `parse` (none when the folder does not
    exist yet); by default the node metadata's."""

    def __init__(self, cache_dir: str, prompt_version: str = PROMPT_VERSION,
                 parse: Callable[[str], Any] = parse_answer):
        super().__init__()
        self._pattern = os.path.join(cache_dir, RECORDS_PATTERN)
        self._prompt_version, self._parse = prompt_version, parse

    def expand(self, pbegin):
        return record_counts(
            pbegin
            | "Match" >> fileio.MatchFiles(self._pattern, EmptyMatchTreatment.ALLOW)
            | "Open" >> fileio.ReadMatches()
            | "Parse" >> beam.ParDo(ParseRecordsFn(self._prompt_version, self._parse)).with_outputs(
                COUNTS, main="records")).records


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
