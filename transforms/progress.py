"""Progress lines for people watching a long job: counts, rates and an ETA.

`LogProgress` is a pass-through step placed after a stage. Each worker process
logs its own count (and its resident memory) every `every_s` seconds while it
processes the stage, with the rate over that interval beside the overall one;
where the stage's total is known (pages, counted when the input is matched; a
crawl round's URLs) the line carries a share and an ETA at the current rate.
`CountSectionsCapped`, another pass-through, counts what the parsers' section
cap merged (`sections_capped`), once per page parsed: an update parses a
changed page twice, so the parser itself cannot count it.
"""
from __future__ import annotations

import logging
import os
import threading
import time

import apache_beam as beam

from ritrag.schema import ParsedPage
from ritrag.transforms.counts import COUNTS, CountingDoFn, record_counts
from ritrag.transforms.pages import COUNTERS

LOG = logging.getLogger("ritrag.progress")
SECTIONS_CAPPED_COUNTER = "sections_capped"  # sections past MAX_PAGE_SECTIONS, merged into their parents


def progress_line(stage: str, done: int, elapsed_s: float, total: int | None,
                  rss_bytes: int | None = None, interval: tuple[int, float] | None = None) -> str:
    """The line for a stage that has seen `done` elements in `elapsed_s`;
    `interval` (elements, seconds) since the previous line gives the rate now,
    which also drives the ETA (a stage's early elements can be much slower or
    faster than its later ones)."""
    overall = done / elapsed_s if elapsed_s > 0 else 0.0
    line = f"{stage}: {done:,} in {elapsed_s:,.0f} s"
    rate = overall
    if interval is not None and 0 < interval[1] < elapsed_s:
        rate = interval[0] / interval[1]
        line += f", {format_rate(rate)}/s over the last {interval[1]:,.0f} s ({format_rate(overall)}/s overall)"
    else:
        line += f" ({format_rate(overall)}/s)"
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


def format_rate(per_s: float) -> str:
    """A rate with the digits that say something: 1,234 / 12.3 / 0.018."""
    if per_s >= 100:
        return f"{per_s:,.0f}"
    if per_s >= 1 or per_s == 0:
        return f"{per_s:.1f}"
    return f"{per_s:.2g}"


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


class ProgressMeter:
    """One worker's count for a stage, and its lines: each gives the count,
    the rate since the previous line and overall, the share and ETA where the
    total is known, and the worker's memory."""

    def __init__(self, stage: str, total: int | None):
        self.stage, self.total = stage, total
        self.done = 0
        self.started: float | None = None
        self._line_done, self._line_at = 0, 0.0

    def add(self, now: float, n: int = 1) -> None:
        if self.started is None:
            self.started = self._line_at = now
        self.done += n

    def line(self, now: float) -> str | None:
        """The line at `now` (None before the first element); the next
        line's interval starts here."""
        if self.started is None:
            return None
        interval = (self.done - self._line_done, now - self._line_at)
        self._line_done, self._line_at = self.done, now
        return progress_line(self.stage, self.done, now - self.started, self.total, resident_bytes(), interval)


class _ProgressFn(beam.DoFn):
    """Counts elements as they pass; a thread logs the meter's line every
    `every_s` while a bundle is being processed, so a slow stage (a few large
    elements, or a stage waiting on its model) still says where it is."""

    def __init__(self, stage: str, total: int | None, every_s: float):
        self._stage, self._total, self._every_s = stage, total, every_s

    def setup(self):
        self._meter = ProgressMeter(self._stage, self._total)
        self._in_bundle = False
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, name=f"progress {self._stage}", daemon=True)
        self._ticker.start()

    def _tick(self) -> None:
        while not self._stop.wait(self._every_s):
            if self._in_bundle:
                line = self._meter.line(time.monotonic())
                if line:
                    LOG.info(line)

    def start_bundle(self):
        self._in_bundle = True

    def process(self, element):
        self._meter.add(time.monotonic())
        yield element

    def finish_bundle(self):
        self._in_bundle = False

    def teardown(self):
        self._stop.set()
        line = self._meter.line(time.monotonic())
        if line:
            LOG.info(line)


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
