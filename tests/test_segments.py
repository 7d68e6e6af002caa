"""A version as a list of mapped segments (ritrag/serving_form.py,
ritrag.serving.segments): a reload maps, hashes and reads the dense shards of
only the segments the new version adds, a version of several segments with tombstones answers exactly
like its compacted form, and a serving file that is cut or garbled is refused
while the previous version keeps serving."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from ritrag.analyzer import analyze
from ritrag.bm25 import top_k
from ritrag.layout import IndexLayout
from ritrag.serving.api import RitragIndex
from ritrag.serving.index import LoadedVersion
from ritrag.serving_form import SERVING_KIND, map_arrays, utf8_fixed_width, write_arrays
from support import TINY_SITE, assert_same_toc, build_index, tiny_page, write_tiny_site

QUERIES = ["which port does version 3 listen on", "log rotation", "deploy containers replicas",
           "TLS certificates", "release of the shop server", "hourly debug"]


def edit(site: Path, path: str, sections: list[tuple[str, str]]) -> None:
    title, trail, _ = TINY_SITE[path]
    (site / path).write_text(tiny_page(title, trail, sections))


def update(site: Path, index: Path) -> None:
    from ritrag.pipelines import update as update_job

    update_job.run(["--input", str(site), "--index", str(index)])


@pytest.fixture(scope="module")
def three_segments(tmp_path_factory) -> Path:
    """The tiny site built, then updated twice: an edited page, a new page
    and a deleted one, then another edit of the first and another deleted
    page (3 segments, tombstones)."""
    root = tmp_path_factory.mktemp("three_segments")
    site = write_tiny_site(root / "site")
    index = root / "index"
    build_index(site, index, "--embedding_model", "hashing:384", "--num_shards", "2")
    edit(site, "shop/v3/logging.html", [("Rotation", "Logs rotate hourly."), ("Levels", "Set SHOP_LOG=debug.")])
    (site / "shop/v3/metrics.html").write_text(tiny_page(
        "Metrics", [("Shop Server", "shop/"), ("Version 3", "shop/v3/")],
        [("Endpoint", "Prometheus scrapes /metrics on port 9100.")]))
    (site / "shop/v3/guide/deploy.html").unlink()
    update(site, index)
    edit(site, "shop/v3/logging.html", [("Rotation", "Logs rotate weekly, keep four files.")])
    (site / "shop/v2/config.html").unlink()
    update(site, index)
    assert len(IndexLayout(str(index)).load_manifest().segments) == 3
    return index


def test_a_version_of_three_segments_answers_like_its_compacted_form(three_segments, tmp_path):
    from ritrag.pipelines import compact

    compacted = tmp_path / "compacted"
    shutil.copytree(three_segments, compacted)
    compact.run(["--index", str(compacted)])
    assert len(IndexLayout(str(compacted)).load_manifest().segments) == 1
    segmented, single = RitragIndex(str(three_segments)), RitragIndex(str(compacted))
    assert segmented.loaded.chunks.live.sum() == len(single.loaded.chunk_ids)  # the dead rows stay, unused
    for query in QUERIES:
        a, b = segmented.get_toc(query), single.get_toc(query)
        assert_same_toc(a["trees"], b["trees"])
        assert a["hits"] == b["hits"]
        for field in segmented.loaded.bm25.fields:
            got = top_k(segmented.loaded.bm25.scores(analyze(query), field), 50, segmented.loaded.chunk_ids)
            want = top_k(single.loaded.bm25.scores(analyze(query), field), 50, single.loaded.chunk_ids)
            # rows differ between the two forms; chunk ids and scores do not
            np.testing.assert_array_equal(segmented.loaded.chunk_ids[got[0]], single.loaded.chunk_ids[want[0]])
            np.testing.assert_array_equal(got[1], want[1])


def test_a_reload_maps_and_hashes_only_the_segment_it_adds(tmp_path, monkeypatch):
    from ritrag import layout
    from ritrag.serving import dense_shards, segments

    site = write_tiny_site(tmp_path / "site")
    index = tmp_path / "index"
    build_index(site, index, "--embedding_model", "hashing:384", "--num_shards", "2")
    served = LoadedVersion(str(index))
    edit(site, "shop/v3/logging.html", [("Rotation", "Logs rotate hourly.")])
    update(site, index)
    mapped, hashed, read = [], [], []
    real_map, real_hash, real_read = segments.map_arrays, layout.sha256_file, dense_shards.read_dense_shard
    monkeypatch.setattr(segments, "map_arrays", lambda path: mapped.append(Path(path)) or real_map(path))
    monkeypatch.setattr(layout, "sha256_file", lambda path: hashed.append(Path(path)) or real_hash(path))
    monkeypatch.setattr(dense_shards, "read_dense_shard", lambda path, n: read.append(Path(path)) or real_read(path, n))
    fresh = LoadedVersion(str(index))  # while the old version is still loaded, as a watcher's swap
    new_segment = fresh.manifest.segments[-1]["id"]
    assert fresh.version == "v000002" and served.version == "v000001"
    assert sorted(p.name for p in mapped) == [f"{SERVING_KIND}-0000{s}-of-00002.arrays" for s in range(2)]
    assert {p.parent.name for p in mapped} == {new_segment}
    assert hashed and {p.parent.name for p in hashed} == {new_segment}  # the old segment's files: not again
    assert read and {p.parent.name for p in read} == {new_segment}  # nor its dense shards
    rows, _ = top_k(fresh.bm25.scores(analyze("rotate hourly"), "body"), 5)
    assert len(rows)


def test_a_reload_tests_node_ids_against_the_tombstones_it_adds_and_finds_the_live_rows_of_a_fresh_load(
        three_segments, monkeypatch):
    """Loading v1, v2, v3 in turn (a watcher's reloads), each node file's live
    mask is the one before less the ids of the newest tombstones file, not
    all the ids later segments ever tombstoned; the rows found are those a
    process loading v3 alone finds."""
    from ritrag.reader import LiveFile, read_tombstones
    from ritrag.serving import derived_arrays

    monkeypatch.setattr(derived_arrays, "_LIVE_MASKS", {})
    whole, tested = [], []  # files whose mask was made from all their dead ids; the ids tested otherwise
    real_mask, real_live_mask = LiveFile.live_mask, derived_arrays.live_mask
    monkeypatch.setattr(LiveFile, "live_mask", lambda self, ids: whole.append(self.path) or real_mask(self, ids))
    monkeypatch.setattr(derived_arrays, "live_mask", lambda ids, dead: tested.append(dead) or real_live_mask(ids, dead))
    earlier = [LoadedVersion(str(three_segments), version) for version in ("v000001", "v000002")]
    whole.clear(), tested.clear()
    third = LoadedVersion(str(three_segments), "v000003")
    node_files = third.reader.files("nodes")
    newest = read_tombstones(node_files[0].tombstones[-1])["node_id"]
    tombstoned = [f.path for f in node_files if f.tombstones]  # the files of v1 and v2
    assert not set(whole) & set(tombstoned) and len(tested) == len(tombstoned) >= 2
    assert all(dead == newest for dead in tested) and len(newest) < len(node_files[0].dead)  # v3's, not v2's too
    for f in node_files:  # the masks held, each as all the file's dead ids make it
        ids = f.read(["node_id"])["node_id"]
        np.testing.assert_array_equal(derived_arrays.file_live_mask(third.reader, f, ids), real_mask(f, ids))
    monkeypatch.setattr(derived_arrays, "_LIVE_MASKS", {})
    for shard in third.chunks.shards:  # nor the chunks' node rows resolved for v2 (the mapped files are shared)
        shard.node_rows.clear()
    whole.clear()
    alone = LoadedVersion(str(three_segments), "v000003")
    assert len(whole) == len(node_files)  # this time from all their dead ids
    for a, b in zip(third.node_row.arrays(), alone.node_row.arrays()):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(third.chunk_node, alone.chunk_node)
    assert [v.version for v in earlier] == ["v000001", "v000002"]


def test_a_reload_keeps_the_node_rows_it_resolved_for_chunks_whose_node_moved(tmp_path, monkeypatch):
    """A page added before its siblings re-places them: their node rows are
    written again in the new segment, their chunks stay where they were, and
    a load finds those chunks' node rows by node id. The next version (an
    edit elsewhere) keeps the rows the process found, while they are live:
    it asks no node id again, and its chunks point where a fresh process's do."""
    from ritrag.serving import skeleton

    site = write_tiny_site(tmp_path / "site")
    index = tmp_path / "index"
    build_index(site, index, "--embedding_model", "hashing:384", "--num_shards", "2")
    (site / "shop/v3/aaa.html").write_text(tiny_page(  # first among its siblings: they move one place down
        "Aardvark", [("Shop Server", "shop/"), ("Version 3", "shop/v3/")], [("A", "An aardvark page.")]))
    update(site, index)
    edit(site, "shop/v2/config.html", [("Ports", "Version 2 listens on port 8081.")])
    update(site, index)
    asked = []
    real_rows = skeleton.NodeRows.rows
    monkeypatch.setattr(skeleton.NodeRows, "rows", lambda self, ids: asked.append(len(ids)) or real_rows(self, ids))
    second = LoadedVersion(str(index), "v000002")
    moved = sum(asked)
    asked.clear()
    third = LoadedVersion(str(index), "v000003")
    again = sum(asked)
    for shard in third.chunks.shards:  # what a process that held no version would do
        shard.node_rows.clear()
    asked.clear()
    alone = LoadedVersion(str(index), "v000003")
    assert second.version == "v000002" and moved > 0 and sum(asked) >= moved > again
    np.testing.assert_array_equal(third.chunk_node, alone.chunk_node)
    # A second page first among them moves them again: the rows held for them died, and are found anew.
    (site / "shop/v3/aab.html").write_text(tiny_page(
        "Aardwolf", [("Shop Server", "shop/"), ("Version 3", "shop/v3/")], [("A", "An aardwolf page.")]))
    update(site, index)
    fourth = LoadedVersion(str(index), "v000004")
    for shard in fourth.chunks.shards:
        shard.node_rows.clear()
    np.testing.assert_array_equal(fourth.chunk_node, LoadedVersion(str(index), "v000004").chunk_node)


