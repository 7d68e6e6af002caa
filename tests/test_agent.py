"""The agent loop end to end through real HTTP: a local OpenAI-compatible
server (FastAPI under uvicorn, in a thread) plays scripted tool-calling
policies, chosen by the request's model name, over the tiny site indexed with
the hashing stand-in. The policies read what the tools return, as a model
would; no model weights are involved, so these numbers test the loop only."""
from __future__ import annotations

import asyncio
import json
import math
import re
from collections import defaultdict
from typing import Any, Callable

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ritrag.cli import main
from ritrag.evaluation.agent import judge_answer, parse_judge_reply, run_agent
from ritrag.evaluation.eval import node_prf
from ritrag.serving.outline import parse_outline
from ritrag.serving.tool_models import tool_definitions
from ritrag.serving.tools import ToolService
from serving_fixtures import loaded_index, serving

QUESTION = "Which port does version 3 of the shop server listen on?"
MAX_REQUESTS = 40  # per model name: a loop that does not stop fails instead of hanging


def tool_messages(body: dict) -> list[dict]:
    return [m for m in body["messages"] if m["role"] == "tool"]


def calls(body: dict, *calls: tuple[str, Any]) -> dict:
    """An assistant message calling tools; arguments given as a str are sent as is."""
    n = len(tool_messages(body))
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call_{n + i}", "type": "function",
         "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}
        for i, (name, args) in enumerate(calls)]}


def say(text: str) -> dict:
    return {"role": "assistant", "content": text}


def find(trees: list[dict], *titles: str) -> str:
    """The id of the node at the title path `titles` below any root."""
    def walk(nodes: list[dict], path: tuple[str, ...]) -> str | None:
        for node in nodes:
            if node["title"] == path[0]:
                if len(path) == 1:
                    return node.get("id") or node["label"]
                found = walk(node.get("children", []), path[1:])
                if found:
                    return found
            found = walk(node.get("children", []), path)
            if found:
                return found
        return None

    found = walk(trees, titles)
    assert found, titles
    return found


def normal(body: dict) -> dict:
    """GetToC, Read the v3 configuration page from the map, answer from its text."""
    seen = tool_messages(body)
    if not seen:
        return calls(body, ("GetToC", {"query": "which port does version 3 listen on"}))
    content = seen[-1]["content"]
    if content.startswith("GetToC "):  # the outline form, as a model reads it: handles for ids
        trees = parse_outline(content.split("\n", 1)[1])
    else:
        trees = json.loads(content).get("trees")
    if trees:
        return calls(body, ("Read", {"node_ids": [find(trees, "Version 3", "Configuring the server")],
                                     "offset": None}))
    last = json.loads(content)
    port = re.search(r"listens on port (\d+)", last["nodes"][0]["text"]).group(1)
    return say(f"Version 3 listens on port {port}.")


def look_alikes(body: dict) -> dict:
    """Read both "Configuring the server" pages, then (in a second Read, after
    a second GetToC) the v3 logging page."""
    seen = tool_messages(body)
    if not seen:
        return calls(body, ("GetToC", {"query": "configuring the server"}))
    if len(seen) == 1:
        trees = json.loads(seen[0]["content"])["trees"]
        return calls(body, ("Read", {"node_ids": [find(trees, "Version 3", "Configuring the server"),
                                                  find(trees, "Version 2", "Configuring the server")],
                                     "offset": None}))
    if len(seen) == 2:
        return calls(body, ("GetToC", {"query": "logging"}))
    if len(seen) == 3:
        trees = json.loads(seen[2]["content"])["trees"]
        return calls(body, ("Read", {"node_ids": [find(trees, "Version 3", "Logging")], "offset": None}))
    return say("Port 9443.")


def four_tocs(body: dict) -> dict:
    seen = tool_messages(body)
    if len(seen) < 4:
        return calls(body, ("GetToC", {"query": f"shop server port, attempt {len(seen) + 1}"}))
    return say("I could not read anything.")


def read_forever(body: dict) -> dict:
    if "tools" not in body:
        return say("final answer without tools")
    seen = tool_messages(body)
    if not seen:
        return calls(body, ("GetToC", {"query": "logging rotation"}))
    trees = json.loads(seen[0]["content"])["trees"]
    return calls(body, ("Read", {"node_ids": [find(trees, "Logging")], "offset": None}))


