"""Incremental update: build(A) + update(B) must answer like build(B)."""
from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path

import pytest

from ritrag.pipelines import update
from ritrag.transforms import delta
from ritrag.transforms.delta import plan_page_update, replaced_rows
from ritrag.layout import IndexLayout
from ritrag.reader import IndexReader
from ritrag.representation import Representation
from ritrag.schema import NodePlacement
from support import (TINY_SITE, assert_same_toc, build_index, chunk_ref, live_table, node_row, node_skeleton,
                     tiny_page, write_tiny_site)

QUERIES = ["which port does version 3 listen on", "log rotation", "deploy containers replicas",
           "metrics endpoint prometheus", "TLS certificates"]


def make_snapshot_b(directory: Path) -> Path:
    """A with an edited page, a new page, a deleted page, a deleted parent (its
    children re-attach to a virtual node) and a page moved to another parent."""
    write_tiny_site(directory)
    title, trail, _ = TINY_SITE["shop/v3/logging.html"]
    (directory / "shop/v3/logging.html").write_text(tiny_page(
        title, trail, [("Rotation", "Logs rotate hourly; keep thirty files."),
                       ("Levels", "Set the log level with SHOP_LOG=debug.")]))
    (directory / "shop/v3/metrics.html").write_text(tiny_page(
        "Metrics", [("Shop Server", "shop/"), ("Version 3", "shop/v3/")],
        [("Endpoint", "Prometheus scrapes /metrics on the admin port.")]))
    (directory / "shop/v2/config.html").unlink()
    (directory / "shop/v3/index.html").unlink()
    title, _, sections = TINY_SITE["shop/v3/guide/deploy.html"]
    (directory / "shop/v3/guide/deploy.html").write_text(tiny_page(
        title, [("Shop Server", "shop/"), ("Version 2", "shop/v2/")], sections))
    return directory




@pytest.fixture(scope="module")
def snapshots(tmp_path_factory):
    root = tmp_path_factory.mktemp("update")
    a = write_tiny_site(root / "a")
    b = make_snapshot_b(root / "b")
    updated = root / "updated"
    build_index(a, updated)
    update.run(["--input", str(b), "--index", str(updated)])
    fresh = root / "fresh"
    build_index(b, fresh)
    return a, b, updated, fresh


@pytest.mark.slow
def test_update_matches_a_fresh_build(snapshots):
    _, _, updated, fresh = snapshots
    for kind in ("nodes", "chunks", "pages"):
        assert live_table(updated, kind) == live_table(fresh, kind), kind


@pytest.mark.slow
def test_inspect_after_an_update_counts_each_live_node_once(snapshots):
    from ritrag.evaluation.forest_report import forest_report

    _, _, updated, fresh = snapshots
    # The update replaced nodes (an edited page, a moved page): their old rows
    # stay in the first segment, tombstoned, and must not be counted again.
    assert IndexLayout(str(updated)).load_manifest().tombstones["node_id"] > 0
    counted = {site: (s["pages"], s["sections"], s["virtual"], dict(s["methods"]), dict(s["depths"]))
               for site, s in forest_report(str(updated))["sites"].items()}
    expected = {site: (s["pages"], s["sections"], s["virtual"], dict(s["methods"]), dict(s["depths"]))
                for site, s in forest_report(str(fresh))["sites"].items()}
    assert counted == expected


@pytest.mark.slow
def test_update_embeds_exactly_the_chunks_with_new_text(snapshots):
    a, _, updated, fresh = snapshots
    layout = IndexLayout(str(updated))
    first = layout.load_manifest("v000001")
    counts = layout.load_manifest().stats["pages"]
    old_texts = {c["text_hash"] for c in live_table_version(updated, first).values()}
    embeds = Representation.from_config(first.config).embeds  # node documents have no vectors by default
    new_texts = [c for c in live_table(fresh, "chunks").values()
                 if c["text_hash"] not in old_texts and embeds(c["ordinal"])]
    assert counts["chunks_embedded"] == len(new_texts) > 0
    assert counts["pages_unchanged"] >= 2 and counts["pages_deleted"] == 2


