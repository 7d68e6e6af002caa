"""Episode budgets and memory shared through a real Redis (serving.budget_store):
two services stand for two replicas behind one load balancer."""
from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient

from ritrag.serving.budget import GET_TOC, READ, Budget
from ritrag.serving.budget_store import redis_episode_state
from ritrag.serving.errors import ToolError
from ritrag.serving.http import create_app
from ritrag.serving.tools import ToolService
from fleet_fixtures import RedisServer, needs_redis
from serving_fixtures import loaded_index

pytestmark = needs_redis


@pytest.fixture
def redis_server(tmp_path):
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()


def replicas(index, url: str, count: int = 2, budget: Budget = Budget(calls=6, toc_calls=3), **options):
    return [ToolService(index, budgets=state[0], episodes=state[1])
            for state in (redis_episode_state(url, budget, **options) for _ in range(count))]


def episode() -> str:
    return f"ep-{uuid.uuid4().hex[:8]}"


def test_two_replicas_share_one_budget(tiny_hash_index, redis_server):
    a, b = replicas(loaded_index(str(tiny_hash_index)), redis_server.url)
    ep = episode()
    lefts = [svc.get_toc("log rotation", episode_id=ep)["budget"]["get_toc_left"] for svc in (a, b, a)]
    assert lefts == [2, 1, 0]
    for svc in (a, b):  # the 4th GetToC is refused whichever replica gets it
        with pytest.raises(ToolError) as refused:
            svc.get_toc("tls", episode_id=ep)
        assert refused.value.reason == "budget_exhausted" and refused.value.details["budget"]["calls_left"] == 3


def test_concurrent_calls_never_exceed_the_budget(tiny_hash_index, redis_server):
    budgets = [replica.budgets for replica in replicas(loaded_index(str(tiny_hash_index)), redis_server.url, 4)]
    ep = episode()

    def call(i: int) -> bool:
        try:
            budgets[i % 4].charge(ep, GET_TOC if i % 2 else READ)
            return True
        except ToolError as error:
            assert error.reason == "budget_exhausted"
            return False

    with ThreadPoolExecutor(16) as pool:
        granted = list(pool.map(call, range(64)))
    assert sum(granted) == 6  # the calls budget, of which at most 3 GetToC
    assert sum(ok for i, ok in enumerate(granted) if i % 2) <= 3


def test_handles_and_read_marks_hold_across_replicas(tiny_hash_index, redis_server):
    a, b = replicas(loaded_index(str(tiny_hash_index)), redis_server.url)
    ep = episode()
    toc = a.get_toc("which port does version 3 listen on", episode_id=ep, format="both")
    first = toc["trees"][0]["id"]  # line 1 of the episode's first outline answer: handle a1
    assert [(n["id"], n["handle"]) for n in b.read(["a1"], episode_id=ep)["nodes"]] == [(first, "a1")]
    marked = a.get_toc("which port does version 3 listen on", episode_id=ep)
    assert [node["id"] for node in walk(marked["trees"]) if node.get("read")] == [first]
    with pytest.raises(ToolError, match="unknown handles a1"):
        b.read(["a1"], episode_id=episode())  # another episode's handles are not this one's


def test_old_answers_handles_are_forgotten_whole(redis_server):
    from ritrag.serving.budget_store import RedisEpisodeMemory, RedisStore

    memory = RedisEpisodeMemory(RedisStore(redis_server.url), max_handles=5, max_read=2)
    ep = episode()
    assert memory.issue_handles(ep, ["p", "q", "r"]) == "a"
    assert memory.issue_handles(ep, ["s", "t", "u"]) == "b"  # 6 ids > 5: answer a is forgotten whole
    assert memory.resolve(ep, ["a1", "b2", "b4"]) == ({"b2": "t"}, ["a1", "b4"])
    memory.mark_read(ep, ["x", "y"])
    memory.mark_read(ep, ["z", "x"])
    assert memory.read_ids(ep) == {"z", "x"}  # the 2 most recently read


def walk(trees):
    for tree in trees:
        yield tree
        yield from walk(tree.get("children", []))


def test_an_expired_episode_starts_fresh(tiny_hash_index, redis_server):
    (a,) = replicas(loaded_index(str(tiny_hash_index)), redis_server.url, 1,
                    budget=Budget(calls=2, toc_calls=1), idle_s=5)
    ep = episode()
    a.budgets.charge(ep, GET_TOC)
    with pytest.raises(ToolError):
        a.budgets.charge(ep, GET_TOC)
    time.sleep(6)  # past idle_s; the two charges before it have idle_s between them on a loaded machine
    assert a.budgets.charge(ep, GET_TOC)["get_toc_left"] == 0


@pytest.mark.parametrize("failure", ["closed", "open"])
def test_an_outage_is_a_503_with_a_reason_then_recovers(tiny_hash_index, redis_server, failure):
    budgets, episodes = redis_episode_state(redis_server.url, Budget(), fail_open=failure == "open")
    service = ToolService(loaded_index(str(tiny_hash_index)), budgets=budgets, episodes=episodes)
    ep = {"episode_id": episode()}
    with TestClient(create_app(lambda: service)) as client:
        for _ in range(600):
            if client.get("/readyz").status_code == 200:
                break
            threading.Event().wait(0.05)
        assert client.post("/v1/toc", json={"query": "tls", **ep}).json()["budget"]["calls_left"] == 9
        redis_server.stop()
        during = client.post("/v1/toc", json={"query": "tls", "format": "outline", **ep})
        assert client.post("/v1/toc", json={"query": "tls"}).status_code == 200  # no episode: nothing to count
        if failure == "closed":
            assert during.status_code == 503
            error = during.json()["error"]
            assert error["reason"] == "budget_store_unavailable" and error["store"] == redis_server.url
        else:
            assert during.status_code == 200 and "budget" not in during.json() and during.json()["outline"]
        redis_server.start()  # the same port: the pooled connections reconnect
        after = client.post("/v1/toc", json={"query": "tls", **ep})
        # counted again; this Redis keeps no data across a restart (docs/FLEET.md: persistence), so afresh
        assert after.status_code == 200 and after.json()["budget"]["calls_left"] == 9
        metrics = client.get("/metrics").text
        assert 'ritrag_budget_store_errors_total{op="charge"}' in metrics
        assert 'ritrag_budget_store_seconds_count{op="charge"}' in metrics


def test_a_bad_store_url_is_refused():
    with pytest.raises(ToolError, match="neither memory nor a Redis URL"):
        redis_episode_state("http://127.0.0.1:1", Budget())
