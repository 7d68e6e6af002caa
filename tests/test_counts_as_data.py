"""Counts that a manifest records or a later step reads are data, not runner
metrics (transforms/counts.py): a bundle that fails and is retried counts once,
and a runner that reports no metrics (Beam's DaskRunner) still gives exact
counts. Beam's BundleBasedDirectRunner retries a failed bundle, and commits
the metrics of its failed attempts as well: the counters that a retry doubles."""
from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import apache_beam as beam
import pyarrow.parquet as pq
import pytest
from apache_beam.metrics.metric import MetricsFilter

from crawl_site import CrawlSite
from ritrag.crawl_dir import CRAWLDB_FILE
from ritrag.layout import COUNTS_FILE, IndexLayout
from ritrag.pipelines import build, crawl
from ritrag.transforms.counts import (COUNTS, CountElements, CountingDoFn, WriteCounts, read_counts,
                                      record_counts)
from ritrag.transforms.crawl.round import StoreShardFn
from ritrag.transforms.pages import ParsePagesFn
from support import SAMPLE, build_index

RETRYING_RUNNER = "BundleBasedDirectRunner"  # in-process; retries a failed bundle up to 4 times


def fail_first_attempt(monkeypatch, fn_class: type, flag: Path) -> None:
    """`fn_class.process` raises once, the first time, after it has counted
    its element and made its outputs: that bundle fails and is retried."""
    original = fn_class.process

    def process(self, *args, **kwargs):
        outputs = list(original(self, *args, **kwargs))
        if not flag.exists():
            flag.touch()
            raise RuntimeError("injected failure of a bundle's first attempt")
        yield from outputs

    monkeypatch.setattr(fn_class, "process", process)


class CountWordsFn(CountingDoFn):
    """Counts each word it passes and every element; the first attempt of the
    bundle holding "fail" raises after counting."""

    def __init__(self, flag: str):
        super().__init__("test")
        self._flag = flag

    def process(self, word: str):
        self.count("words")
        self.count(f"letters_{len(word)}", len(word))
        if word == "fail" and not Path(self._flag).exists():
            Path(self._flag).touch()
            raise RuntimeError("injected failure of a bundle's first attempt")
        yield word


def test_a_retried_bundle_is_counted_once(tmp_path):
    words = ["alpha", "fail", "beta", "gamma"]
    flag = tmp_path / "failed_once"
    p = beam.Pipeline(runner=RETRYING_RUNNER)
    counted = record_counts(p | beam.Create(words)
                            | "CountWords" >> beam.ParDo(CountWordsFn(str(flag))).with_outputs(COUNTS, main="words"))
    counted.words | "CountKept" >> CountElements("kept")
    p | "WriteCounts" >> WriteCounts(str(tmp_path))
    result = p.run()
    result.wait_until_finish()

    assert flag.exists()  # the bundle failed once and was retried
    expected = {"words": 4, "kept": 4, "letters_5": 10, "letters_4": 8}
    assert json.loads((tmp_path / COUNTS_FILE).read_text()) == expected
    # The premise: the runner's own counter counts the failed attempt as well.
    metric = result.metrics().query(MetricsFilter().with_namespace("test").with_name("words"))["counters"]
    assert sum(c.committed for c in metric) > 4


def test_counts_recorded_after_write_counts_are_refused(tmp_path):
    p = beam.Pipeline()
    p | "WriteCounts" >> WriteCounts(str(tmp_path))
    with pytest.raises(RuntimeError, match="after the pipeline's WriteCounts"):
        p | beam.Create([1]) | CountElements("late")


def test_expected_counts_are_present_when_never_counted(tmp_path):
    (tmp_path / COUNTS_FILE).write_text(json.dumps({"pages_read": 3}))
    assert read_counts(str(tmp_path), ("pages_read", "edges")) == {"pages_read": 3, "edges": 0}


def write_site(root: Path) -> Path:
    site = root / "site"
    for i in range(6):
        (site / "docs").mkdir(parents=True, exist_ok=True)
        (site / "docs" / f"p{i}.html").write_text(
            f"<html><head><title>Page {i}</title></head><body><h1>Page {i}</h1>"
            f"<p>Words of page {i}. <a href='p{(i + 1) % 6}.html'>next</a></p></body></html>")
    return site


def manifest_counts(index: Path) -> tuple[dict, dict]:
    manifest = IndexLayout(str(index)).load_manifest()
    segment = manifest.segments[0]
    return manifest.stats["pages"], segment["counts"]


def test_a_build_whose_parse_bundle_is_retried_records_exact_counts(tmp_path, monkeypatch):
    site = write_site(tmp_path)
    build_index(site, tmp_path / "reference", "--embedding_model", "hashing:64")
    flag = tmp_path / "failed_once"
    fail_first_attempt(monkeypatch, ParsePagesFn, flag)
    build_index(site, tmp_path / "index", "--embedding_model", "hashing:64", "--runner", RETRYING_RUNNER)

    assert flag.exists()
    pages, segment_counts = manifest_counts(tmp_path / "index")
    assert pages == segment_counts == manifest_counts(tmp_path / "reference")[0]
    assert pages["pages_read"] == pages["pages_parsed"] == pages["pages_indexed"] == 6
    assert pages["edges"] == 6 and pages["links_unresolved"] == 0
    assert pages["chunks_embedded"] == pages["chunks_embedded_hashing"] > 0


def test_a_build_on_a_runner_without_metrics_records_exact_counts(tmp_path, monkeypatch):
    """Beam's DaskRunner answers metrics() with NotImplementedError."""
    run_pipeline = build.run_pipeline

    def without_metrics(*args, **kwargs):
        result = run_pipeline(*args, **kwargs)

        def metrics():
            raise NotImplementedError("collecting metrics will come later!")

        result.metrics = metrics
        return result

    monkeypatch.setattr(build, "run_pipeline", without_metrics)
    site = write_site(tmp_path)
    build_index(site, tmp_path / "index", "--embedding_model", "hashing:64")
    pages, _ = manifest_counts(tmp_path / "index")
    assert pages["pages_read"] == pages["pages_indexed"] == 6 and pages["edges"] == 6


def test_a_crawl_whose_store_bundle_is_retried_returns_exact_row_counts(tmp_path, monkeypatch):
    root = tmp_path / "served"
    shutil.copytree(SAMPLE / "sphinx", root / "sphinx")
    flag = tmp_path / "failed_once"
    fail_first_attempt(monkeypatch, StoreShardFn, flag)
    with CrawlSite(root, flaky="sphinx/faq.html", busy="sphinx/glossary.html",
                   redirect_target="sphinx/support.html", huge_bytes=400_000) as site:
        counts = crawl.run(["--seed", site.base, "--out", str(tmp_path / "crawl"), "--per_host_delay_s", "0",
                            "--timeout_s", "2", "--retries", "0", "--warc_shards", "2", "--runner", RETRYING_RUNNER])

    assert flag.exists()
    rows = pq.read_table(tmp_path / "crawl" / CRAWLDB_FILE).to_pylist()
    assert counts == dict(Counter(f"{r['kind']}_{r['status']}" for r in rows))
    assert counts["page_fetched"] > 0