def live_table_version(index_dir: Path, manifest) -> dict:
    return {row["chunk_id"]: row for row in IndexReader(str(index_dir), manifest.version).table("chunks").to_pylist()}


@pytest.mark.slow
def test_update_serves_like_a_fresh_build(snapshots):
    from ritrag.serving.api import RitragIndex

    _, _, updated, fresh = snapshots
    a, b = RitragIndex(str(updated)), RitragIndex(str(fresh))
    for query in QUERIES:
        assert_same_toc(a.get_toc(query)["trees"], b.get_toc(query)["trees"])
    ids = list(live_table(fresh, "nodes"))
    assert a.read(ids)["nodes"] == b.read(ids)["nodes"]


def test_a_reload_decodes_only_the_node_files_the_new_version_adds(snapshots, tmp_path):
    import gc

    import numpy as np

    from ritrag.serving.index import LoadedVersion

    index = shutil.copytree(snapshots[2], tmp_path / "index")  # its own paths: no other test's loads share it
    v1 = LoadedVersion(str(index), "v000001")
    v2 = LoadedVersion(str(index), "v000002")
    files = v2.reader.positions("nodes").files
    added = [f for f in files if f.segment == v2.manifest.segments[-1]["id"]]
    assert v2.node_columns.files_read == len(added) < len(files)
    new_rows = v2.reader.positions("nodes").num_rows - v1.reader.positions("nodes").num_rows
    assert 0 < v2.node_columns.ids_sorted <= new_rows  # the id map: only the added files' ids sorted
    reloaded = ({name: array for name, array in v2.node_columns.columns.items()}, v2.node_row.arrays(),
                (v2.skeleton.parent_row, v2.skeleton.ancestor_indptr, v2.skeleton.ancestor_rows), v2.chunks.chunk_node)
    del v1, v2
    gc.collect()
    alone = LoadedVersion(str(index), "v000002")
    assert alone.node_columns.files_read == len(files)  # nothing held: every file decoded
    assert alone.node_columns.ids_sorted == len(alone.node_row)
    columns, (ids, rows), skeleton, chunk_node = reloaded
    assert all(columns[name].equals(array) for name, array in alone.node_columns.columns.items())
    assert np.array_equal(ids, alone.node_row.arrays()[0]) and np.array_equal(rows, alone.node_row.arrays()[1])
    for got, want in zip(skeleton, (alone.skeleton.parent_row, alone.skeleton.ancestor_indptr,
                                    alone.skeleton.ancestor_rows)):
        assert np.array_equal(got, want)
    assert np.array_equal(chunk_node, alone.chunks.chunk_node)


def failing_on_call(n: int, real):
    calls = []

    def write(*args, **kwargs):
        calls.append(args)
        if len(calls) == n:
            raise RuntimeError("injected failure")
        return real(*args, **kwargs)
    return write


@pytest.mark.slow
@pytest.mark.parametrize("fail_at", ["pipeline", "manifest", "current"])
def test_a_failed_update_leaves_the_previous_version_served(snapshots, tmp_path, monkeypatch, fail_at):
    from ritrag import layout as layout_module
    from ritrag.serving.api import RitragIndex

    a, b, _, fresh = snapshots
    index = tmp_path / "index"
    build_index(a, index)
    with monkeypatch.context() as m:
        if fail_at == "pipeline":  # after the segment's tables, before its tombstones
            m.setattr(delta, "write_tombstones", failing_on_call(1, delta.write_tombstones))
        else:  # publication writes the manifest (call 1), then CURRENT (call 2)
            m.setattr(layout_module, "write_atomic",
                      failing_on_call(1 if fail_at == "manifest" else 2, layout_module.write_atomic))
        with pytest.raises(Exception, match="injected failure"):
            update.run(["--input", str(b), "--index", str(index)])
    assert IndexLayout(str(index)).current_version() == "v000001"
    assert RitragIndex(str(index)).get_toc("log rotation")["hits"] > 0
    update.run(["--input", str(b), "--index", str(index)])
    assert live_table(index, "nodes") == live_table(fresh, "nodes")