MALFORMED = [("GetToC", '{"query": "ports'), ("Search", {"query": "ports"}), ("GetToC", {"query": 5}),
             ("Read", {"node_ids": "abc", "offset": None}), ("GetToC", {"query": "ports", "k": 5}),
             ("GetToC", "[1, 2]")]


def malformed_then_fixed(body: dict) -> dict:
    seen = tool_messages(body)
    if not seen:
        return calls(body, *MALFORMED)
    if len(seen) == len(MALFORMED):
        return calls(body, ("GetToC", {"query": "ports"}))
    return say("done")


def judge(reply: str) -> Callable[[dict], dict]:
    return lambda body: say(reply)


POLICIES: dict[str, Callable[[dict], dict]] = {
    "normal": normal, "slow": normal, "look-alikes": look_alikes, "four-tocs": four_tocs, "read-forever": read_forever, "malformed": malformed_then_fixed,
    "judge-fenced": judge('Here is my grade:\n```json\n{"score": 0.5, "reason": "partly right"}\n```'),
    "judge-prose": judge("Score: 1 - the answer matches the reference."),
    "judge-unparsable": judge("The answer looks fine to me."),
    "judge-out-of-range": judge('{"score": 7, "reason": "very good"}'),
}


class ScriptedEndpoint:
    """POST /chat/completions answered by the policy the model name picks;
    every request is kept (body and Authorization header)."""

    def __init__(self):
        self.requests: dict[str, list[dict]] = defaultdict(list)
        self.app = FastAPI()
        self.app.post("/v1/chat/completions")(self.complete)

    async def complete(self, request: Request):
        body = await request.json()
        model = body["model"]
        self.requests[model].append({"body": body, "authorization": request.headers.get("authorization")})
        if len(self.requests[model]) > MAX_REQUESTS:
            return JSONResponse({"error": {"message": "too many requests in this test"}}, status_code=400)
        if model == "fails":
            return JSONResponse({"error": {"message": "the model crashed"}}, status_code=500)
        if model == "not-a-completion":
            return {"object": "list", "data": []}
        if model == "slow":
            await asyncio.sleep(10)  # far past the caller's deadline, however loaded the machine
        message = POLICIES[model](body)
        return {"id": "chatcmpl-test", "object": "chat.completion", "model": model,
                "choices": [{"index": 0, "message": message,
                             "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 7, "total_tokens": 107}}


@pytest.fixture(scope="module")
def endpoint():
    scripted = ScriptedEndpoint()
    with serving(scripted.app) as url:
        yield scripted, url + "/v1"


@pytest.fixture(scope="module")
def service(tiny_hash_index) -> ToolService:
    return ToolService(loaded_index(str(tiny_hash_index)))


def rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_an_episode_reads_the_chosen_node_and_answers(endpoint, service, tmp_path):
    scripted, url = endpoint
    result = run_agent(service, QUESTION, base_url=url, model="normal", transcript_path=str(tmp_path / "t.jsonl"))
    v3_config = find(service.index.get_toc("configuring the server version 3")["trees"],
                     "Version 3", "Configuring the server")
    assert result.error is None and result.stop == "answered"
    assert result.answer == "Version 3 listens on port 9443."
    assert result.nodes_read == [v3_config]
    assert (result.calls, result.toc_calls, result.model_calls) == (2, 1, 3)
    assert (result.prompt_tokens, result.completion_tokens) == (300, 21)

    first = scripted.requests["normal"][0]["body"]
    assert first["tools"] == tool_definitions("openai")
    assert "at most 10 tool calls" in first["messages"][0]["content"]
    assert first["messages"][1] == {"role": "user", "content": QUESTION}

    transcript = rows(tmp_path / "t.jsonl")
    assert transcript == result.transcript
    assert [r["event"] for r in transcript] == ["start", "model", "tool", "model", "tool", "model", "end"]
    toc, read = transcript[2], transcript[4]
    assert toc["tool"] == "GetToC" and json.loads(toc["arguments"]) == {"query": "which port does version 3 listen on"}
    assert toc["hits"] > 0 and toc["budget"]["calls_left"] == 9 and toc["budget"]["get_toc_left"] == 2
    assert read["tool"] == "Read" and read["node_ids"] == [v3_config] and read["charged"]
    for row in (toc, read):
        assert row["result_chars"] > 0 and 0 < row["result_tokens"] < row["result_chars"]
    assert transcript[1]["usage"]["prompt_tokens"] == 100 and transcript[1]["tool_calls"][0]["name"] == "GetToC"
    assert transcript[-1]["answer"] == result.answer and transcript[-1]["nodes_read"] == [v3_config]


def test_a_fourth_get_toc_is_refused_in_the_structured_form(endpoint, service):
    scripted, url = endpoint
    result = run_agent(service, QUESTION, base_url=url, model="four-tocs")
    assert result.error is None and result.stop == "answered"
    assert (result.calls, result.toc_calls) == (3, 3)
    refusal = json.loads(tool_messages(scripted.requests["four-tocs"][-1]["body"])[3]["content"])
    assert refusal["error"]["reason"] == "budget_exhausted"
    assert "Read is still allowed" in refusal["error"]["message"]
    assert refusal["error"]["budget"]["calls_left"] == 7 and refusal["error"]["budget"]["get_toc_left"] == 0
    fourth = [r for r in result.transcript if r["event"] == "tool"][3]
    assert fourth["error"]["reason"] == "budget_exhausted" and not fourth["charged"]


def test_the_episode_stops_when_the_budget_is_spent(endpoint, service):
    scripted, url = endpoint
    result = run_agent(service, QUESTION, base_url=url, model="read-forever")
    assert result.error is None and result.stop == "budget_spent"
    assert (result.calls, result.toc_calls, result.model_calls) == (10, 1, 11)
    assert result.answer == "final answer without tools"
    assert len(result.nodes_read) == 1  # the same node read nine times counts once
    requests = scripted.requests["read-forever"]
    assert len(requests) == 11 and all("tools" in r["body"] for r in requests[:10])
    last = requests[-1]["body"]
    assert "tools" not in last and "budget is spent" in last["messages"][-1]["content"]


def test_a_smaller_budget_is_enforced_by_the_service(endpoint, service):
    _, url = endpoint
    result = run_agent(service, QUESTION, base_url=url, model="read-forever", max_calls=3, max_toc=1)
    assert (result.calls, result.toc_calls, result.stop) == (3, 1, "budget_spent")


def test_malformed_tool_arguments_get_an_actionable_error_and_the_loop_goes_on(endpoint, service):
    scripted, url = endpoint
    result = run_agent(service, QUESTION, base_url=url, model="malformed")
    assert result.error is None and result.stop == "answered" and result.answer == "done"
    assert (result.calls, result.toc_calls) == (1, 1)  # only the valid call was charged
    answers = [json.loads(m["content"])["error"] for m in
               tool_messages(scripted.requests["malformed"][1]["body"])]
    assert [a["reason"] for a in answers] == ["invalid_arguments", "unknown_tool", "invalid_arguments",
                                              "invalid_arguments", "invalid_arguments", "invalid_arguments"]
    bad_json, unknown, wrong_type, not_a_list, extra_field, not_an_object = answers
    assert "not valid JSON" in bad_json["message"] and "fields: query" in bad_json["message"]
    assert "GetToC" in unknown["message"] and "Read" in unknown["message"]
    assert wrong_type["errors"][0]["field"] == "query"
    assert not_a_list["errors"][0]["field"] == "node_ids"
    assert extra_field["errors"][0]["field"] == "k"
    assert "JSON object" in not_an_object["message"]
    # every call of the turn was answered, by id, before the model was asked again
    ids = [c["id"] for c in scripted.requests["malformed"][1]["body"]["messages"][2]["tool_calls"]]
    assert ids == [m["tool_call_id"] for m in tool_messages(scripted.requests["malformed"][1]["body"])]


@pytest.mark.parametrize("model,expected", [("fails", "HTTP 500"), ("not-a-completion", "not a chat completion")])
def test_an_endpoint_error_sets_error_instead_of_raising(endpoint, service, tmp_path, model, expected):
    _, url = endpoint
    result = run_agent(service, QUESTION, base_url=url, model=model, transcript_path=str(tmp_path / "t.jsonl"))
    assert result.stop == "error" and expected in result.error and result.answer == ""
    assert rows(tmp_path / "t.jsonl")[-1]["error"] == result.error


def test_an_endpoint_timeout_sets_error(endpoint, service):
    _, url = endpoint
    result = run_agent(service, QUESTION, base_url=url, model="slow", timeout_s=3)
    assert result.stop == "error" and result.error.startswith("timeout")
    assert result.latency_s < 10  # gave up at its deadline, before the slow answer came


def test_an_unreachable_endpoint_sets_error(service):
    result = run_agent(service, QUESTION, base_url="http://127.0.0.1:9/v1", model="normal", timeout_s=2)
    assert result.stop == "error" and result.error.startswith("request failed")


def test_the_judge_score_is_parsed_and_a_malformed_reply_is_nan(endpoint):
    _, url = endpoint
    grade = lambda model: judge_answer(QUESTION, "Port 9443.", "It listens on 9443.", base_url=url, model=model)
    assert grade("judge-fenced") == 0.5
    assert grade("judge-prose") == 1.0
    assert math.isnan(grade("judge-unparsable"))
    assert math.isnan(grade("judge-out-of-range"))
    assert math.isnan(grade("fails"))
    prompt = endpoint[0].requests["judge-fenced"][0]["body"]["messages"][0]["content"]
    assert "Port 9443." in prompt and "It listens on 9443." in prompt and QUESTION in prompt


@pytest.mark.parametrize("reply,score", [('{"score": 1}', 1.0), ('{"reason": "x {y}", "score": 0}', 0.0),
                                         ('noise {"a": 1} then {"score": "0.5"}', 0.5), ("score = 0.5", 0.5),
                                         ("SCORE: 1.0", 1.0), ('{"score": -1}', None), ("", None),
                                         ('{"score": null}', None), ("I give it a 1", None)])
def test_parse_judge_reply(reply, score):
    assert parse_judge_reply(reply) == score


def test_evidence_precision_recall_f1_of_an_episode_on_a_hand_checked_case(endpoint, service):
    # The policy reads the v3 page (gold) and its v2 look-alike, then the v3
    # logging page in a second Read: 1 of 3 read is gold, the 1 gold was read:
    # P = 1/3, R = 1, F1 = 2 * 1/3 / (4/3) = 1/2.
    _, url = endpoint
    result = run_agent(service, QUESTION, base_url=url, model="look-alikes")
    trees = service.index.get_toc("configuring the server version 3")["trees"]
    gold = find(trees, "Version 3", "Configuring the server")
    assert result.nodes_read == [gold, find(trees, "Version 2", "Configuring the server"),
                                 find(service.index.get_toc("logging")["trees"], "Version 3", "Logging")]
    row = service.index.loaded.node_row
    precision, recall, f1 = node_prf([row[i] for i in result.nodes_read], [frozenset({row[gold]})])
    assert (precision, recall, f1) == (pytest.approx(1 / 3), 1.0, pytest.approx(1 / 2))


def test_the_cli_prints_the_answer_and_a_summary(endpoint, tiny_hash_index, tmp_path, monkeypatch, capsys):
    scripted, url = endpoint
    monkeypatch.setenv("AGENT_TEST_KEY", "sk-test")
    transcript = tmp_path / "cli.jsonl"
    code = main(["agent", str(tiny_hash_index), QUESTION, "--base_url", url, "--model", "normal",
                 "--api_key_env", "AGENT_TEST_KEY", "--transcript", str(transcript), "--toc_format", "outline"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0 and out[0] == "Version 3 listens on port 9443."
    summary = json.loads(out[1])
    assert summary["error"] is None and summary["calls"] == 2 and len(summary["nodes_read"]) == 1
    assert "transcript" not in summary and rows(transcript)[-1]["answer"] == out[0]
    assert scripted.requests["normal"][-1]["authorization"] == "Bearer sk-test"
    toc_message = tool_messages(scripted.requests["normal"][-1]["body"])[0]["content"]
    assert toc_message.startswith("GetToC ")  # the outline form, as the MCP server renders it


def test_the_cli_names_a_missing_api_key_variable(tiny_hash_index, monkeypatch, capsys):
    monkeypatch.delenv("AGENT_TEST_MISSING", raising=False)
    code = main(["agent", str(tiny_hash_index), QUESTION, "--base_url", "http://127.0.0.1:9/v1", "--model", "m",
                 "--api_key_env", "AGENT_TEST_MISSING"])
    assert code == 2 and "AGENT_TEST_MISSING" in capsys.readouterr().err
