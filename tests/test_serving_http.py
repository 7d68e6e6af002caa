"""The HTTP face over a real socket with a real client (httpx), on the tiny index."""
from __future__ import annotations

import re
import threading
import time

import httpx
import pytest

from ritrag.serving.budget import Budget, EpisodeBudgets
from ritrag.serving.http import HttpSettings, create_app
from ritrag.serving.tools import ToolService
from serving_fixtures import loaded_index, serving


def wait_ready(client: httpx.Client) -> None:
    for _ in range(600):
        if client.get("/readyz").status_code == 200:
            return
        threading.Event().wait(0.05)
    raise AssertionError("never ready")


@pytest.fixture(scope="module")
def service(tiny_index) -> ToolService:
    return ToolService(loaded_index(str(tiny_index)), budgets=EpisodeBudgets(Budget(calls=4, toc_calls=2)))


@pytest.fixture(scope="module")
def client(service) -> httpx.Client:
    with serving(create_app(lambda: service)) as url, httpx.Client(base_url=url, timeout=30) as client:
        wait_ready(client)
        yield client


def walk(trees):
    for tree in trees:
        yield tree
        yield from walk(tree.get("children", []))


def test_get_toc_then_read_round_trip(client):
    response = client.post("/v1/toc", json={"query": "which port does version 3 listen on", "n": 3})
    assert response.status_code == 200
    toc = response.json()
    assert toc["hits"] == 3 and "outline" not in toc and "budget" not in toc
    best = max((e for e in walk(toc["trees"]) if e["hit"]), key=lambda e: e["score"])
    read = client.post("/v1/read", json={"node_ids": [best["id"], "nosuchnode00"], "max_chars": 10}).json()
    assert read["unknown_ids"] == ["nosuchnode00"]
    (node,) = read["nodes"]
    assert node["path"] == ["Shop Server", "Version 3"] and len(node["text"]) == 10 and node["next_offset"] == 10
    rest = client.post("/v1/read", json={"node_ids": [best["id"]], "offset": 10}).json()["nodes"][0]
    assert "next_offset" not in rest and len(node["text"] + rest["text"]) == node["total_chars"]


def test_toc_formats(client):
    both = client.post("/v1/toc", json={"query": "log rotation", "format": "both"}).json()
    assert both["trees"] and both["outline"].count("\n") + 1 == len(list(walk(both["trees"])))
    assert both["tokens"]["tokenizer"] == "o200k_base" and both["tokens"]["outline"] < both["tokens"]["json"]
    outline = client.post("/v1/toc", json={"query": "log rotation", "format": "outline"}).json()
    assert "trees" not in outline and outline["outline"] == both["outline"]


def test_budget_is_enforced_per_episode(client):
    episode = {"episode_id": "http-episode"}
    for left in (3, 2):
        assert client.post("/v1/toc", json={"query": "tls", **episode}).json()["budget"]["calls_left"] == left
    refused = client.post("/v1/toc", json={"query": "tls", **episode})
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert error["reason"] == "budget_exhausted"
    assert error["budget"] == {"episode_id": "http-episode", "calls_left": 2, "get_toc_left": 0}
    toc = client.post("/v1/toc", json={"query": "tls"}).json()  # another episode, or none, is not affected
    node = next(walk(toc["trees"]))["id"]
    assert client.post("/v1/read", json={"node_ids": [node], **episode}).status_code == 200
    assert client.post("/v1/read", json={"node_ids": [node], **episode}).status_code == 200
    assert client.post("/v1/read", json={"node_ids": [node], **episode}).json()["error"]["budget"]["calls_left"] == 0


