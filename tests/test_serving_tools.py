"""Tool schemas, budgets, limits and the outline, without an index: the service
runs over a stand-in for RitragIndex."""
from __future__ import annotations

import json
import subprocess
import sys

import jsonschema
import pytest

from ritrag import cli
from ritrag.serving.budget import Budget, EpisodeBudgets, EpisodeMemory
from ritrag.serving.errors import ToolError
from ritrag.serving.outline import count_tokens, preorder, render_outline, toc_json_text
from ritrag.serving.tool_models import GetTocArgs, ReadArgs, strict_schema, tool_definitions
from ritrag.serving.tools import Limits, ToolService, mark_read

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
    jsonschema.validate({"node_ids": ["a"], "offset": None, "query": None}, read)
    jsonschema.validate({"node_ids": ["a"], "offset": 20, "query": "rotate keys"}, read)
    for bad in ({"node_ids": ["a"]}, {"node_ids": "a", "offset": None, "query": None},
                {"node_ids": [], "offset": -1, "query": None}, {"node_ids": [], "offset": None, "query": None, "extra": 1},
                {"node_ids": ["a"], "offset": None, "query": 3}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, read)
    assert ReadArgs.model_validate({"node_ids": ["a"], "offset": None}).offset is None
    jsonschema.validate({"query": "x", "collapse_read": None}, strict_schema(GetTocArgs))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"query": "x"}, strict_schema(GetTocArgs))  # strict: every property given


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

    def answer_toc(self, query: str, k: int, n: int, cross_links: bool) -> dict:
        trees = [{"id": "root", "title": "Shop Server", "hit": False, "children": [
            {"id": "ver3", "title": "Version 3", "hit": True, "score": 0.02,
             "children": [{"id": "cfg", "title": "Configuring  the server", "hit": True, "score": 0.03,
                           "summary": "Ports and TLS", "keywords": ["port", "tls"]}]}]}]
        return {"query": query, "version": self.version, "hits": 2, "trees": trees, "k": k, "n": n,
                "cross_links": cross_links}

    def read(self, node_ids, max_chars: int, offset: int, query: str | None = None) -> dict:
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
    assert toc["outline"] == ("root Shop Server\n"
                              " ver3*2 Version 3\n"
                              "  cfg*1 Configuring the server\tsummary: Ports and TLS\tkeywords: port, tls")
    assert toc["tokens"]["tokenizer"] == "o200k_base"
    assert toc["tokens"]["outline"] == count_tokens(toc["outline"]) < toc["tokens"]["json"]
    assert toc["tokens"]["json"] == count_tokens(toc_json_text(service.get_toc("tls")))
    outline_only = service.get_toc("tls", format="outline")
    assert "trees" not in outline_only and service.text_of(outline_only).endswith(toc["outline"])
    assert render_outline([]) == ""


def test_service_fills_defaults_and_checks_limits(service):
    assert (service.get_toc("tls")["k"], service.get_toc("tls")["n"]) == (7, 5)
    assert service.get_toc("tls")["cross_links"] and not service.get_toc("tls", cross_links=False)["cross_links"]
    assert not ToolService(StubIndex(), cross_links=False).get_toc("tls")["cross_links"]
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


def test_serving_never_loads_beam(tmp_path):
    code = ("import sys, ritrag.serving.http, ritrag.serving.mcp_server, ritrag.serving.tools; "
            "assert 'apache_beam' not in sys.modules, 'serving imported Beam'")
    # From an empty folder, as an installed product runs: no source tree on the path.
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path)


def test_outline_handles_resolve_in_read_within_their_episode_only(service):
    toc = service.get_toc("tls", format="outline", episode_id="e")
    assert toc["outline"].splitlines() == ["a1 Shop Server", " a2*2 Version 3",
                                           "  a3*1 Configuring the server\tsummary: Ports and TLS\tkeywords: port, tls"]
    read = service.read(["a3"], episode_id="e")
    assert [(n["id"], n["handle"]) for n in read["nodes"]] == [("cfg", "a3")]
    assert read["budget"]["calls_left"] == 1
    assert "handle" not in service.read(["cfg"])["nodes"][0]
    for handles, episode, where in ((["a3"], None, "names no episode"), (["a3"], "other", "'other' has no"),
                                    (["cfg", "a4"], "e", "'e' has no"), (["b1"], "e", "'e' has no")):
        with pytest.raises(ToolError) as refused:
            service.read(handles, episode_id=episode)
        error = refused.value.to_dict()["error"]
        assert error["reason"] == "unknown_handles" and refused.value.status == 404
        assert error["unknown_handles"] == handles[-1:] and where in error["message"]
        assert "call GetToC again" in error["message"] and "full node ids" in error["message"]
    full_id = service.read(["cfg"], episode_id="e")  # full ids work everywhere
    assert full_id["nodes"][0]["id"] == "cfg" and full_id["budget"]["calls_left"] == 0  # refusals: not charged