def test_replaced_rows_move_sections_with_their_page():
    old = [
        node_skeleton(node_id="p", parent_id="x", page_id="p", site="s", kind="page", position=0, depth=2, title="P",
                      url="u", ancestor_ids=["r", "x"], ancestor_titles=["R", "X"], trail_method="jsonld",
                      source_kind="html"),
        node_skeleton(node_id="s1", parent_id="p", page_id="p", site="s", kind="section", position=0, depth=3,
                      title="S1", url="u#a", ancestor_ids=["r", "x", "p"], ancestor_titles=["R", "X", "P"],
                      trail_method="jsonld", source_kind="html"),
    ]
    moved = NodePlacement("p", "r", "s", "page", 4, 1, "P", "u", ("r",), ("R",), "jsonld", "html")
    rows = {r.node_id: r for r in replaced_rows(moved, old)}
    assert rows["p"].parent_id == "r" and rows["p"].position == 4
    assert rows["s1"].ancestor_ids == ["r", "p"] and rows["s1"].depth == 2 and rows["s1"].file == "f"
    unmoved = NodePlacement("p", "x", "s", "page", 0, 2, "P", "u", ("r", "x"), ("R", "X"), "jsonld", "html")
    assert replaced_rows(unmoved, old) == []


def test_plan_of_a_deleted_page_tombstones_its_rows_chunks_and_url():
    old_rows = [node_skeleton(node_id="p", page_id="p", kind="page", url="u")]
    old_chunks = [chunk_ref(file="f", chunk_id=7)]
    plan = plan_page_update(None, None, 0, old_rows, old_chunks, "page",
                            representation=Representation())
    assert (plan.dead_nodes, plan.dead_chunks, plan.dead_urls) == (["p"], old_chunks, ["u"])
    assert plan.rows == []


def test_plan_of_a_new_page_that_could_not_be_read_again_keeps_its_place():
    from ritrag.transforms.nodes import placement_row
    from ritrag.schema import NodePlacement

    placement = NodePlacement("p", "r", "s", "page", 0, 1, "Page", "u", ("r",), ("Root",), "url")
    plan = plan_page_update(placement, None, 2, [], [], "page",
                            representation=Representation())
    assert plan.rows == [placement_row(placement)] and plan.old_chunks == {}  # nothing for ChunkRows to chunk
    assert (plan.indexed, plan.merged, plan.page_rows) == (0, 1, [])


@pytest.mark.slow
def test_compaction_keeps_the_answers_and_drops_dead_rows(snapshots, tmp_path):
    from ritrag.pipelines import compact

    _, _, updated, fresh = snapshots
    copy = tmp_path / "compacted"
    shutil.copytree(updated, copy)
    compact.run(["--index", str(copy)])
    manifest = IndexLayout(str(copy)).load_manifest()
    assert len(manifest.segments) == 1
    for kind in ("nodes", "chunks", "pages"):
        assert live_table(copy, kind) == live_table(fresh, kind), kind
    assert manifest.stats["bm25"] == IndexLayout(str(fresh)).load_manifest().stats["bm25"]


@pytest.mark.slow
def test_versions_rollback_and_retention(tiny_index, tmp_path):
    from ritrag.layout import prune_versions, rollback

    index = tmp_path / "idx"
    shutil.copytree(tiny_index, index)
    layout = IndexLayout(str(index))
    manifest = layout.load_manifest()
    for version in ("v000002", "v000003"):  # republish the same segment as newer versions
        layout.publish(dataclasses.replace(manifest, version=version, parent=layout.current_version()))
    assert layout.versions() == ["v000001", "v000002", "v000003"]
    rollback(layout, "v000001")
    assert layout.current_version() == "v000001"
    deleted = prune_versions(layout, keep=1)
    assert deleted == ["versions/v000002.json"]  # the live one is never pruned
    assert layout.versions() == ["v000001", "v000003"]
    assert (index / "segments" / manifest.segments[0]["id"]).is_dir()  # still referenced


