"""Jobs that read and publish on object storage, against real protocol peers on
127.0.0.1: moto's S3 server and GCS emulators (tests/fleet_fixtures.py). The
jobs, the index commands, the lease and the server reach the bucket through
one storage layer (ritrag.storage, over fsspec), configured from the jobs' and
commands' own options; the pipelines' sources and sinks through Beam's file
systems. A sequence on a bucket answers as the same sequence on local disk,
and the lease is exclusive through the stores' preconditions."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from fleet_fixtures import object_store  # noqa: F401  (the fixture)
import ritrag.lease
from ritrag import cli
from ritrag.layout import IndexLayout
from ritrag.storage import READ_AHEAD, exists, list_dirs, open_read, use_pipeline_options, write_atomic
from ritrag.lease import IndexLease, IndexLockedError
from ritrag.pipelines import build, compact, update
from ritrag.pipelines.launcher import job_options
from ritrag.serving.api import RitragIndex
from support import BASE, assert_same_toc, write_tiny_site
from test_update import QUERIES, make_snapshot_b

HASHING = ("--embedding_model", "hashing:384")


def answers(index: str, cache_dir: Path) -> dict[str, list]:
    loaded = RitragIndex(index, cache_dir=str(cache_dir))
    return {q: loaded.get_toc(q)["trees"] for q in QUERIES}


def assert_same_answers(actual: dict[str, list], expected: dict[str, list]) -> None:
    for query in QUERIES:
        assert_same_toc(actual[query], expected[query])


@pytest.fixture(scope="module")
def on_local_disk(tmp_path_factory) -> dict:
    """Snapshots A and B, and the answers of build(A), update(B), compact on local disk."""
    root = tmp_path_factory.mktemp("local")
    a, b, index = write_tiny_site(root / "a"), make_snapshot_b(root / "b"), root / "index"
    common = ["--base_url", BASE + "/", "--site_depth", "1", *HASHING]
    build.run(["--input", str(a), "--out", str(index), *common])
    built = answers(str(index), root / "cache")
    update.run(["--input", str(b), "--index", str(index)])
    updated = answers(str(index), root / "cache")
    compact.run(["--index", str(index)])
    return {"a": a, "b": b, "built": built, "updated": updated, "compacted": answers(str(index), root / "cache")}


def run_cli(*argv: str) -> None:
    assert cli.main(list(argv)) == 0, argv


@pytest.mark.slow
@pytest.mark.parametrize("object_store", ["s3", "gcs"], indirect=True)
def test_build_serve_update_compact_on_a_bucket_answer_as_on_local_disk(object_store, on_local_disk, tmp_path,
                                                                        capsys):
    index, flags = f"{object_store.url}/index", object_store.flags
    # docs/FLEET.md's publishing step: a build with --out BUCKET/index
    run_cli("build", str(on_local_disk["a"]), "--out", index, "--base_url", BASE + "/", "--site_depth", "1",
            *HASHING, *flags)
    assert_same_answers(answers(index, tmp_path / "cache"), on_local_disk["built"])
    run_cli("update", str(on_local_disk["b"]), "--index", index, *flags)
    assert_same_answers(answers(index, tmp_path / "cache"), on_local_disk["updated"])
    run_cli("compact", index, *flags)
    assert_same_answers(answers(index, tmp_path / "cache"), on_local_disk["compacted"])

    capsys.readouterr()
    run_cli("versions", index, *flags)
    listed = [line.lstrip("* ").split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == ["v000001", "v000002", "v000003"]
    run_cli("inspect", index, "--html", str(tmp_path / "report.html"), *flags)
    assert "v000003" in (tmp_path / "report.html").read_text()
    run_cli("rollback", index, "v000001", *flags)
    assert IndexLayout(index).current_version() == "v000001"
    # the newest and the live version stay; the update's manifest and delta segment go
    run_cli("prune", index, "--keep", "1", *flags)
    layout = IndexLayout(index)
    assert layout.versions() == ["v000001", "v000003"]
    assert list_dirs(f"{index}/segments") == ["seg-v000001", "seg-v000003"]
    assert not exists(f"{index}/LEASE")  # every command gave its lease back


@pytest.mark.parametrize("object_store", ["s3", "gcs"], indirect=True)
def test_an_index_on_a_bucket_is_reached_with_the_options_given(object_store):
    """The issue's failure: the lease was read through the store before it
    had the job's options ('Must provide one of client or options')."""
    use_pipeline_options(PipelineOptions(object_store.flags))
    layout = IndexLayout(f"{object_store.url}/index")
    assert layout.current_version() is None
    with IndexLease(layout, "test") as lease:
        assert lease.holder()["token"] == lease.record["token"]
    assert lease.holder() is None


