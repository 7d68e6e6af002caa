"""What the fleet tests share: publishing an index to an object store as a
build does, and servers on 127.0.0.1: a real Redis (Debian's `redis-server`;
.ci/run installs it) that a test can stop and start again on the same port."""
from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from ritrag.layout import Manifest

REDIS_SERVER = shutil.which("redis-server")
needs_redis = pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed (apt-get install "
                                                               "redis-server; .ci/run does)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")


class RedisServer:
    """A throwaway redis-server on 127.0.0.1 (no persistence)."""

    def __init__(self, directory: Path):
        self.port = free_port()
        self.directory = directory
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> "RedisServer":
        self.process = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.directory)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port(self.port)
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None


def publish(local: Path, fs, root: str) -> None:
    """Copy a local index to `root` in the fsspec filesystem `fs` the way a
    build publishes: segment files, then manifests, then CURRENT last."""
    for top in ("segments", "versions"):
        for path in sorted((local / top).rglob("*")):
            if path.is_file() and not path.name.startswith("."):
                fs.pipe_file(f"{root}/{path.relative_to(local).as_posix()}", path.read_bytes())
    fs.pipe_file(f"{root}/CURRENT", (local / "CURRENT").read_bytes())


def publish_copy_as(fs, root: str, version: str) -> Manifest:
    """Publish `version`: the live version's files under a new segment id (so
    a replica has to copy them), then its manifest, then CURRENT."""
    live_name = fs.cat_file(f"{root}/CURRENT").decode().strip()
    live = Manifest.from_json(fs.cat_file(f"{root}/versions/{live_name}.json"))
    assert len(live.segments) == 1
    segment = f"seg-{version}"
    for name in live.segments[0]["files"]:
        fs.pipe_file(f"{root}/segments/{segment}/{name}", fs.cat_file(f"{root}/segments/{live.segments[0]['id']}/{name}"))
    manifest = Manifest(**{**live.__dict__, "version": version, "parent": live.version,
                           "segments": [{**live.segments[0], "id": segment}]})
    fs.pipe_file(f"{root}/versions/{version}.json", manifest.to_json())
    fs.pipe_file(f"{root}/CURRENT", f"{version}\n".encode())
    return manifest
