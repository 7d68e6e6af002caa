"""Tool schemas, budgets, limits and the outline, without an index: the service
runs over a stand-in for RitragIndex."""
from __future__ import annotations

import json
import subprocess
import sys

import jsonschema
import pytest

from ritrag import cli
from serving.budget import Budget, EpisodeBudgets
from serving.errors import ToolError
from serving.outline import count_tokens, render_outline, toc_json_text
from serving.schemas import GetTocArgs, ReadArgs, strict_schema, tool_definitions
from serving.tools import Limits, ToolService

# OpenAI's strict mode: the keywords it supports (anything else is rejected).
STRICT_KEYWORDS = {"type", "properties", "required", "additionalProperties", "items", "enum", "const", "anyOf",
                   "description", "$ref", "$defs", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                   "multipleOf", "minItems", "maxItems", "pattern", "format"}


def assert_strict(schema: dict, root: bool = True) -> None:
    if root:
        assert schema["type"] == "object" and "anyOf" not in schema
    assert set(schema) <= STRICT_KEYWORDS, set(schema) - STRICT_KEYWORDS
    if schema.get("type") == "object":
        assert schema["additionalProperties"] is False
        assert sorted(schema["required"]) == sorted(schema["properties"])
        for sub in schema["properties"].values():
            assert_strict(sub, root=False)
    for sub in schema.get("anyOf", []) + ([schema["items"]] if "items" in schema else []):
        assert_strict(sub, root=False)


def test_tool_schemas_are_valid_for_openai_strict_mode():
    tools = tool_definitions("openai")
    assert [t["function"]["name"] for t in tools] == ["GetToC", "Read"]
    for tool in tools:
        assert tool["type"] == "function" and tool["function"]["strict"] is True
        assert_strict(tool["function"]["parameters"])
        jsonschema.Draft202012Validator.check_schema(tool["function"]["parameters"])


def test_every_format_carries_the_same_input_schema():
    openai = {t["function"]["name"]: t["function"]["parameters"] for t in tool_definitions("openai")}
    anthropic = {t["name"]: t["input_schema"] for t in tool_definitions("anthropic")}
    mcp = {t["name"]: t for t in tool_definitions("mcp")}
    assert openai == anthropic == {name: t["inputSchema"] for name, t in mcp.items()}
    for tool in mcp.values():
        jsonschema.Draft202012Validator.check_schema(tool["outputSchema"])


def test_strict_schemas_accept_what_the_models_accept():
    read = strict_schema(ReadArgs)
    jsonschema.validate({"node_ids": ["a"], "offset": None}, read)
    jsonschema.validate({"node_ids": ["a"], "offset": 20}, read)
    for bad in ({"node_ids": ["a"]}, {"node_ids": "a", "offset": None}, {"node_ids": [], "offset": -1},
                {"node_ids": [], "offset": None, "extra": 1}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, read)
    assert ReadArgs.model_validate({"node_ids": ["a"], "offset": None}).offset is None
    jsonschema.validate({"query": "x"}, strict_schema(GetTocArgs))


@pytest.mark.parametrize("fmt", ["openai", "anthropic", "mcp"])
def test_cli_prints_the_tool_definitions(fmt, capsys):
    assert cli.main(["tools", "--format", fmt]) == 0
    assert json.loads(capsys.readouterr().out) == tool_definitions(fmt)


def test_budget_counts_calls_and_get_toc_calls_per_episode():
    budgets = EpisodeBudgets(Budget(calls=5, toc_calls=2))
    assert budgets.charge("e", "GetToC") == {"episode_id": "e", "calls_left": 4, "get_toc_left": 1}
    budgets.charge("e", "GetToC")
    with pytest.raises(ToolError) as refused:
        budgets.charge("e", "GetToC")
    assert refused.value.reason == "budget_exhausted" and refused.value.status == 429
    assert refused.value.details["budget"] == {"episode_id": "e", "calls_left": 3, "get_toc_left": 0}
    assert budgets.charge("other", "GetToC")["calls_left"] == 4  # episodes are independent
    for left in (2, 1, 0):
        assert budgets.charge("e", "Read")["calls_left"] == left
    with pytest.raises(ToolError, match="all 5 tool calls"):
        budgets.charge("e", "Read")


def test_budgets_forget_idle_and_least_recent_episodes():
    now = [0.0]
    budgets = EpisodeBudgets(Budget(calls=1, toc_calls=1), max_episodes=2, idle_s=10, clock=lambda: now[0])
    budgets.charge("a", "Read")
    now[0] = 11.0
    assert budgets.charge("a", "Read")["calls_left"] == 0  # idle too long: a fresh budget
    budgets.charge("b", "Read")
    budgets.charge("c", "Read")
    assert len(budgets) == 2
    assert budgets.charge("a", "Read")["calls_left"] == 0  # "a" was evicted, so it starts afresh


