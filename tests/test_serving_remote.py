"""Serving an index from an object store (serving.remote), against fsspec's
in-memory filesystem: copy, verify once, stamp, resume, refuse, evict."""
from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import fsspec
import pytest

import ritrag.layout
import ritrag.serving.remote
from ritrag.layout import DamagedIndexError, IndexLoadError, Manifest
from ritrag.serving.api import RitragIndex
from ritrag.serving.reload import VersionWatcher
from ritrag.serving.remote import IndexMirror
from ritrag.serving.tools import ToolService
from fleet_fixtures import publish, publish_copy_as


@pytest.fixture
def store(tiny_hash_index) -> str:
    uri = f"memory://ritrag-{uuid.uuid4().hex[:8]}/index"
    publish(tiny_hash_index, *fsspec.core.url_to_fs(uri))
    yield uri
    fsspec.filesystem("memory").rm(uri.split("://")[1].split("/")[0], recursive=True)


@pytest.fixture(autouse=True)
def fresh_mirrors():
    """Each test starts as a new process would: no mirror made yet."""
    ritrag.serving.remote._MIRRORS.clear()
    yield
    ritrag.serving.remote._MIRRORS.clear()


def largest_file(manifest: Manifest) -> tuple[str, str, dict]:
    seg = manifest.segments[0]
    name = max(seg["files"], key=lambda n: seg["files"][n]["bytes"])
    return seg["id"], name, seg["files"][name]


def test_an_index_in_the_store_serves_as_the_local_one_does(store, tiny_hash_index, tmp_path):
    remote = RitragIndex(store, cache_dir=str(tmp_path))
    local = RitragIndex(str(tiny_hash_index))
    query = "which port does version 3 listen on"
    assert remote.get_toc(query, n=5) == local.get_toc(query, n=5)
    progress = remote.loaded.mirror.progress
    manifest = remote.loaded.manifest
    total = sum(e["bytes"] for seg in manifest.segments for e in seg["files"].values())
    assert progress.files_done == progress.files_total == sum(len(seg["files"]) for seg in manifest.segments)
    assert progress.bytes_done == progress.bytes_total == progress.bytes_copied == total
    assert remote.loaded.mirror.cached_versions() == [remote.version]


def test_a_restart_over_a_warm_cache_copies_and_hashes_nothing(store, tmp_path, monkeypatch):
    RitragIndex(store, cache_dir=str(tmp_path))
    ritrag.serving.remote._MIRRORS.clear()  # a new process

    def no_hashing(path: str, block: int = 0) -> str:
        raise AssertionError(f"re-hashed {path}")

    monkeypatch.setattr(ritrag.layout, "sha256_file", no_hashing)
    monkeypatch.setattr(ritrag.serving.remote, "sha256_file", no_hashing)
    again = RitragIndex(store, cache_dir=str(tmp_path))
    assert again.loaded.mirror.progress.bytes_copied == 0 and again.get_toc("log rotation")["hits"]


def test_a_file_changed_on_disk_after_its_stamp_is_copied_again(store, tmp_path):
    first = RitragIndex(store, cache_dir=str(tmp_path))
    segment_id, name, entry = largest_file(first.loaded.manifest)
    path = Path(first.loaded.reader.layout.segment_dir(segment_id)) / name
    path.write_bytes(b"x" * entry["bytes"])  # same size, new mtime: the stamp no longer matches
    ritrag.serving.remote._MIRRORS.clear()
    again = RitragIndex(store, cache_dir=str(tmp_path))
    assert again.loaded.mirror.progress.bytes_copied == entry["bytes"] and again.get_toc("tls")["hits"]


def test_a_partial_copy_is_resumed_and_a_bad_one_redone(store, tmp_path):
    mirror = IndexMirror(store, str(tmp_path / "a"))
    manifest = mirror.remote.load_manifest()
    segment_id, name, entry = largest_file(manifest)
    data = fsspec.core.url_to_fs(store)[0].cat_file(f"{mirror.root}/segments/{segment_id}/{name}")
    total = sum(e["bytes"] for seg in manifest.segments for e in seg["files"].values())
    half = len(data) // 2
    part = Path(mirror.layout.segment_dir(segment_id)) / f".{name}.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(data[:half])  # a crash in the middle of the copy
    mirror.fetch()
    assert mirror.progress.bytes_copied == total - half and mirror.progress.files_refused == 0
    assert (part.parent / name).read_bytes() == data and not part.exists()

    other = IndexMirror(store, str(tmp_path / "b"))
    part = Path(other.layout.segment_dir(segment_id)) / f".{name}.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(b"\0" * half)  # bytes that are not the file's: refused, then copied whole
    other.fetch()
    assert other.progress.files_refused == 1 and other.progress.bytes_copied == total + len(data) - half
    assert (part.parent / name).read_bytes() == data