def test_the_arrays_container_round_trips_and_refuses_what_is_not_one(tmp_path):
    from ritrag.layout import DamagedIndexError
    import pyarrow as pa

    arrays = {"ids": np.arange(5, dtype=np.int64), "terms": utf8_fixed_width(pa.array(["b", "é", ""])),
              "empty": np.zeros((0, 3), np.int64), "tf": np.array([1, 65535], np.uint16)}
    path = str(tmp_path / "x.arrays")
    write_arrays(path, arrays)
    back = map_arrays(path)
    for name, array in arrays.items():
        np.testing.assert_array_equal(back[name], array)
        assert back[name].dtype == array.dtype and back[name].shape == array.shape
    assert [t.decode() for t in back["terms"]] == ["b", "é", ""]
    data = Path(path).read_bytes()
    for bad in (b"", data[:12], b"not a file" * 10, data[:len(data) - 8], data.replace(b'"<i8"', b'"<c8"', 1)):
        Path(path).write_bytes(bad)
        with pytest.raises(DamagedIndexError, match="x.arrays"):
            map_arrays(path)


def test_an_index_of_format_2_is_refused_with_what_to_do_and_served_after_a_compact(tiny_hash_index, tmp_path,
                                                                                    capsys):
    """An index written before segments carried their serving form: no
    rebuild, one `ritrag compact` makes it servable."""
    import json

    from ritrag import cli

    index = tmp_path / "old"
    shutil.copytree(tiny_hash_index, index)
    layout = IndexLayout(str(index))
    manifest = json.loads(Path(layout.manifest_path("v000001")).read_text())
    for segment in manifest["segments"]:
        for name in [n for n in segment["files"] if n.startswith(f"{SERVING_KIND}-")]:
            del segment["files"][name]
            (Path(layout.segment_dir(segment["id"])) / name).unlink()
    manifest["format_version"] = 2
    Path(layout.manifest_path("v000001")).write_text(json.dumps(manifest))
    capsys.readouterr()
    assert cli.main(["toc", str(index), "log rotation"]) == 1
    error = json.loads(capsys.readouterr().err.strip().splitlines()[-1])["error"]
    assert error["reason"] == "index_unavailable" and "ritrag compact" in error["message"]
    assert cli.main(["compact", str(index)]) == 0
    assert IndexLayout(str(index)).load_manifest().format_version == 3
    capsys.readouterr()
    assert cli.main(["toc", str(index), "log rotation"]) == 0
    assert "Logging" in capsys.readouterr().out