@pytest.mark.parametrize("object_store", ["s3", "gcs"], indirect=True)
def test_a_remote_file_is_read_through_a_bounded_read_ahead(object_store):
    """A Parquet reader seeks from column to column: each read of a remote
    file fetches what it asks and at most READ_AHEAD more, on every store,
    through fsspec's read-ahead cache (gcsfs's own default prefetches up to
    128 MiB in background tasks)."""
    use_pipeline_options(PipelineOptions(object_store.flags))
    data = bytes(range(256)) * (12 * READ_AHEAD // 256)
    write_atomic(f"{object_store.url}/big", data)
    with open_read(f"{object_store.url}/big") as remote:
        for start in (0, 1024, 2048, 3072, 5 * READ_AHEAD):  # a sequential streak, then a seek
            remote.seek(start)
            assert remote.read(1024) == data[start:start + 1024]
        assert remote.cache.name == "readahead" and remote.cache.blocksize == READ_AHEAD
        assert remote.cache.total_requested_bytes <= 2 * (1024 + READ_AHEAD)  # the streak's one fetch, the seek's


@pytest.mark.parametrize("object_store", ["s3"], indirect=True)
def test_beams_s3_calls_share_one_botocore_client_per_set_of_options(object_store):
    """Beam builds a boto3 client for every S3 call (0.2 s of CPU each); the
    process keeps one per set of options, each call keeping its own stream state."""
    from apache_beam.io.aws import s3io
    from apache_beam.io.filesystems import FileSystems

    options = job_options(object_store.flags, build.FLAGS)
    first, second = s3io.S3IO(options=options), s3io.S3IO(options=options)
    assert first.client is not second.client and first.client.client is second.client.client
    other = s3io.S3IO(options=PipelineOptions([*object_store.flags, "--s3_region_name", "eu-west-3"]))
    assert other.client.client is not first.client.client
    with FileSystems.create(f"{object_store.url}/probe") as out:
        out.write(b"written through the shared client")
    with FileSystems.open(f"{object_store.url}/probe") as back:
        assert back.read() == b"written through the shared client"


@pytest.mark.parametrize("object_store", ["s3"], indirect=True)
def test_a_worker_reaches_the_bucket_with_the_options_beam_hands_it(object_store):
    """A remote runner's worker never runs the job's use_pipeline_options, yet
    its DoFns read the live index through the storage layer: Beam's SDK harness
    gives the job's options to Beam's file systems, and the layer takes them
    from there (here the endpoint: no fsspec variable names it)."""
    use_pipeline_options(PipelineOptions(object_store.flags))
    write_atomic(f"{object_store.url}/probe", b"written by the job")
    worker = ("import sys\n"
              "from apache_beam.io.filesystems import FileSystems\n"
              "from apache_beam.options.pipeline_options import PipelineOptions\n"
              "from ritrag.storage import open_read\n"
              "FileSystems.set_options(PipelineOptions(sys.argv[2:]))  # what the SDK harness does\n"
              "sys.stdout.write(open_read(sys.argv[1]).read().decode())\n")
    env = {name: value for name, value in os.environ.items() if not name.startswith("FSSPEC_")}
    ran = subprocess.run([sys.executable, "-c", worker, f"{object_store.url}/probe", *object_store.flags],
                         capture_output=True, text=True, env=env, timeout=120)
    assert ran.stdout == "written by the job", ran.stderr[-2000:]


def race_for_the_lease(layout: IndexLayout, contenders: int) -> list[IndexLease]:
    """`contenders` jobs take the lease at once, each past its check that LEASE
    is absent before any of them writes it (the window a check-then-write
    loses); returns the ones that got it."""
    barrier, seen = threading.Barrier(contenders), threading.local()
    check = ritrag.lease.exists

    def exists_then_wait(path):
        found = check(path)
        if path.endswith("/LEASE") and not getattr(seen, "lease", False):
            seen.lease = True
            barrier.wait(timeout=60)
        return found

    holders, errors = [], []

    def job(number: int) -> None:
        lease = IndexLease(layout, f"job{number}")
        try:
            lease.acquire()
            holders.append(lease)
        except IndexLockedError:
            pass
        except Exception as exc:  # noqa: BLE001  (reported by the test)
            errors.append(exc)

    threads = [threading.Thread(target=job, args=(n,)) for n in range(contenders)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ritrag.lease, "exists", exists_then_wait)
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    assert not errors
    return holders


@pytest.mark.parametrize("object_store", ["s3", "gcs-preconditions"], indirect=True)
def test_jobs_racing_on_one_bucket_prefix_leave_one_lease_holder(object_store):
    use_pipeline_options(PipelineOptions(object_store.flags))
    layout = IndexLayout(f"{object_store.url}/index")
    holders = race_for_the_lease(layout, 6)
    assert len(holders) == 1
    (winner,) = holders
    assert winner.holder()["token"] == winner.record["token"]
    winner.claim_segment("seg-v000001")
    assert winner.holder()["segment"] == "seg-v000001"
    winner.release()
    assert winner.holder() is None


@pytest.mark.parametrize("object_store", ["s3", "gcs-preconditions"], indirect=True)
def test_a_job_whose_lease_was_broken_neither_rewrites_nor_deletes_it(object_store):
    use_pipeline_options(PipelineOptions(object_store.flags))
    layout = IndexLayout(f"{object_store.url}/index")
    first = IndexLease(layout, "update")
    first.acquire()
    second = IndexLease(layout, "build", break_lock=True)
    second.acquire()  # --break_lock: the first job was taken for gone
    with pytest.raises(IndexLockedError, match="taken over"):
        first.claim_segment("seg-v000002")
    first.release()
    assert first.holder()["token"] == second.record["token"]
    second.claim_segment("seg-v000002")
    second.release()
    assert second.holder() is None


@pytest.mark.parametrize("object_store", ["gcs"], indirect=True)
def test_a_segment_left_on_a_bucket_by_a_crashed_job_is_removed_before_the_next_one(object_store, tmp_path):
    """A prefix is no object: the debris check looked for one and never found it,
    so a crashed job's files ended up in the next version's manifest."""
    index = f"{object_store.url}/index"
    use_pipeline_options(PipelineOptions(object_store.flags))
    write_atomic(f"{index}/segments/seg-v000001/left-by-a-crash.bin", b"debris")
    build.run(["--input", str(write_tiny_site(tmp_path / "site")), "--out", index, "--base_url", BASE + "/",
               *HASHING, *object_store.flags])
    (segment,) = IndexLayout(index).load_manifest().segments
    assert "left-by-a-crash.bin" not in segment["files"]
    assert not exists(f"{index}/segments/seg-v000001/left-by-a-crash.bin")


@pytest.mark.slow
@pytest.mark.parametrize("object_store", ["s3", "gcs"], indirect=True)
def test_a_crawl_and_refresh_cycle_keeps_its_crawl_directory_in_the_bucket(object_store, tmp_path):
    """The scheduled loop with no shared disk: the CrawlDB, the WARC files and
    the rounds' working files in the bucket; the refresh builds the index there,
    a second refresh re-crawls conditionally (304s) and updates, and the index
    answers like the same loop on local disk."""
    from crawl_site import CrawlSite
    from ritrag.pipelines import refresh
    from ritrag.crawl_dir import read_crawldb
    from support import SAMPLE

    site_dir = tmp_path / "served"
    shutil.copytree(SAMPLE / "sphinx", site_dir / "sphinx")
    crawl = ["--per_host_delay_s", "0", "--timeout_s", "5", "--retries", "1", "--warc_shards", "2",
             "--site_depth", "1", *HASHING]
    bucket_crawl, bucket_index = f"{object_store.url}/crawl", f"{object_store.url}/index"
    with CrawlSite(site_dir, flaky="none", busy="none", redirect_target="sphinx/index.html", huge_bytes=10) as site:
        seed = ["--seed", site.base + "sphinx/index.html"]
        local = refresh.run([*seed, "--crawl_dir", str(tmp_path / "crawl"), "--index", str(tmp_path / "index"),
                             *crawl])
        first = refresh.run([*seed, "--crawl_dir", bucket_crawl, "--index", bucket_index, *crawl,
                             *object_store.flags])
        assert first["built"] and first["crawl"] == local["crawl"]
        assert_same_answers(answers(bucket_index, tmp_path / "cache"), answers(str(tmp_path / "index"),
                                                                              tmp_path / "local-cache"))
        site.log.clear()
        second = refresh.run([*seed, "--crawl_dir", bucket_crawl, "--index", bucket_index, *crawl,
                              *object_store.flags])
        pages = [r for r in site.log if r.path.startswith("/sphinx/")]
        assert not second["built"] and {r.path for r in pages if r.status == 304} == {
            "/" + p for p in site.page_paths()}
        assert {r.status for r in pages} == {304, 404}  # links to nothing are asked again, on their schedule
    assert list_dirs(bucket_crawl) == ["warc"]  # the rounds' working files are gone
    assert {r["status"] for r in read_crawldb(bucket_crawl) if r["kind"] == "page"} <= {
        "unchanged", "gone", "redirect", "skipped_type", "too_large", "disallowed", "fetch_error"}
    assert IndexLayout(bucket_index).current_version() == second["version"]
