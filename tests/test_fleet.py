"""A fleet end to end: two `ritrag serve` processes on one index in an
S3-compatible store (moto's server mode on 127.0.0.1) sharing episodes in a
real Redis. One budget whichever replica a call lands on; a new version
picked up by both with no failed request; a damaged object refused while the
old version keeps serving; a Redis outage answered with 503s, then recovery."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from fleet_fixtures import RedisServer, free_port, needs_redis, publish, publish_copy_as

pytestmark = [pytest.mark.slow, needs_redis]
BUCKET = "ritrag-fleet"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture
def s3(monkeypatch):
    """(s3fs filesystem, endpoint) of a moto S3 server with one bucket."""
    s3fs = pytest.importorskip("s3fs")
    moto_server = pytest.importorskip("moto.server")
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    fs = s3fs.S3FileSystem(endpoint_url=endpoint, key="testing", secret="testing", skip_instance_cache=True)
    fs.mkdir(BUCKET)
    yield fs, endpoint
    server.stop()


def start_replica(uri: str, endpoint: str, redis_url: str, cache_dir: str) -> tuple[subprocess.Popen, str]:
    """A `ritrag serve` process; its log goes to CACHE_DIR.log."""
    port = free_port()
    env = {**os.environ, **CREDENTIALS, "FSSPEC_S3_ENDPOINT_URL": endpoint}
    process = subprocess.Popen(
        [sys.executable, "-m", "ritrag.cli", "serve", uri, "--port", str(port), "--cache_dir", cache_dir,
         "--watch_s", "0.3", "--budget_store", redis_url, "--max_calls", "10", "--max_toc_calls", "3"],
        env=env, stdout=subprocess.DEVNULL, stderr=open(f"{cache_dir}.log", "wb"))
    return process, f"http://127.0.0.1:{port}"


def wait_until(predicate, timeout_s: float = 120.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def ready_version(client: httpx.Client) -> str | None:
    try:
        response = client.get("/readyz")
    except httpx.TransportError:
        return None
    return response.json()["version"] if response.status_code == 200 else None


def test_two_replicas_on_an_object_store_index_share_episodes_and_follow_versions(
        s3, tiny_hash_index, tmp_path):
    fs, endpoint = s3
    root = f"{BUCKET}/index"
    publish(tiny_hash_index, fs, root)
    redis_server = RedisServer(tmp_path).start()
    replicas = [start_replica(f"s3://{root}", endpoint, redis_server.url, str(tmp_path / f"cache{i}")) for i in (0, 1)]
    clients = [httpx.Client(base_url=url, timeout=30) for _, url in replicas]
    try:
        for (process, _), client in zip(replicas, clients):
            wait_until(lambda: ready_version(client) == "v000001" or process.poll() is not None, what="ready")
            assert process.poll() is None, open(f"{tmp_path}/cache{clients.index(client)}.log").read()[-3000:]
        a, b = clients

        # One budget: the 4th GetToC of an episode is refused whichever replica gets it.
        episode = {"episode_id": f"ep-{uuid.uuid4().hex[:8]}"}
        statuses = [client.post("/v1/toc", json={"query": "tls", **episode}).status_code for client in (a, b, a)]
        assert statuses == [200, 200, 200]
        for client in (b, a):
            refused = client.post("/v1/toc", json={"query": "tls", **episode})
            assert refused.status_code == 429 and refused.json()["error"]["budget"]["get_toc_left"] == 0

        # Many threads on both replicas never exceed the episode's 10 calls, 3 of them GetToC.
        node = a.post("/v1/toc", json={"query": "tls"}).json()["trees"][0]["id"]
        episode = {"episode_id": f"ep-{uuid.uuid4().hex[:8]}"}

        def call(i: int) -> tuple[bool, int]:
            toc = i % 3 == 0
            response = clients[i % 2].post("/v1/toc" if toc else "/v1/read",
                                           json={"query": "tls", **episode} if toc else {"node_ids": [node], **episode})
            assert response.status_code in (200, 429), response.text
            return toc, response.status_code

        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(call, range(60)))
        assert sum(status == 200 for _, status in results) == 10
        assert sum(status == 200 for toc, status in results if toc) <= 3

        # A new version: both replicas swap to it, and no request fails meanwhile.
        stop, outcomes = threading.Event(), []

        def hammer(client: httpx.Client) -> None:
            while not stop.is_set():
                response = client.post("/v1/toc", json={"query": "log rotation"})
                outcomes.append((response.status_code, response.json().get("version")))

        threads = [threading.Thread(target=hammer, args=(client,)) for client in clients for _ in range(2)]
        for thread in threads:
            thread.start()
        publish_copy_as(fs, root, "v000002")
        for client in clients:
            wait_until(lambda: ready_version(client) == "v000002", what="the swap to v000002")
        time.sleep(0.5)
        stop.set()
        for thread in threads:
            thread.join()
        assert {status for status, _ in outcomes} == {200}
        assert {version for _, version in outcomes} == {"v000001", "v000002"}

        # A damaged object: refused by both, which keep serving the version they have.
        manifest = publish_copy_as(fs, root, "v000003")
        segment = manifest.segments[0]
        name = max(segment["files"], key=lambda n: segment["files"][n]["bytes"])
        path = f"{root}/segments/{segment['id']}/{name}"
        fs.pipe_file(path, fs.cat_file(path)[:-10])  # truncated
        for client in clients:
            wait_until(lambda: client.get("/readyz").json()["reload"]["failures"] >= 1, what="a refused version")
            assert ready_version(client) == "v000002"
            assert client.post("/v1/toc", json={"query": "tls"}).status_code == 200
            assert "ritrag_cache_files_refused_total" in client.get("/metrics").text

        # Redis stopped: counted calls get a 503 with the reason; back when it returns.
        episode = {"episode_id": f"ep-{uuid.uuid4().hex[:8]}"}
        redis_server.stop()
        for client in clients:
            during = client.post("/v1/toc", json={"query": "tls", **episode})
            assert during.status_code == 503 and during.json()["error"]["reason"] == "budget_store_unavailable"
        redis_server.start()
        for client in clients:
            assert client.post("/v1/toc", json={"query": "tls", **episode}).status_code == 200
    finally:
        for process, _ in replicas:
            process.terminate()
            process.wait(timeout=20)
        for client in clients:
            client.close()
        redis_server.stop()