@pytest.mark.slow
def test_a_running_server_swaps_to_the_new_version_without_failing_requests(snapshots, tmp_path):
    import threading

    from ritrag.serving.api import RitragIndex
    from ritrag.serving.reload import VersionWatcher
    from ritrag.serving.tools import ToolService

    a, b, _, fresh = snapshots
    index = tmp_path / "live"
    build_index(a, index)
    service = ToolService(RitragIndex(str(index)))
    watcher = VersionWatcher(service, str(index))
    assert watcher.check_once() is False  # nothing new yet
    update.run(["--input", str(b), "--index", str(index)])

    seen, errors, stop = [], [], threading.Event()

    def client():
        while not stop.is_set():
            try:
                seen.append(service.get_toc("log rotation")["version"])
            except Exception as exc:  # any failure during the swap fails the test
                errors.append(exc)

    thread = threading.Thread(target=client)
    thread.start()
    try:
        while not seen and not errors:  # the client is running before the swap starts
            pass
        assert watcher.check_once() is True
        served_before_swap_ended = len(seen)
        while len(seen) < served_before_swap_ended + 3 and not errors:
            pass
    finally:
        stop.set()
        thread.join()
    assert errors == []
    assert seen[0] == "v000001" and seen[-1] == "v000002"
    expected = RitragIndex(str(fresh)).get_toc("log rotation")["trees"]
    assert_same_toc(service.index.get_toc("log rotation")["trees"], expected)


def copy_index(source: Path, target: Path) -> IndexLayout:
    shutil.copytree(source, target)
    return IndexLayout(str(target))


@pytest.mark.timeout(300)
def test_an_update_dead_letters_links_outside_the_input_and_special_files(tiny_site, tiny_hash_index, tmp_path):
    import os

    import pyarrow.parquet as pq

    index = copy_index(tiny_hash_index, tmp_path / "idx")
    snapshot = tmp_path / "b"
    shutil.copytree(tiny_site, snapshot)
    (tmp_path / "secret.html").write_text("<html><title>Secret</title><p>zanzibarpassword</p></html>")
    os.symlink(tmp_path / "secret.html", snapshot / "shop" / "leak.html")
    os.mkfifo(snapshot / "shop" / "pipe.html")
    # links to nothing (Beam's listing drops them): each a dead letter, for the reason a build gives
    os.symlink(snapshot / "shop" / "moved.html", snapshot / "shop" / "dangling.html")
    os.symlink(tmp_path / "gone.html", snapshot / "shop" / "gone.html")
    assert update.run(["--input", str(snapshot), "--index", index.root]) == "v000002"
    seg = index.load_manifest().segments[-1]
    letters = pq.read_table(os.path.join(index.segment_dir(seg["id"]), "dead_letters.parquet")).to_pylist()
    assert {os.path.basename(r["source"]): r["reason"] for r in letters} == {
        "leak.html": "outside_input", "pipe.html": "not_regular_file", "dangling.html": "unreadable",
        "gone.html": "outside_input"}
    assert not any("zanzibarpassword" in r["body"] for r in live_table(Path(index.root), "nodes").values())
    assert update.run(["--input", str(snapshot), "--index", index.root]) == "v000002"  # known: no change


