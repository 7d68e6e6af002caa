"""Progress lines for people watching a long job: counts, rates and an ETA.

`LogProgress` is a pass-through step placed after a stage. Each worker process
logs its own count (and its resident memory) at most every `every_s` seconds; where the stage's total is
known (pages, counted when the input is matched) the line carries an ETA.
`CountSectionsCapped`, another pass-through, counts what the parsers' section
cap merged (`sections_capped`), once per page parsed: an update parses a
changed page twice, so the parser itself cannot count it.
"""
from __future__ import annotations

import logging
import os
import time

import apache_beam as beam

from ritrag.schema import ParsedPage
from ritrag.transforms.counts import COUNTS, CountingDoFn, record_counts
from ritrag.transforms.pages import COUNTERS

LOG = logging.getLogger("ritrag.progress")
SECTIONS_CAPPED_COUNTER = "sections_capped"  # sections past MAX_PAGE_SECTIONS, merged into their parents


def progress_line(stage: str, done: int, elapsed_s: float, total: int | None,
                  rss_bytes: int | None = None) -> str:
    rate = done / elapsed_s if elapsed_s > 0 else 0.0
    line = f"{stage}: {done:,} in {elapsed_s:,.0f} s ({rate:,.1f}/s)"
    # The total counts input files; a Posts.xml, a Discourse topic or a WARC file
    # holds many pages, so past it the count says so instead of passing 100%.
    if total and done <= total:
        left = total - done
        eta = left / rate if rate > 0 else float("inf")
        line += f", {100.0 * done / total:.1f}% of {total:,}, ETA {format_duration(eta)}"
    elif total:
        line += f", more than the {total:,} input files (some hold several pages)"
    if rss_bytes:
        line += f", worker RSS {rss_bytes / 2 ** 30:.2f} GiB"
    return line


def resident_bytes() -> int | None:
    """This process's resident memory, where /proc tells (Linux); else None."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def format_duration(seconds: float) -> str:
    if seconds == float("inf"):
        return "unknown"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


class _ProgressFn(beam.DoFn):
    def __init__(self, stage: str, total: int | None, every_s: float):
        self._stage, self._total, self._every_s = stage, total, every_s

    def setup(self):
        self._done = 0
        self._started = self._last = None

    def process(self, element):
        now = time.monotonic()
        if self._started is None:
            self._started = self._last = now
        self._done += 1
        if now - self._last >= self._every_s:
            self._last = now
            LOG.info(progress_line(self._stage, self._done, now - self._started, self._total, resident_bytes()))
        yield element

    def teardown(self):
        if self._started is not None:
            LOG.info(progress_line(self._stage, self._done, time.monotonic() - self._started, self._total,
                                   resident_bytes()))


class LogProgress(beam.PTransform):
    """Pass elements through unchanged, logging how many went by and how fast."""

    def __init__(self, stage: str, total: int | None = None, every_s: float = 30.0):
        super().__init__()
        self._stage, self._total, self._every_s = stage, total, every_s

    def expand(self, pcoll):
        return pcoll | beam.ParDo(_ProgressFn(self._stage, self._total, self._every_s))


class _CountSectionsCappedFn(CountingDoFn):
    def __init__(self):
        super().__init__(COUNTERS)

    def process(self, page: ParsedPage):
        if page.sections_past_cap:
            self.count(SECTIONS_CAPPED_COUNTER, page.sections_past_cap)
        yield page


class CountSectionsCapped(beam.PTransform):
    """Pass parsed pages through unchanged, counting (as data: transforms/counts.py)
    their sections merged past the cap."""

    def expand(self, pages):
        return record_counts(pages | beam.ParDo(_CountSectionsCappedFn()).with_outputs(COUNTS, main="pages")).pages
