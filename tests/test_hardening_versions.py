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
import os
import shutil
import threading
from pathlib import Path

import pytest

from ritrag import cli
from ritrag.layout import IndexLayout, prune_versions
from ritrag.lease import IndexLease

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
    `parquet_footer`: a node shard's footer overwritten) and rewrite its
    manifest entry to match, so the checksum passes; returns the file's name."""
    manifest = layout.load_manifest(version)
    segment = manifest.segments[-1]
    kind, ext = ("dense", "faiss") if damage == "faiss" else ("nodes", "parquet")
    name = next(n for n in sorted(segment["files"]) if n.startswith(f"{kind}-") and n.endswith(ext))
    path = Path(layout.segment_dir(segment["id"])) / name
    data = path.read_bytes()
    if damage == "faiss":
        data = data[:40]
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
