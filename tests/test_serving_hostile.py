"""The serving side against what a hostile or damaged index, manifest, URL or
client sends (issue 25, items 11-14): every face answers every tree depth, a
manifest's numbers are bounded at load, bad settings are one-line refusals,
and slow clients are cut off."""
from __future__ import annotations

import http.client
import json
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import anyio
import fsspec
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient
from mcp import Client

import ritrag.serving.remote
from ritrag.layout import DamagedIndexError, IndexLayout
from ritrag.schema import MAX_TREE_DEPTH
from ritrag.serving.api import RitragIndex
from ritrag.serving.budget_store import RedisStore, redis_location
from ritrag.serving.errors import ToolError
from ritrag.serving.http import HttpSettings, ServerLimits, create_app
from ritrag.serving.mcp_server import streamable_http_app
from ritrag.serving.outline import parse_outline, preorder
from ritrag.serving.reload import VersionWatcher
from ritrag.serving.tools import ToolService
from fleet_fixtures import publish
from serving_fixtures import serving
from support import benchmark_module


def chain_index(out: Path, depth: int) -> Path:
    """An index whose one tree is a chain `depth` levels below its root (a
    reply to a reply to ...), written straight in the on-disk format and
    embedded with the hashing stand-in."""
    benchmark_module("synthetic_index").write_synthetic_index(
        str(out), nodes=depth + 1, sites=1, fanout=1, words_per_node=20, vocabulary_size=300, num_shards=1,
        factory="IDMap2,Flat")
    edit_manifest(out, lambda m: m["config"]["embedder"].update(model="hashing:384"))
    return out


def edit_manifest(index: Path, change) -> None:
    path = index / "versions" / "v000001.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


def deepest_title(index: Path) -> tuple[str, str, int]:
    """(id, title, depth) of the deepest node."""
    rows = pq.read_table(next((index / "segments").glob("*/nodes-*.parquet")),
                         columns=["node_id", "title", "depth"]).to_pylist()
    row = max(rows, key=lambda r: r["depth"])
    return row["node_id"], row["title"], row["depth"]


@pytest.fixture(scope="module")
def chains(tmp_path_factory) -> dict[int, Path]:
    """A chain as deep as the build places nodes, and one far deeper (an index
    built before that policy)."""
    return {depth: chain_index(tmp_path_factory.mktemp(f"chain{depth}"), depth) for depth in (MAX_TREE_DEPTH, 300)}


def depth_of(trees: list[dict]) -> int:
    return max(depth for _, depth in preorder(trees))


def every_face(index: Path, query: str) -> dict[str, list[dict]]:
    """The trees of one GetToC through the Python API, HTTP (JSON and
    outline) and MCP over streamable HTTP."""
    api = RitragIndex(str(index))
    service = ToolService(api)
    answers = {"api": api.get_toc(query, n=5)["trees"]}
    with TestClient(create_app(lambda: service)) as client:
        deadline = time.monotonic() + 30
        while client.get("/readyz").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        for form in ("json", "outline"):
            response = client.post("/v1/toc", json={"query": query, "n": 5, "format": form})
            assert response.status_code == 200, response.text[:300]
            body = response.json()
            answers[f"http {form}"] = body["trees"] if form == "json" else parse_outline(body["outline"])

    async def over_mcp(url: str) -> None:
        async with Client(url + "/mcp") as client:
            result = await client.call_tool("GetToC", {"query": query})
            assert not result.is_error, result.content[0].text[:300]
            answers["mcp"] = result.structured_content["trees"]

    with serving(streamable_http_app(service)) as url:
        anyio.run(over_mcp, url)
    return answers


def test_a_tree_as_deep_as_the_build_places_answers_on_every_face(chains):
    node_id, title, depth = deepest_title(chains[MAX_TREE_DEPTH])
    assert depth == MAX_TREE_DEPTH
    for face, trees in every_face(chains[MAX_TREE_DEPTH], title).items():
        assert depth_of(trees) == MAX_TREE_DEPTH, face
        assert not any("depth" in node for node, _ in preorder(trees)), face