@pytest.mark.parametrize("path, body, status, reason", [
    ("/v1/toc", {"query": ""}, 422, "invalid_arguments"),
    ("/v1/toc", {"query": "   "}, 422, "invalid_arguments"),
    ("/v1/toc", {}, 422, "invalid_arguments"),
    ("/v1/toc", {"query": 42}, 422, "invalid_arguments"),
    ("/v1/toc", {"query": ["a"]}, 422, "invalid_arguments"),
    ("/v1/toc", {"query": "x", "n": 0}, 422, "invalid_arguments"),
    ("/v1/toc", {"query": "x", "n": 10_000}, 422, "limit_exceeded"),
    ("/v1/toc", {"query": "x", "format": "xml"}, 422, "invalid_arguments"),
    ("/v1/toc", {"query": "x", "surprise": 1}, 422, "invalid_arguments"),
    ("/v1/toc", {"query": "x" * 1001}, 422, "limit_exceeded"),
    ("/v1/toc", {"query": "x" * 100_000}, 413, "request_too_large"),
    ("/v1/toc", {"query": "x", "episode_id": ""}, 422, "invalid_arguments"),
    ("/v1/read", {"node_ids": []}, 422, "invalid_arguments"),
    ("/v1/read", {"node_ids": "4p7spzvs7o5i"}, 422, "invalid_arguments"),
    ("/v1/read", {"node_ids": [1, 2]}, 422, "invalid_arguments"),
    ("/v1/read", {"node_ids": ["nosuchnode00"]}, 404, "unknown_ids"),
    ("/v1/read", {"node_ids": ["a"] * 21}, 422, "limit_exceeded"),
    ("/v1/read", {"node_ids": [f"n{i:011d}" for i in range(10_000)]}, 413, "request_too_large"),
    ("/v1/read", {"node_ids": ["x"], "offset": -1}, 422, "invalid_arguments"),
    ("/v1/read", {"node_ids": ["x"], "max_chars": 10 ** 9}, 422, "limit_exceeded"),
    ("/v1/read", {"node_ids": ["x" * 65]}, 422, "invalid_arguments"),
])
def test_bad_inputs_get_a_4xx_with_a_reason(client, path, body, status, reason):
    response = client.post(path, json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["reason"] == reason and error["message"]
    assert "Traceback" not in response.text and len(response.text) < 4000  # no echo of huge inputs


def test_malformed_bodies_routes_and_methods(client):
    for content in (b'{"query":', b"not json", "{\"query\": \"\udc80\"}".encode("utf-8", "surrogatepass")):
        response = client.post("/v1/toc", content=content, headers={"content-type": "application/json"})
        assert response.status_code == 422 and response.json()["error"]["reason"] == "invalid_arguments"
    assert client.get("/v1/nothing").json()["error"]["reason"] == "not_found"
    assert client.get("/v1/toc").json()["error"]["reason"] == "method_not_allowed"


def test_probes_metrics_openapi_and_tools(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz").json()
    assert ready["status"] == "ready" and ready["budget"] == {"calls": 4, "toc_calls": 2}
    index = ready["index"]  # which index: the last part of its path, and what the live version holds
    assert index["name"] and "/" not in index["name"] and index["nodes"] > index["chunks"] / 100 > 0
    metrics = client.get("/metrics").text
    assert 'ritrag_http_requests_total{route="/v1/toc",status="200"}' in metrics
    assert "ritrag_ready 1.0" in metrics and "process_resident_memory_bytes" in metrics
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/v1/toc", "/v1/read", "/v1/tools"} <= set(paths)
    assert client.get("/v1/tools", params={"format": "anthropic"}).json()[0]["name"] == "GetToC"
    assert "access-control-allow-origin" not in client.post(
        "/v1/toc", json={"query": "tls"}, headers={"origin": "https://elsewhere.example"}).headers


def test_api_key_and_cors_when_configured(service):
    settings = HttpSettings(api_key="s3cret", cors_origins=("https://app.example",))
    with serving(create_app(lambda: service, settings)) as url, httpx.Client(base_url=url) as client:
        wait_ready(client)
        refused = client.post("/v1/toc", json={"query": "tls"})
        assert refused.status_code == 401 and refused.json()["error"]["reason"] == "unauthorized"
        assert client.get("/metrics").status_code == 401
        assert client.post("/v1/toc", json={"query": "tls"}, headers={"x-api-key": "wrong"}).status_code == 401
        ok = client.post("/v1/toc", json={"query": "tls"},
                         headers={"authorization": "Bearer s3cret", "origin": "https://app.example"})
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "https://app.example"
        assert client.get("/healthz").status_code == 200 and client.get("/").status_code == 200
        for open_path in ("/docs", "/redoc", "/openapi.json", "/docs-assets/swagger-ui-bundle.js"):
            assert client.get(open_path).status_code == 200, open_path


def test_api_pages_load_nothing_from_elsewhere(client):
    """/docs and /redoc name only this server's files: offline they still render."""
    for page in ("/docs", "/redoc"):
        html = client.get(page).text
        assert "/openapi.json" in html
        assets = re.findall(r'(?:src|href)="([^"]+)"', html)
        assert assets and all(a.startswith("/docs-assets/") for a in assets), assets
        assert "://" not in html.replace("http://www.w3.org", "")
        for asset in assets:
            response = client.get(asset)
            assert response.status_code == 200 and len(response.content) > 1000, asset


def test_liveness_before_readiness_and_after_a_failed_load(service):
    release = threading.Event()

    def slow_load() -> ToolService:
        release.wait(30)
        return service

    with serving(create_app(slow_load)) as url, httpx.Client(base_url=url) as client:
        assert client.get("/healthz").status_code == 200
        assert client.get("/readyz").json()["error"]["reason"] == "not_ready"
        assert client.post("/v1/toc", json={"query": "tls"}).status_code == 503
        release.set()
        wait_ready(client)

    def broken_load() -> ToolService:
        raise FileNotFoundError("/no/such/index")

    with serving(create_app(broken_load)) as url, httpx.Client(base_url=url) as client:
        for _ in range(100):
            if client.get("/healthz").status_code == 500:
                break
            threading.Event().wait(0.05)
        assert client.get("/healthz").json()["status"] == "failed"
        assert "/no/such/index" in client.get("/readyz").json()["error"]["message"]


def test_a_lone_surrogate_in_a_node_id_is_refused_not_a_500(client):
    for body in ('{"node_ids": ["\\ud800"]}', '{"node_ids": ["ok", "\\udfff"]}'):
        response = client.post("/v1/read", content=body, headers={"content-type": "application/json"})
        assert response.status_code == 422 and response.json()["error"]["reason"] == "invalid_arguments"


@pytest.mark.parametrize("body", [{"query": "tls", "k": "7"}, {"query": "tls", "k": True}, {"query": "tls", "n": 2.0},
                                  {"query": "tls", "n": "3"}])
def test_numbers_must_be_json_integers(client, body):
    response = client.post("/v1/toc", json=body)
    assert response.status_code == 422 and response.json()["error"]["reason"] == "invalid_arguments"


def test_a_non_ascii_api_key_matches_its_utf8_bytes(service):
    from fastapi.testclient import TestClient

    with TestClient(create_app(lambda: service, HttpSettings(api_key="clé-ß"))) as local:
        ok = local.get("/metrics", headers={"X-API-Key": "clé-ß".encode()})
        assert ok.status_code == 200
        assert local.get("/metrics", headers={"X-API-Key": "cle-ss"}).status_code == 401
        assert local.get("/metrics", headers={"Authorization": b"Bearer cl\xc3\xa9-\xc3\x9f"}).status_code == 200


def test_health_shows_why_loading_failed_only_with_the_key():
    from fastapi.testclient import TestClient

    def load():
        raise FileNotFoundError("/secret/place/versions/v000001.json")

    with TestClient(create_app(load, HttpSettings(api_key="k"))) as local:
        for _ in range(200):
            if local.get("/healthz").status_code == 500:
                break
            threading.Event().wait(0.02)
        anonymous, keyed = local.get("/healthz"), local.get("/healthz", headers={"X-API-Key": "k"})
        assert anonymous.status_code == keyed.status_code == 500
        assert "secret" not in anonymous.text and "/secret/place" in keyed.text
        assert "secret" not in local.get("/readyz").text


def test_readyz_and_metrics_report_failed_reloads(tiny_hash_index, tmp_path):
    import shutil

    from fastapi.testclient import TestClient

    from ritrag.serving.reload import VersionWatcher

    index = tmp_path / "idx"
    shutil.copytree(tiny_hash_index, index)
    (index / "CURRENT").write_bytes(b"\xef\xbb\xbfv000002\n")
    service = ToolService(loaded_index(str(tiny_hash_index)))
    app = create_app(lambda: service, watch=lambda s: VersionWatcher(s, str(index), interval_s=0.05))
    with TestClient(app) as local:
        for _ in range(400):
            ready = local.get("/readyz")
            if ready.status_code == 200 and ready.json()["reload"]["failures"] >= 1:
                break
            threading.Event().wait(0.02)
        assert ready.status_code == 200 and ready.json()["reload"]["last_error"]["message"].startswith("Damaged")
        assert "ritrag_reload_failures_total" in local.get("/metrics").text


def test_an_index_not_published_yet_is_tried_again_until_it_loads(service):
    """A server started before the first build published (or on a damaged
    version) says why in one line, stays alive, and becomes ready by itself."""
    from ritrag.layout import MissingIndexError

    attempts = []

    def load() -> ToolService:
        attempts.append(time.monotonic())
        if len(attempts) < 3:
            raise MissingIndexError("idx: no published version (CURRENT is missing)")
        return service

    with serving(create_app(load, HttpSettings(load_retry_s=0.2))) as url, httpx.Client(base_url=url) as client:
        waiting = client.get("/healthz")
        assert waiting.status_code == 200 and waiting.json()["status"] in ("waiting", "ok")
        refused = client.post("/v1/toc", json={"query": "tls"})
        assert refused.status_code in (200, 503)
        wait_ready(client)
        assert len(attempts) == 3 and client.get("/healthz").json() == {"status": "ok"}