def test_names_from_users_and_from_files_stay_inside_the_index(tiny_hash_index, tmp_path, capsys):
    import json

    from ritrag import cli
    from ritrag.layout import DamagedIndexError

    index = copy_index(tiny_hash_index, tmp_path / "idx")
    assert cli.main(["rollback", index.root, "../../evil"]) == 2
    assert json.loads(capsys.readouterr().err)["error"]["reason"] == "invalid_arguments"
    assert index.current_version() == "v000001"
    manifest = json.loads(Path(index.manifest_path("v000001")).read_text())
    manifest["segments"][0]["id"] = "../../../other/segments/seg-v000001"
    Path(index.manifest_path("v000001")).write_text(json.dumps(manifest))
    with pytest.raises(DamagedIndexError, match="not a segment id"):
        index.load_manifest()


@pytest.mark.parametrize("damage", ["bom_current", "latin1_current", "path_current", "manifest_list",
                                    "manifest_without_files"])
def test_cli_refuses_a_damaged_index_with_one_json_line(tiny_hash_index, tmp_path, capsys, damage):
    import json

    from ritrag import cli

    index = copy_index(tiny_hash_index, tmp_path / "idx")
    current, manifest = Path(index.current_path), Path(index.manifest_path("v000001"))
    if damage == "bom_current":
        current.write_bytes(b"\xef\xbb\xbfv000001\n")
    elif damage == "latin1_current":
        current.write_bytes(b"v00000\xe9\n")
    elif damage == "path_current":
        current.write_bytes(b"../../etc/passwd\n")
    elif damage == "manifest_list":
        manifest.write_text("[1, 2]")
    else:
        raw = json.loads(manifest.read_text())
        del raw["segments"][0]["files"]
        manifest.write_text(json.dumps(raw))
    for argv in (["toc", index.root, "port"], ["read", index.root, "x"], ["versions", index.root]):
        assert cli.main(argv) == 1, argv
        err = capsys.readouterr().err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1
        assert json.loads(err)["error"]["reason"] == "index_unavailable"


def test_the_version_watcher_survives_a_bad_current_and_retries_each_tick(tiny_hash_index, tmp_path):
    from ritrag.serving.api import RitragIndex
    from ritrag.serving.reload import VersionWatcher
    from ritrag.serving.tools import ToolService

    index = copy_index(tiny_hash_index, tmp_path / "idx")
    service = ToolService(RitragIndex(index.root))
    watcher = VersionWatcher(service, index.root, interval_s=0.05).start()
    try:
        Path(index.current_path).write_bytes(b"\xef\xbb\xbfv000002\n")
        deadline = time.monotonic() + 120
        while watcher.failures < 2 and time.monotonic() < deadline:  # retried: more than one failure
            time.sleep(0.05)
        assert watcher.failures >= 2 and "CURRENT" in watcher.status()["last_error"]["message"]
        assert service.index.version == "v000001"  # the old version keeps serving
        manifest = index.load_manifest("v000001")
        index.publish(dataclasses.replace(manifest, version="v000002", parent="v000001"))
        while service.index.version != "v000002" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert service.index.version == "v000002" and watcher.status()["last_error"] is None
    finally:
        watcher.stop()


@pytest.fixture(scope="module")
def hashed_snapshots(tmp_path_factory):
    """build(A) + update(B) and build(B) with the hashing stand-in, in the default
    (path-aware) representation: B moves a page and re-attaches the children of
    a deleted one, so unchanged pages change paths."""
    root = tmp_path_factory.mktemp("update_hashed")
    a, b = write_tiny_site(root / "a"), make_snapshot_b(root / "b")
    updated, fresh = root / "updated", root / "fresh"
    build_index(a, updated, "--embedding_model", "hashing:384")
    update.run(["--input", str(b), "--index", str(updated)])
    build_index(b, fresh, "--embedding_model", "hashing:384")
    return updated, fresh


def live_vectors(index_dir: Path, chunk_ids) -> dict:
    from ritrag.vectors import VectorStore

    store = VectorStore.open([f.path for f in IndexReader(str(index_dir)).files("vectors")])
    return dict(zip(chunk_ids, store.vectors(list(chunk_ids)).tolist()))