def test_a_deeper_index_is_shown_capped_on_every_face_not_refused(chains):
    """An index deeper than the build's policy (300 levels: pydantic refused
    the HTTP answer with a 500, the MCP SDK failed to serialize it) answers
    on every face; HTTP and MCP show it at most MAX_TREE_DEPTH deep, the
    nodes below listed in order under the last level, with their depth."""
    node_id, title, depth = deepest_title(chains[300])
    answers = every_face(chains[300], title)
    assert depth_of(answers.pop("api")) == depth  # the Python API keeps the index's shape
    order = None
    for face, trees in answers.items():
        nodes = [node for node, _ in preorder(trees)]
        assert depth_of(trees) == MAX_TREE_DEPTH, face
        assert {node.get("label", node.get("id")): node.get("depth") for node in nodes}[node_id] == depth, face
        labels = [node.get("label", node.get("id")) for node in nodes]
        assert order in (None, labels), face  # the same nodes in the same order on every face
        order = labels


def run_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ritrag.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def assert_one_line_refusal(done: subprocess.CompletedProcess, status: int, reason: str, *words: str) -> None:
    assert done.returncode == status, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    error = json.loads(lines[-1])["error"]
    assert error["reason"] == reason
    for word in words:
        assert word in error["message"]


BAD_MANIFESTS = {
    "hashing:999999999": (lambda m: m["config"]["embedder"].update(model="hashing:999999999"), "hashing:N"),
    "embedding dimension": (lambda m: m["config"]["embedder"].update(dimension=10 ** 9), "config.embedder.dimension"),
    "file bytes 10**400": (lambda m: next(iter(m["segments"][0]["files"].values())).update(bytes=10 ** 400),
                           "bytes"),
    "shard count": (lambda m: m["segments"][0].update(num_shards=10 ** 7), "num_shards"),
    "segment counts": (lambda m: m["segments"][0].update(counts={"chunks": -1}), "counts.chunks"),
    "tombstones": (lambda m: m["tombstones"].update(node_id="many"), "tombstones.node_id"),
    "nprobe": (lambda m: m["config"]["dense"].update(nprobe=10 ** 9), "config.dense.nprobe"),
    "rerank": (lambda m: m["config"]["dense"].update(rerank=10 ** 6), "config.dense.rerank"),
    "bm25 k1": (lambda m: m["config"]["bm25"].update(k1=float("nan")), "config.bm25.k1"),
    "bm25 b": (lambda m: m["config"]["bm25"].update(b=7), "config.bm25.b"),
    "config a list": (lambda m: m.update(config=[]), "config is not an object"),
    "retrieval weight": (lambda m: m["config"].update(retrieval={"sparse_weight": "heavy"}),
                         "config.retrieval.sparse_weight"),
    "representation": (lambda m: m["config"].update(representation={"path_levels": "4"}),
                       "config.representation"),
    "stats": (lambda m: m["stats"].update(bm25={"n_chunks": float("inf")}), "stats.bm25.n_chunks"),
}


@pytest.mark.parametrize("case", sorted(BAD_MANIFESTS))
def test_manifest_numbers_that_size_work_are_refused_at_load(chains, tmp_path, case):
    change, field = BAD_MANIFESTS[case]
    index = Path(shutil.copytree(chains[MAX_TREE_DEPTH], tmp_path / "index"))
    edit_manifest(index, change)
    with pytest.raises(DamagedIndexError, match="not a valid manifest") as refused:
        IndexLayout(str(index)).load_manifest()
    assert field in str(refused.value)
    assert len(str(refused.value)) < 500  # 10**400 is described, not printed