def test_later_outline_answers_get_the_next_letters(service):
    service.budgets = EpisodeBudgets(Budget(calls=10, toc_calls=5))
    first = service.get_toc("tls", format="outline", episode_id="e")["outline"]
    second = service.get_toc("tls", format="outline", episode_id="e")["outline"]
    assert first.startswith("a1 ") and second.startswith("b1 ")
    read = service.read(["a3", "b2"], episode_id="e")  # b2: ver3, which the stub cannot read
    assert [n["id"] for n in read["nodes"]] == ["cfg"] and read["unknown_ids"] == ["ver3"]
    assert service.get_toc("tls", format="outline", episode_id="other")["outline"].startswith("a1 ")


def test_read_nodes_are_marked_and_collapsed_on_request(service):
    service.budgets = EpisodeBudgets(Budget(calls=10, toc_calls=5))
    service.read(["cfg"], episode_id="e")
    toc = service.get_toc("tls", format="both", episode_id="e")
    assert [n.get("read") for n in _preorder(toc["trees"])] == [None, None, True]
    assert toc["outline"].splitlines()[2].startswith("  a3*1✓ ")
    collapsed = service.call("GetToC", {"query": "tls", "collapse_read": True}, episode_id="e")
    # cfg was read; ver3 is an unread hit, so it and its ancestor stay; cfg's subtree goes.
    assert [n["id"] for n in _preorder(collapsed["trees"])] == ["root", "ver3"]
    assert (collapsed["hits"], collapsed["collapsed"]) == (1, 1)
    assert "children" not in collapsed["trees"][0]["children"][0]
    assert "collapsed" not in service.get_toc("tls", episode_id="e")  # not asked: nothing left out
    assert service.get_toc("tls", collapse_read=True)["collapsed"] == 0  # no episode: nothing was read


def test_collapse_keeps_read_nodes_above_unread_hits():
    trees = [{"id": "r", "title": "R", "hit": True, "score": 0.1, "children": [
        {"id": "x", "title": "X", "hit": True, "score": 0.2},
        {"id": "y", "title": "Y", "hit": False, "children": [{"id": "z", "title": "Z", "hit": True, "score": 0.3}]}]},
        {"id": "s", "title": "S", "hit": True, "score": 0.05}]
    kept, left_out = mark_read(trees, {"r", "z", "s"}, collapse=True)
    assert left_out == 2 and [(n["id"], n.get("read")) for n in _preorder(kept)] == [("r", True), ("x", None)]


def test_episode_memory_is_bounded():
    now = [0.0]
    memory = EpisodeMemory(max_episodes=2, idle_s=10, max_handles=5, max_read=2, clock=lambda: now[0])
    assert memory.issue_handles("e", ["p", "q", "r"]) == "a"
    assert memory.issue_handles("e", ["s", "t", "u"]) == "b"  # 6 ids > 5: answer a is forgotten whole
    assert memory.resolve("e", ["a1", "b3", "b4"]) == ({"b3": "u"}, ["a1", "b4"])
    memory.mark_read("e", ["p", "q", "r"])
    assert memory.read_ids("e") == {"q", "r"}
    memory.issue_handles("f", ["p"])
    memory.issue_handles("g", ["p"])
    assert len(memory) == 2 and memory.resolve("e", ["b1"]) == ({}, ["b1"])  # e was least recently used
    now[0] = 11.0
    assert memory.resolve("g", ["a1"]) == ({}, ["a1"]) and memory.read_ids("g") == frozenset()  # idle: gone
    assert memory.issue_handles("g", ["p"]) == "a"  # and it starts afresh


def _preorder(trees):
    return [node for node, _ in preorder(trees)]


@pytest.mark.parametrize("argv", [["toc", "{index}", "port", "--k", "-1"], ["toc", "{index}", "port", "--n", "0"],
                                  ["read", "{index}", "x", "--max_chars", "-5"],
                                  ["read", "{index}", "x", "--offset", "-10"],
                                  ["prune", "{index}", "--keep", "0"]])
def test_cli_refuses_out_of_range_numbers_with_one_json_line(tiny_hash_index, capsys, argv):
    assert cli.main([a.format(index=tiny_hash_index) for a in argv]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and json.loads(err)["error"]["reason"] == "invalid_arguments"