def test_build_and_update_chunk_with_the_same_chunker():
    import inspect

    from ritrag.pipelines import build, update
    from ritrag.transforms import chunk

    assert delta.Chunker is chunk.Chunker  # RechunkReplacedFn
    assert "ChunkNodesFn(Chunker(spec, representation))" in inspect.getsource(build)
    assert "Chunker(spec, representation)" in inspect.getsource(update)


def test_a_chunker_pickles_without_its_tokenizer_and_chunks_the_same_after():
    import pickle

    from ritrag.embedder import EmbedderSpec
    from ritrag.representation import Representation
    from ritrag.transforms.chunk import Chunker

    chunker = Chunker(EmbedderSpec(model="hashing:384"), Representation())
    node = node_row(node_id="n", page_id="p", title="Ports", ancestor_titles=["Shop"],
                    body="Listen on port 8080. " * 40, url="https://x.test/ports.html")
    rows = chunker(node)
    assert rows and chunker._counter is not None  # loaded at first use
    copy = pickle.loads(pickle.dumps(chunker))
    assert copy._counter is None and copy(node) == rows


def test_an_update_gives_the_rows_and_vectors_of_a_fresh_build_in_the_path_representation(hashed_snapshots):
    updated, fresh = hashed_snapshots
    for kind in ("nodes", "chunks", "pages"):
        assert live_table(updated, kind) == live_table(fresh, kind), kind
    chunks = live_table(fresh, "chunks")
    assert any(c["ordinal"] == -1 for c in chunks.values())  # node documents are rows too
    moved = next(c for c in chunks.values() if c["ordinal"] == -1 and c["text"].endswith("Deploying"))
    assert moved["text"] == "Shop Server > Version 2 > Deploying"  # the page moved under Version 2
    embedded = [c for c, row in chunks.items() if Representation().embeds(row["ordinal"])]
    assert live_vectors(updated, embedded) == live_vectors(fresh, embedded)


def test_an_update_refuses_another_representation(hashed_snapshots, tmp_path):
    updated, _ = hashed_snapshots
    before = IndexLayout(str(updated)).current_version()
    for flags in (["--chunk_template", "{title}\\n{body}"], ["--node_docs", "off"], ["--path_levels", "2"],
                  ["--anchor_docs", "off"], ["--node_doc_vectors", "on"]):
        with pytest.raises(ValueError, match="rebuild"):
            update.run(["--input", str(tmp_path), "--index", str(updated), *flags])
    assert IndexLayout(str(updated)).current_version() == before


@pytest.mark.slow
def test_an_index_built_before_source_kind_still_updates(tmp_path):
    """Its nodes and pages files lack the column added later (TableSpec.added): an
    update reads their rows as kind "" (unknown) and writes its own with kinds."""
    import pyarrow.parquet as pq

    from ritrag.storage import write_atomic

    a, b = write_tiny_site(tmp_path / "a"), make_snapshot_b(tmp_path / "b")
    index = tmp_path / "index"
    build_index(a, index, "--embedding_model", "hashing:384")
    layout = IndexLayout(str(index))
    manifest = layout.load_manifest()
    segment = manifest.segments[0]
    for kind in ("nodes", "pages"):
        for name in layout.segment_files(segment, kind):
            path = Path(layout.segment_dir(segment["id"])) / name
            pq.write_table(pq.read_table(path).drop_columns(["source_kind"]), path)
    old = dataclasses.replace(manifest, segments=[layout.describe_segment(segment["id"], segment["num_shards"],
                                                                          segment["counts"])])
    write_atomic(layout.manifest_path(manifest.version), old.to_json())

    update.run(["--input", str(b), "--index", str(index)])
    kinds = {row["node_id"]: row["source_kind"] for row in live_table(index, "nodes").values()}
    assert set(kinds.values()) == {"", "html"}  # rows of the old segment unknown, the new ones html
    fresh = tmp_path / "fresh"
    build_index(b, fresh, "--embedding_model", "hashing:384")
    assert set(live_table(index, "nodes")) == set(live_table(fresh, "nodes"))


