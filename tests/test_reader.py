"""IndexReader: the live rows of a version (a row is live unless a later
segment tombstoned its id), point reads by id and by position, and the
errors a missing or damaged file raises."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from ritrag.layout import DamagedIndexError, IndexLayout, IndexLoadError, MissingIndexError
from ritrag.pipelines import update
from ritrag.reader import ID_COLUMNS, IndexReader
from ritrag.schema import PAGES_SCHEMA, ChunkRef, NodeRow
from support import TINY_SITE, build_index, tiny_page, write_tiny_site

TABLES = ("nodes", "chunks", "pages")


def edited_site(directory: Path) -> Path:
    """The tiny site with one page edited, one deleted and one added."""
    write_tiny_site(directory)
    title, trail, _ = TINY_SITE["shop/v3/logging.html"]
    (directory / "shop/v3/logging.html").write_text(tiny_page(
        title, trail, [("Rotation", "Logs rotate hourly; keep thirty files.")]))
    (directory / "shop/v2/config.html").unlink()
    (directory / "shop/v3/metrics.html").write_text(tiny_page(
        "Metrics", [("Shop Server", "shop/"), ("Version 3", "shop/v3/")],
        [("Endpoint", "Prometheus scrapes /metrics on the admin port.")]))
    return directory


@pytest.fixture(scope="module")
def updated_and_fresh(tiny_hash_index, tmp_path_factory) -> tuple[IndexReader, IndexReader]:
    """The tiny index updated to the edited site, and a fresh build of that site."""
    root = tmp_path_factory.mktemp("reader")
    site = edited_site(root / "site")
    updated = root / "updated"
    shutil.copytree(tiny_hash_index, updated)
    update.run(["--input", str(site), "--index", str(updated)])
    fresh = root / "fresh"
    build_index(site, fresh, "--embedding_model", "hashing:384")
    return IndexReader(str(updated)), IndexReader(str(fresh))


def rows_by_key(reader: IndexReader, kind: str) -> dict:
    """The live rows of a table by id (pages without `source`: the input folders differ)."""
    table = reader.table(kind)
    if kind == "pages":
        table = table.drop_columns(["source"])
    rows = table.to_pylist()
    by_key = {row[ID_COLUMNS[kind]]: row for row in rows}
    assert len(by_key) == len(rows), f"an id of {kind} is live twice"
    return by_key


def test_the_live_rows_after_an_update_are_those_of_a_fresh_build(updated_and_fresh):
    updated, fresh = updated_and_fresh
    assert len(updated.manifest.segments) == 2 and updated.manifest.tombstones["node_id"] > 0
    for kind in TABLES:
        assert rows_by_key(updated, kind) == rows_by_key(fresh, kind), kind


def test_live_rows_are_typed_records_and_a_chunk_ref_names_the_file_that_holds_it(updated_and_fresh):
    updated, fresh = updated_and_fresh
    # Whole rows, as the build writes them: its typed records, or dicts of the schema's columns.
    nodes = list(updated.rows("nodes"))
    assert all(type(row) is NodeRow for row in nodes)
    assert sorted(row.node_id for row in nodes) == sorted(rows_by_key(fresh, "nodes"))
    assert all(set(row) == set(PAGES_SCHEMA.names) for row in updated.rows("pages"))
    # Chunk refs, file by file: each names the file whose table holds its chunk, and no
    # chunk the update tombstoned is among them.
    refs = list(updated.rows("chunks", ChunkRef))
    assert sorted(ref.chunk_id for ref in refs) == sorted(rows_by_key(fresh, "chunks"))
    ids_in = {f.path: set(f.read(["chunk_id"])["chunk_id"].to_pylist()) for f in updated.files("chunks")}
    assert all(ref.chunk_id in ids_in[ref.file] for ref in refs)
    first, update = (segment["id"] for segment in updated.manifest.segments)
    dead = updated.dead[first]["chunk_id"]
    assert dead and not dead & {ref.chunk_id for ref in refs}
    # The chunks the update wrote are read from its segment's files.
    segment_of = {f.path: f.segment for f in updated.files("chunks")}
    built = set().union(*(ids for path, ids in ids_in.items() if segment_of[path] == first))
    assert {segment_of[ref.file] for ref in refs if ref.chunk_id not in built} == {update}


def test_point_reads_return_the_live_rows_and_skip_dead_ones(updated_and_fresh):
    updated, _ = updated_and_fresh
    live = rows_by_key(updated, "chunks")
    dead = set(updated.dead[updated.manifest.segments[0]["id"]]["chunk_id"])
    assert dead and not dead & set(live)
    asked = [*sorted(live)[::3], *sorted(dead), 12345]
    found = updated.rows_by_id("chunks", asked, ["text", "node_id"])
    assert set(found) == set(sorted(live)[::3])
    assert all(found[i]["text"] == live[i]["text"] and found[i]["node_id"] == live[i]["node_id"] for i in found)
    nodes = rows_by_key(updated, "nodes")
    some = sorted(nodes)[:4]
    assert {i: r["body"] for i, r in updated.rows_by_id("nodes", some, ["body"]).items()} == {
        i: nodes[i]["body"] for i in some}


def test_a_live_file_pickles_without_its_dead_ids_and_reads_them_back(updated_and_fresh):
    """The jobs' stages carry LiveFiles, and Beam pickles a stage again and
    again: a file's dead ids (hundreds of thousands after an update that
    re-placed a large site) travel as the tombstones files that name them."""
    import dataclasses
    import pickle

    updated, _ = updated_and_fresh
    files = updated.files("nodes") + updated.files("chunks") + updated.files("dense")
    tombstoned = [f for f in files if f.dead]
    assert tombstoned and all(f.tombstones for f in tombstoned)
    assert all(not f.tombstones for f in files if f.segment == updated.manifest.segments[-1]["id"])
    for live_file in files:
        pickled = pickle.dumps(live_file)
        assert pickle.loads(pickled) == live_file
        assert not any(i.encode() in pickled for i in list(live_file.dead)[:20] if isinstance(i, str))
    # one made with dead ids and no tombstones files keeps its ids
    made = dataclasses.replace(tombstoned[0], tombstones=())
    assert pickle.loads(pickle.dumps(made)).dead == tombstoned[0].dead


def test_a_filtered_read_is_the_filter_of_the_live_rows(updated_and_fresh):
    """`rows(where=...)` reads the filtered columns first and the rest only
    from a file where some row matches: the same rows as filtering every
    live row, dead ones never among them, and no read at all for no values."""
    import dataclasses

    updated, _ = updated_and_fresh
    assert any(f.dead for f in updated.files("nodes"))
    for live_file in updated.files("nodes"):
        dead = live_file.dead
        every = live_file.read(["node_id", "page_id"]).to_pylist()
        dead_pages = {row["page_id"] for row in every if row["node_id"] in dead}
        asked = dead_pages | {row["page_id"] for row in every[::2]} | {"no such page"}
        expected = [row for row in live_file.rows() if row.page_id in asked]
        assert [row for row in live_file.rows(where={"page_id": asked})] == expected
        assert not {row.node_id for row in expected} & dead
        assert list(live_file.rows(where={"page_id": {"no such page"}})) == []
    # no values: no row can match, and no file is opened
    gone = dataclasses.replace(updated.files("nodes")[0], path="/nonexistent/nodes.parquet")
    assert list(gone.rows(where={"page_id": []})) == []
    with pytest.raises(FileNotFoundError):
        list(gone.rows(where={"page_id": ["a"]}))


def test_a_job_shares_its_readers_dead_ids_with_the_files_it_unpickles(updated_and_fresh, tmp_path):
    """The direct runner unpickles a job's stages in the job's own process:
    their LiveFiles take the dead ids the job's reader read, and do not read
    the tombstones files again (here moved away, so a read would fail)."""
    import pickle

    updated, _ = updated_and_fresh
    copy = tmp_path / "index"
    shutil.copytree(updated.layout.root, copy)
    reader = IndexReader(str(copy))
    tombstoned = [f for f in reader.files("nodes") + reader.files("chunks") if f.dead]
    assert tombstoned
    pickled = [pickle.dumps(f) for f in tombstoned]
    reader.share_dead_ids()
    for path in {path for f in tombstoned for path in f.tombstones}:
        os.rename(path, path + ".moved")
    assert [pickle.loads(p).dead for p in pickled] == [f.dead for f in tombstoned]


def test_positions_number_every_row_of_the_files_dead_ones_too(updated_and_fresh):
    updated, _ = updated_and_fresh
    positions = updated.positions("nodes")
    every = [row for f in positions.files for row in f.read(["node_id", "title"]).to_pylist()]
    assert positions.num_rows == len(every) > len(rows_by_key(updated, "nodes"))
    wanted = [0, len(every) - 1, len(every) // 2]
    assert positions.read(wanted, ["node_id", "title"]) == {i: every[i] for i in wanted}
    assert positions.column("title").to_pylist() == [row["title"] for row in every]


@pytest.mark.parametrize("damage", ["missing", "damaged"])
def test_a_missing_or_damaged_file_raises_the_load_error_the_server_reports(tiny_hash_index, tmp_path, damage):
    index = tmp_path / "index"
    shutil.copytree(tiny_hash_index, index)
    layout = IndexLayout(str(index))
    segment = layout.load_manifest().segments[0]
    victim = Path(layout.segment_dir(segment["id"])) / layout.segment_files(segment, "chunks")[0]
    if damage == "missing":
        victim.unlink()
    else:
        victim.write_bytes(victim.read_bytes()[:-1] + b"\0")
    reader = IndexReader(str(index))  # the manifest and tombstones are whole: nothing else is read yet
    expected = MissingIndexError if damage == "missing" else DamagedIndexError
    with pytest.raises(expected, match=victim.name) as raised:
        reader.table("chunks")
    assert isinstance(raised.value, IndexLoadError)
    assert rows_by_key(reader, "nodes")  # the other files still read
    with pytest.raises(MissingIndexError, match="no index at"):
        IndexReader(str(tmp_path / "nothing"))