@pytest.mark.parametrize("case", ["hashing:999999999", "config a list", "retrieval weight"])
def test_the_cli_refuses_a_bad_manifest_in_one_line(chains, tmp_path, case):
    """Before, a list as config or a weight that is not a number was a
    traceback, and hashing:999999999 made the query allocate 7.45 GiB (here
    under a 6 GiB address-space limit, where it could not)."""
    index = Path(shutil.copytree(chains[MAX_TREE_DEPTH], tmp_path / "index"))
    edit_manifest(index, BAD_MANIFESTS[case][0])
    limited = ("import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30)); "
               "sys.argv = ['ritrag', *sys.argv[1:]]; runpy.run_module('ritrag.cli', run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", limited, "toc", str(index), "some query"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert_one_line_refusal(done, 1, "index_unavailable", "not a valid manifest")


@pytest.mark.parametrize("retrieval", [{"fusion": "bogus"}, {"fusion": "rrf", "rrf_k": 0}])
def test_retrieval_parameters_a_server_cannot_use_are_a_one_line_refusal(chains, tmp_path, retrieval):
    """Values of the right type that name no fusion (or divide by zero) pass the
    manifest's bounds; the index refuses them at load, not as a traceback."""
    index = Path(shutil.copytree(chains[MAX_TREE_DEPTH], tmp_path / "index"))
    edit_manifest(index, lambda m: m["config"].setdefault("retrieval", {}).update(retrieval))
    done = subprocess.run([sys.executable, "-m", "ritrag.cli", "toc", str(index), "some query"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert_one_line_refusal(done, 1, "index_unavailable", "retrieval parameters")


def test_a_refused_manifest_number_leaves_metrics_answering(chains, tmp_path):
    """A version whose manifest claims a file of 10**400 bytes is refused by
    the watcher, and /metrics keeps answering, with the failure counted
    (before, the mirror's progress gauge held 10**400 and every scrape failed
    with OverflowError)."""
    uri = f"memory://ritrag-{uuid.uuid4().hex[:8]}/index"
    fs, root = fsspec.core.url_to_fs(uri)
    publish(chains[MAX_TREE_DEPTH], fs, root)
    ritrag.serving.remote._MIRRORS.clear()
    try:
        service = ToolService(RitragIndex(uri, cache_dir=str(tmp_path)))
        watchers = []

        def watch(served: ToolService) -> VersionWatcher:
            watchers.append(VersionWatcher(served, uri, interval_s=3600, cache_dir=str(tmp_path)))
            return watchers[-1]

        manifest = json.loads(fs.cat_file(f"{root}/versions/v000001.json"))
        manifest.update(version="v000002", parent="v000001")
        next(iter(manifest["segments"][0]["files"].values()))["bytes"] = 10 ** 400
        fs.pipe_file(f"{root}/versions/v000002.json", json.dumps(manifest).encode())
        fs.pipe_file(f"{root}/CURRENT", b"v000002\n")
        with TestClient(create_app(lambda: service, watch=watch)) as client:
            deadline = time.monotonic() + 30
            while client.get("/readyz").status_code != 200 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert watchers[0].check_once() is False
            assert "not a valid manifest" in watchers[0].last_error["message"]
            metrics = client.get("/metrics")
            assert metrics.status_code == 200
            assert "ritrag_reload_failures_total 1.0" in metrics.text
            assert service.index.version == "v000001"
    finally:
        ritrag.serving.remote._MIRRORS.clear()
        fsspec.filesystem("memory").rm(root.split("/")[0], recursive=True)


def test_a_cache_dir_that_is_a_file_is_a_one_line_refusal(chains, tmp_path):
    a_file = tmp_path / "cache"
    a_file.write_text("not a directory")
    done = run_cli(tmp_path, "serve", chains[MAX_TREE_DEPTH].as_uri(), "--cache_dir", str(a_file), "--port", "1")
    assert_one_line_refusal(done, 2, "invalid_arguments", "cache directory", str(a_file))


@pytest.mark.parametrize("url", ["redis://127.0.0.1:99999/0", "redis://127.0.0.1:6379/notanumber",
                                 "redis://127.0.0.1:port/0"])
def test_a_bad_budget_store_url_is_a_one_line_refusal(tmp_path, url):
    done = run_cli(tmp_path, "serve", str(tmp_path / "no-index"), "--budget_store", url, "--port", "1")
    assert_one_line_refusal(done, 2, "invalid_arguments", "budget store")


LIMITS = ServerLimits(head_timeout_s=2, body_timeout_s=2)  # deadlines that must fire: seconds, checked as fired


def closed_within(port: int, first: bytes, drip: bytes, seconds: float) -> float | None:
    """Send `first`, then `drip` every 0.1 s for at most `seconds`; the time
    at which the server closed the connection, None if it never did."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=seconds) as sock:
        sock.settimeout(0.1)
        sock.sendall(first)
        while time.monotonic() - start < seconds:
            try:
                if sock.recv(4096) == b"":
                    return time.monotonic() - start
            except socket.timeout:
                pass
            except ConnectionError:
                return time.monotonic() - start
            try:
                sock.sendall(drip)
            except ConnectionError:
                return time.monotonic() - start
    return None


def no_index() -> ToolService:
    raise RuntimeError("these tests need no index")


def refused_app(limits: ServerLimits = LIMITS) -> object:
    return create_app(no_index, HttpSettings(limits=limits))


@pytest.mark.parametrize("first, drip", [(b"", b""), (b"GET /healthz HTTP/1.1\r\nHost: x\r\n", b"X-Drip: 1\r\n")],
                         ids=["silent", "header drip"])
def test_a_slow_request_head_is_cut_off(first, drip):
    with serving(refused_app(), **LIMITS.uvicorn_options()) as url:
        closed = closed_within(int(url.rsplit(":", 1)[1]), first, drip, seconds=60)
    assert closed is not None  # cut off (a drip that is never cut off keeps the connection the whole minute)


def test_the_head_deadline_restarts_after_each_response():
    """A keep-alive connection gets a fresh deadline for each request head:
    one that answered quickly is not cut off in its second request."""
    limits = ServerLimits(head_timeout_s=6, body_timeout_s=6)  # seconds of slack a loaded machine may take
    with serving(refused_app(limits), **limits.uvicorn_options()) as url:
        connection = http.client.HTTPConnection("127.0.0.1", int(url.rsplit(":", 1)[1]), timeout=30)
        sockets = set()
        for _ in range(3):
            time.sleep(2.5)  # each under the deadline, together over it
            connection.request("GET", "/healthz")
            response = connection.getresponse()
            assert response.status == 500 and b"failed" in response.read()  # loading failed, as arranged
            sockets.add(connection.sock)
        connection.close()
    assert len(sockets) == 1  # one connection throughout


def slow_body_answer(port: int, path: str) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     "Accept: application/json, text/event-stream\r\nContent-Length: 100\r\n\r\n{\"query\":".encode())
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
        return answer


def test_a_slow_request_body_is_answered_408():
    with serving(refused_app(), **LIMITS.uvicorn_options()) as url:
        answer = slow_body_answer(int(url.rsplit(":", 1)[1]), "/v1/toc")
    assert answer.startswith(b"HTTP/1.1 408")


def test_a_slow_request_body_is_answered_408_over_mcp(chains):
    service = ToolService(RitragIndex(str(chains[MAX_TREE_DEPTH])))
    with serving(streamable_http_app(service, limits=LIMITS), **LIMITS.uvicorn_options()) as url:
        answer = slow_body_answer(int(url.rsplit(":", 1)[1]), "/mcp")
    assert answer.startswith(b"HTTP/1.1 408")


@pytest.mark.parametrize("url, where", [("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
                                        ("redis://user:secret@cache/3", "redis://cache/3"),
                                        ("rediss://cache:6380", "rediss://cache:6380"),
                                        ("unix:///run/redis.sock?db=2", "unix:///run/redis.sock")])
def test_a_redis_url_names_where_it_points_without_credentials(url, where):
    assert redis_location(url) == where


@pytest.mark.parametrize("url", ["redis://cache:99999/0", "redis://cache:0/0", "redis://cache:6379/notanumber",
                                 "redis://cache:6379/-1", "redis://cache:x/0", "unix://", "http://cache:6379/0",
                                 "redis://cache:6379/0?socket_timeout=soon"])
def test_a_bad_redis_url_is_refused_before_connecting(url):
    with pytest.raises(ToolError) as refused:
        RedisStore(url)
    assert refused.value.reason == "invalid_arguments" and "budget store" in refused.value.message