@pytest.mark.parametrize("job", ["update", "compact"])
def test_a_damaged_trained_index_is_refused_before_the_job_runs(tiny_site, tiny_hash_index, tmp_path, capsys, job):
    """The trained index is read inside the pipeline, but checked in the
    launcher: a damaged one is one JSON line naming the file, no Beam stage's
    traceback, and no version published."""
    import json

    from ritrag import cli
    from ritrag.layout import DENSE_TRAINED_FILE

    index = copy_index(tiny_hash_index, tmp_path / "idx")
    [trained] = Path(index.root).glob(f"segments/*/{DENSE_TRAINED_FILE}")
    data = bytearray(trained.read_bytes())
    data[len(data) // 2] ^= 0xFF
    trained.write_bytes(bytes(data))
    argv = ["update", str(tiny_site), "--index", index.root] if job == "update" else ["compact", index.root]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "while running" not in err
    error = json.loads(err.strip().splitlines()[-1])["error"]
    assert error["reason"] == "index_unavailable" and DENSE_TRAINED_FILE in error["message"]
    assert index.current_version() == "v000001"


def test_an_update_refuses_stored_vectors_it_reads_from_a_damaged_file(tiny_site, tiny_hash_index, tmp_path, capsys):
    """An update does not hash the vector files whole: it checks the chunks
    it reads (ritrag/vectors.py, `checked`). A moved page lends its stored
    vectors to its new rows; read from a file damaged there, they are refused:
    one error line naming the file, no version published."""
    import json
    import zipfile

    from ritrag import cli

    index = copy_index(tiny_hash_index, tmp_path / "idx")
    site = tmp_path / "site"
    shutil.copytree(tiny_site, site)
    [vectors] = Path(index.root).glob("segments/*/vectors-*.zip")
    with zipfile.ZipFile(vectors) as zf:
        info = zf.getinfo("vectors/c/0/0")
    data, header = bytearray(vectors.read_bytes()), info.header_offset
    start = header + 30 + sum(int.from_bytes(data[header + i: header + i + 2], "little") for i in (26, 28))
    for at in range(start + 1, start + info.file_size, 2):  # every vector's every high byte: any row read is hit
        data[at] ^= 0x40
    vectors.write_bytes(bytes(data))
    page = site / "shop/v3/logging.html"  # a leaf: under a new URL, at the same place of its trail
    page.rename(page.with_name("moved-logging.html"))  # new chunk rows, of the same texts
    assert cli.main(["update", str(site), "--index", index.root]) == 1
    error = json.loads(capsys.readouterr().err.strip().splitlines()[-1])["error"]
    assert error["reason"] == "index_unavailable"
    assert vectors.name in error["message"] and "CRC-32 of vectors/c/0/0" in error["message"]
    assert index.current_version() == "v000001"


def test_an_input_that_is_not_there_publishes_nothing(tiny_hash_index, tmp_path, capsys):
    """A mistyped or unmounted input folder: a build and an update refuse it
    before they run; an update of an empty folder, which would delete every
    page, is refused when it ends. The live version stays live."""
    import json

    from ritrag import cli

    index = copy_index(tiny_hash_index, tmp_path / "idx")
    missing = str(tmp_path / "typo")
    with pytest.raises(SystemExit) as exited:
        cli.main(["update", missing, "--index", index.root])
    assert exited.value.code == 2 and f"input {missing}: no such folder" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        cli.main(["build", missing, "--out", str(tmp_path / "new"), "--embedding_model", "hashing:384"])
    assert exited.value.code == 2 and not (tmp_path / "new").exists()
    capsys.readouterr()
    (tmp_path / "empty").mkdir()
    assert cli.main(["update", str(tmp_path / "empty"), "--index", index.root]) == 1
    error = json.loads(capsys.readouterr().err.strip().splitlines()[-1])["error"]
    assert error["reason"] == "nothing_to_publish" and "would delete all" in error["message"]
    assert index.current_version() == "v000001"


def test_an_update_that_changes_no_page_publishes_nothing(tiny_site, tiny_hash_index, tmp_path):
    """A scheduled update of a quiet site: no new version for servers to
    reload, no empty segment for queries to visit; the live version stays."""
    index = copy_index(tiny_hash_index, tmp_path / "idx")
    segments = sorted(p.name for p in Path(index.root, "segments").iterdir())
    assert update.run(["--input", str(tiny_site), "--index", index.root]) == "v000001"
    assert index.current_version() == "v000001" and not Path(index.manifest_path("v000002")).exists()
    assert sorted(p.name for p in Path(index.root, "segments").iterdir()) == segments
    # a new dead letter is recorded; the same one again is no change (an image, at every update)
    snapshot = tmp_path / "site"
    shutil.copytree(tiny_site, snapshot)
    (snapshot / "shop" / "logo.png").write_bytes(bytes(range(256)) * 8)
    assert update.run(["--input", str(snapshot), "--index", index.root]) == "v000002"
    assert update.run(["--input", str(snapshot), "--index", index.root]) == "v000002"
    # a change still publishes, under the next version's name
    (snapshot / "shop" / "new.html").write_text(tiny_page("New notes", [("Shop Server", "shop/")],
                                                          [("Lamps", "Brass lamps light the reading room.")]))
    assert update.run(["--input", str(snapshot), "--index", index.root]) == "v000003"
    # which records the image again: `ritrag inspect` counts it once
    import pyarrow.parquet as pq

    from ritrag.evaluation.forest_report import forest_report
    from ritrag.layout import DEAD_LETTERS_FILE

    recorded = [path for path in IndexReader(index.root).segment_files(DEAD_LETTERS_FILE)
                if "logo.png" in str(pq.read_table(path, columns=["source"])["source"].to_pylist())]
    report = forest_report(index.root)
    assert len(recorded) == 2 and sum(report["dead_letters"].values()) == 1
    assert sum(sum(reasons.values()) for reasons in report["dead_letters_by_source_dir"].values()) == 1


def test_an_index_inside_its_input_folder_is_not_read_as_input(tiny_site, tmp_path, capsys):
    """`--index docs/.index` for input `docs`: neither the build nor an update
    lists the index's files (each would be a dead letter, and every update
    would publish for them); the input folder itself cannot be the index."""
    import pyarrow.parquet as pq

    from ritrag import cli
    from ritrag.layout import DEAD_LETTERS_FILE
    from ritrag.pipelines import build
    from ritrag.transforms.pages import count_input_files, index_inside_input

    site = tmp_path / "docs"
    shutil.copytree(tiny_site, site)
    index = site / ".index"
    build.run(["--input", str(site), "--out", str(index), "--embedding_model", "hashing:384"])
    assert update.run(["--input", str(site), "--index", str(index)]) == "v000001"  # nothing new: its files unread
    assert build.run(["--input", str(site), "--out", str(index), "--embedding_model", "hashing:384"]) == "v000002"
    sources = IndexReader(str(index)).table("pages", ["source"])["source"].to_pylist()
    dead = [source for path in IndexReader(str(index)).segment_files(DEAD_LETTERS_FILE)
            for source in pq.read_table(path, columns=["source"])["source"].to_pylist()]
    assert not [s for s in sources + dead if "/.index/" in s]
    # nor counted for the build's ETA
    pattern = f"{site}/**"
    assert count_input_files(pattern, index_inside_input(str(site) + "/", str(index))) == len(
        [f for f in site.rglob("*") if f.is_file() and ".index" not in f.parts])
    with pytest.raises(SystemExit) as exited:
        cli.main(["update", str(site), "--index", str(site)])
    assert exited.value.code == 2 and "the index's own folder" in capsys.readouterr().err