@pytest.mark.parametrize("damage", ["corrupted", "truncated"])
def test_a_damaged_object_is_refused_and_the_old_version_keeps_serving(store, tmp_path, damage):
    service = ToolService(RitragIndex(store, cache_dir=str(tmp_path)))
    watcher = VersionWatcher(service, store, interval_s=3600, cache_dir=str(tmp_path))
    manifest = publish_copy_as(*fsspec.core.url_to_fs(store), "v000002")
    fs, _ = fsspec.core.url_to_fs(store)
    segment_id, name, _ = largest_file(manifest)
    remote = f"{watcher._mirror.root}/segments/{segment_id}/{name}"
    good = fs.cat_file(remote)
    fs.pipe_file(remote, good[:100] + bytes([good[100] ^ 1]) + good[101:] if damage == "corrupted" else good[:-7])
    assert not watcher.check_once()
    assert service.index.version == "v000001" and service.get_toc("tls")["hits"]
    assert watcher.failures == 1 and "differs from the manifest" in watcher.last_error["message"]
    assert watcher._mirror.cached_versions() == ["v000001"] and watcher._mirror.progress.files_refused == 1
    fs.pipe_file(remote, good)  # repaired in the store: the next check swaps
    assert watcher.check_once() and service.index.version == "v000002" and service.get_toc("tls")["hits"]


def test_eviction_keeps_the_served_version_and_one_another_replica_serves(store, tmp_path):
    mirror = IndexMirror(store, str(tmp_path), keep_versions=1)
    mirror.fetch()
    for version in ("v000002", "v000003"):
        publish_copy_as(*fsspec.core.url_to_fs(store), version)
        mirror.fetch()
    assert mirror.cached_versions() == ["v000001", "v000002", "v000003"]
    other = Path(mirror.local_root) / "serving" / "v000003" / "otherhost-1"
    other.parent.mkdir(parents=True)
    other.touch()  # another replica on this cache volume serves v000003
    assert mirror.evict(serving="v000002") == ["v000001"]
    os.utime(other, (0, 0))  # ... and no longer does
    assert mirror.evict(serving="v000002") == ["v000003"]
    assert mirror.cached_versions() == ["v000002"]
    assert sorted(os.listdir(Path(mirror.local_root) / "segments")) == ["seg-v000002"]
    ritrag.serving.remote._MIRRORS.clear()
    assert RitragIndex(store, "v000002", cache_dir=str(tmp_path)).get_toc("tls")["hits"]


def test_a_size_limit_evicts_all_but_the_served_version(store, tmp_path):
    mirror = IndexMirror(store, str(tmp_path), keep_versions=5, max_bytes=1)
    mirror.fetch()
    publish_copy_as(*fsspec.core.url_to_fs(store), "v000002")
    mirror.fetch()
    assert mirror.evict(serving="v000002") == ["v000001"] and mirror.cached_versions() == ["v000002"]


def test_a_missing_store_package_names_the_pip_command(monkeypatch, tmp_path):
    """As on a machine without the gcs extra, whether or not this one has gcsfs."""
    monkeypatch.setitem(sys.modules, "gcsfs", None)  # `import gcsfs` now raises ImportError
    for protocol in ("gs", "gcs"):
        monkeypatch.delitem(sys.modules["fsspec.registry"]._registry, protocol, raising=False)  # imported earlier
    with pytest.raises(IndexLoadError, match=r"pip install 'ritrag\[gcs\]'"):
        IndexMirror("gs://bucket/index", str(tmp_path))


def test_a_damaged_current_in_the_store_is_refused(store, tmp_path):
    fs, root = fsspec.core.url_to_fs(store)
    fs.pipe_file(f"{root}/CURRENT", b"../../etc\n")
    with pytest.raises(DamagedIndexError, match="CURRENT"):
        IndexMirror(store, str(tmp_path)).remote.current_version()


def test_an_object_larger_than_its_manifest_says_is_read_no_further(store, tmp_path):
    """The copy stops one byte past the size the manifest states, which
    shows the object is not the one it names (before, the whole object came
    over: 42 MB of one stated as 155 bytes, before it was refused)."""
    fs, root = fsspec.core.url_to_fs(store)
    manifest = Manifest.from_json(fs.cat_file(f"{root}/versions/v000001.json"))
    segment = manifest.segments[0]
    name = min(segment["files"], key=lambda n: segment["files"][n]["bytes"])
    fs.pipe_file(f"{root}/segments/{segment['id']}/{name}", b"x" * (8 << 20))
    mirror = IndexMirror(store, str(tmp_path))
    with pytest.raises(DamagedIndexError, match=name):
        mirror.fetch()
    assert mirror.progress.files_refused == 1
    assert mirror.progress.bytes_copied <= sum(entry["bytes"] for entry in segment["files"].values()) + 1
