"""Versions that stay servable through prune and damage (issue #37, items 1-3):
a prune that died halfway is finished by the next one and says what it kept
and why; a server keeps answering Read for the version it serves after prune
deleted that version's files; a file that matches its checksum but does not
load is a damaged index (one JSON line from the CLI, "waiting" and retried by
a server and its watcher)."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import threading
from pathlib import Path

import httpx
import pytest

from ritrag import cli
from ritrag.serving.api import RitragIndex
from ritrag.serving.http import HttpSettings, create_app
from ritrag.serving.reload import VersionWatcher
from ritrag.serving.tools import ToolService
from ritrag.layout import IndexLayout, prune_versions
from ritrag.lease import IndexLease
from serving_fixtures import serving

WAIT_S = 120.0  # a generous bound on anything polled: these tests never depend on timing


def copy_index(source: Path, target: Path) -> IndexLayout:
    shutil.copytree(source, target)
    return IndexLayout(str(target))


def publish_own_copy(layout: IndexLayout, version: str) -> None:
    """Publish `version` as a copy of the live one in a segment of its own (as
    compact does: a newer version that shares no segment with the older)."""
    manifest = layout.load_manifest()
    segments = []
    for segment in manifest.segments:
        copied = f"seg-{version}"
        shutil.copytree(layout.segment_dir(segment["id"]), layout.segment_dir(copied))
        segments.append({**segment, "id": copied})
    layout.publish(dataclasses.replace(manifest, version=version, parent=manifest.version, segments=segments))


def damage_matching_the_manifest(layout: IndexLayout, version: str, damage: str) -> str:
    """Damage one file of `version` (`faiss`: a dense shard cut to 40 bytes;
    `parquet_footer`: a node shard's footer overwritten; `serving`: a serving
    file cut in half) and rewrite its
    manifest entry to match, so the checksum passes; returns the file's name."""
    manifest = layout.load_manifest(version)
    segment = manifest.segments[-1]
    kind, ext = {"faiss": ("dense", "faiss"), "parquet_footer": ("nodes", "parquet"),
                 "serving": ("serving", "arrays")}[damage]
    name = next(n for n in sorted(segment["files"]) if n.startswith(f"{kind}-") and n.endswith(ext))
    path = Path(layout.segment_dir(segment["id"])) / name
    data = path.read_bytes()
    if damage == "faiss":
        data = data[:40]
    elif damage == "serving":  # cut inside its arrays: the header names bytes past the end
        data = data[:len(data) // 2]
    else:  # the footer's thrift bytes, before its length and the closing magic
        data = data[:-80] + b"\xff" * 72 + data[-8:]
    path.write_bytes(data)
    segment["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    Path(layout.manifest_path(version)).write_bytes(manifest.to_json())
    return name


def wait_for(condition, what: str) -> None:
    stop = threading.Event()
    for _ in range(int(WAIT_S / 0.1)):
        if condition():
            return
        stop.wait(0.1)
    raise AssertionError(f"never {what}")


def prune_cli(index: IndexLayout, capsys, *flags: str) -> dict:
    assert cli.main(["prune", index.root, *flags]) == 0
    return json.loads(capsys.readouterr().out)


# 1. A crashed prune leaves no orphans for good


def test_a_prune_that_died_after_deleting_manifests_is_finished_by_the_next(tiny_hash_index, tmp_path, capsys):
    index = copy_index(tiny_hash_index, tmp_path / "idx")
    publish_own_copy(index, "v000002")
    publish_own_copy(index, "v000003")
    # The prune that died: both older manifests deleted, their segments not yet.
    for version in ("v000001", "v000002"):
        os.unlink(index.manifest_path(version))
    out = prune_cli(index, capsys, "--keep", "1")
    assert out["deleted"] == ["segments/seg-v000001", "segments/seg-v000002"]
    assert out["kept"] == ["v000003"] and "live" in out["reason"]["v000003"]
    assert sorted(os.listdir(Path(index.root) / "segments")) == ["seg-v000003"]
    assert cli.main(["toc", index.root, "log rotation"]) == 0


def test_prune_spares_the_segment_a_lease_holder_writes(tiny_hash_index, tmp_path):
    index = copy_index(tiny_hash_index, tmp_path / "idx")
    in_flight = Path(index.segment_dir("seg-v000002"))
    in_flight.mkdir()
    (in_flight / "nodes-00000-of-00001.parquet").write_bytes(b"being written")
    with IndexLease(index, "build") as lease:
        lease.claim_segment("seg-v000002")
        assert prune_versions(index, keep=1) == []
    assert in_flight.is_dir()
    assert prune_versions(index, keep=1) == ["segments/seg-v000002"]  # once no job holds it, it is debris


def test_prune_says_what_it_kept_and_why_after_a_rollback(tiny_hash_index, tmp_path, capsys):
    index = copy_index(tiny_hash_index, tmp_path / "idx")
    publish_own_copy(index, "v000002")
    assert cli.main(["rollback", index.root, "v000001"]) == 0
    capsys.readouterr()
    out = prune_cli(index, capsys, "--keep", "1")
    assert out["deleted"] == []
    assert out["kept"] == ["v000001", "v000002"]
    assert "live" in out["reason"]["v000001"] and "newest" in out["reason"]["v000002"]


# 2. Prune never takes Read away from a running server


def test_read_keeps_answering_after_prune_deleted_the_served_version(tiny_hash_index, tmp_path, capsys):
    index = copy_index(tiny_hash_index, tmp_path / "idx")
    served = RitragIndex(index.root, cache_dir=str(tmp_path / "cache"))
    node_id = served.get_toc("log rotation")["trees"][0]["id"]
    before = served.read([node_id])
    publish_own_copy(index, "v000002")  # as compact does: the new version shares no segment with v1
    out = prune_cli(index, capsys, "--keep", "1")
    assert "segments/seg-v000001" in out["deleted"] and not Path(index.segment_dir("seg-v000001")).exists()
    assert served.read([node_id]) == before
    with serving(create_app(lambda: ToolService(served))) as url, httpx.Client(base_url=url, timeout=60) as client:
        wait_for(lambda: client.get("/readyz").status_code == 200, "ready")
        response = client.post("/v1/read", json={"node_ids": [node_id]})
        assert response.status_code == 200, response.text
        assert client.post("/v1/toc", json={"query": "log rotation"}).status_code == 200


# 3. A file that matches its checksum but does not load is a damaged index


@pytest.mark.parametrize("damage", ["faiss", "parquet_footer", "serving"])
def test_a_checksum_matching_file_that_does_not_load_is_one_json_line(tiny_hash_index, tmp_path, capsys, damage):
    index = copy_index(tiny_hash_index, tmp_path / "idx")
    name = damage_matching_the_manifest(index, "v000001", damage)
    capsys.readouterr()
    assert cli.main(["toc", index.root, "log rotation"]) == 1
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err
    error = json.loads(lines[0])["error"]
    assert error["reason"] == "index_unavailable" and name in error["message"]


def test_a_server_on_a_damaged_version_waits_and_serves_after_a_rollback(tiny_hash_index, tmp_path, capsys):
    index = copy_index(tiny_hash_index, tmp_path / "idx")
    publish_own_copy(index, "v000002")
    damage_matching_the_manifest(index, "v000002", "faiss")
    loads = []

    def load() -> ToolService:
        loads.append(1)
        return ToolService(RitragIndex(index.root))

    with serving(create_app(load, HttpSettings(load_retry_s=0.2))) as url, \
            httpx.Client(base_url=url, timeout=60) as client:
        wait_for(lambda: client.get("/healthz").json()["status"] == "waiting", "waiting")
        assert client.get("/readyz").status_code == 503
        assert client.post("/v1/toc", json={"query": "log rotation"}).status_code == 503
        assert cli.main(["rollback", index.root, "v000001"]) == 0
        wait_for(lambda: client.get("/readyz").status_code == 200, "ready after the rollback")
        assert client.get("/healthz").json() == {"status": "ok"}
        assert client.post("/v1/toc", json={"query": "log rotation"}).status_code == 200
    assert len(loads) >= 2


@pytest.mark.parametrize("damage", ["parquet_footer", "serving"])
def test_the_watcher_refuses_a_damaged_version_in_one_line_and_keeps_serving(tiny_hash_index, tmp_path, caplog,
                                                                            damage):
    index = copy_index(tiny_hash_index, tmp_path / "idx")
    service = ToolService(RitragIndex(index.root))
    publish_own_copy(index, "v000002")
    damage_matching_the_manifest(index, "v000002", damage)
    watcher = VersionWatcher(service, index.root, interval_s=3600)
    with caplog.at_level(logging.INFO, logger="ritrag.serving.reload"):
        assert watcher.check_once() is False
    assert service.index.version == "v000001"
    assert watcher.last_error["message"].startswith("DamagedIndexError") and watcher.failures == 1
    refused = [r for r in caplog.records if r.name == "ritrag.serving.reload" and r.levelno >= logging.WARNING]
    assert len(refused) == 1 and refused[0].exc_info is None
    assert refused[0].getMessage().startswith("reload refused: ") and "v000002" in refused[0].getMessage()
    assert service.get_toc("log rotation")