class StubIndex:
    version = "v000001"

    def get_toc(self, query: str, k: int, n: int) -> dict:
        trees = [{"id": "root", "title": "Shop Server", "hit": False, "children": [
            {"id": "v3", "title": "Version 3", "hit": True, "score": 0.02,
             "children": [{"id": "cfg", "title": "Configuring  the server", "hit": True, "score": 0.03,
                           "summary": "Ports and TLS", "keywords": ["port", "tls"]}]}]}]
        return {"query": query, "version": self.version, "hits": 2, "trees": trees, "k": k, "n": n}

    def read(self, node_ids, max_chars: int, offset: int) -> dict:
        known = [i for i in node_ids if i == "cfg"]
        return {"version": self.version, "unknown_ids": [i for i in node_ids if i != "cfg"],
                "nodes": [{"id": i, "title": "t", "path": [], "url": None, "text": "x", "total_chars": 1,
                           "max_chars": max_chars} for i in known]}


@pytest.fixture
def service() -> ToolService:
    return ToolService(StubIndex(), Limits(max_query_chars=50, max_ids_per_read=3, max_chars_per_node=100),
                       EpisodeBudgets(Budget(calls=3, toc_calls=1)), k=7, n=5)


def test_outline_is_an_indented_list_with_ids_and_hit_ranks(service):
    toc = service.get_toc("tls", format="both")
    assert toc["outline"] == ("Shop Server [root]\n"
                              "  Version 3 [v3] *2\n"
                              "    Configuring the server [cfg] *1 - Ports and TLS (port, tls)")
    assert toc["tokens"]["tokenizer"] == "o200k_base"
    assert toc["tokens"]["outline"] == count_tokens(toc["outline"]) < toc["tokens"]["json"]
    assert toc["tokens"]["json"] == count_tokens(toc_json_text(service.get_toc("tls")))
    outline_only = service.get_toc("tls", format="outline")
    assert "trees" not in outline_only and service.text_of(outline_only).endswith(toc["outline"])
    assert render_outline([]) == ""


def test_service_fills_defaults_and_checks_limits(service):
    assert (service.get_toc("tls")["k"], service.get_toc("tls")["n"]) == (7, 5)
    assert service.read(["cfg"])["nodes"][0]["max_chars"] == 100
    refusals = [
        (lambda: service.get_toc("   "), "invalid_arguments"),
        (lambda: service.get_toc("q" * 51), "limit_exceeded"),
        (lambda: service.get_toc("tls", n=201), "limit_exceeded"),
        (lambda: service.read([]), "invalid_arguments"),
        (lambda: service.read(["cfg"] * 4), "limit_exceeded"),
        (lambda: service.read(["x" * 65]), "invalid_arguments"),
        (lambda: service.read(["cfg"], max_chars=101), "limit_exceeded"),
        (lambda: service.read(["nope"]), "unknown_ids"),
        (lambda: service.call("Search", {}), "unknown_tool"),
        (lambda: service.call("Read", {"node_ids": "cfg"}), "invalid_arguments"),
        (lambda: service.call("GetToC", {"query": "x", "k": 5}), "invalid_arguments"),
    ]
    for call, reason in refusals:
        with pytest.raises(ToolError) as refused:
            call()
        assert refused.value.reason == reason
        assert "Traceback" not in json.dumps(refused.value.to_dict())


def test_service_charges_episodes_and_reports_what_is_left(service):
    assert service.call("GetToC", {"query": "tls"}, episode_id="e")["budget"]["calls_left"] == 2
    with pytest.raises(ToolError) as refused:
        service.call("GetToC", {"query": "tls"}, episode_id="e")
    assert refused.value.to_dict()["error"]["budget"] == {"episode_id": "e", "calls_left": 2, "get_toc_left": 0}
    assert service.call("Read", {"node_ids": ["cfg"], "offset": None}, episode_id="e")["budget"]["calls_left"] == 1
    assert "budget" not in service.call("GetToC", {"query": "tls"})  # no episode: not counted


def test_serving_never_loads_beam():
    code = ("import sys, serving.http, serving.mcp_server, serving.tools; "
            "assert 'apache_beam' not in sys.modules, 'serving imported Beam'")
    subprocess.run([sys.executable, "-c", code], check=True)
