"""The MCP face, through the mcp SDK's own client: over streamable HTTP (server
in a thread) and over stdio (`ritrag mcp` as a subprocess)."""
from __future__ import annotations

import json
import os
import sys

import anyio
import httpx
import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from ritrag.serving.budget import Budget, EpisodeBudgets
from ritrag.serving.mcp_server import streamable_http_app
from ritrag.serving.outline import parse_outline
from ritrag.serving.tool_models import EPISODE_META_KEY, tool_definitions
from ritrag.serving.tools import ToolService
from serving_fixtures import loaded_index, serving


def walk(trees):
    for tree in trees:
        yield tree
        yield from walk(tree.get("children", []))


async def round_trip(client: Client) -> None:
    """Tools listed with the strict schemas; GetToC then Read; errors as tool results."""
    listed = {t.name: t for t in (await client.list_tools()).tools}
    expected = {t["name"]: t for t in tool_definitions("mcp")}
    assert set(listed) == {"GetToC", "Read"}
    for name, tool in listed.items():
        assert tool.input_schema == expected[name]["inputSchema"]
        assert tool.annotations.read_only_hint is True

    toc = await client.call_tool("GetToC", {"query": "how do logs rotate"})
    assert not toc.is_error
    trees = toc.structured_content["trees"]
    assert json.loads(toc.content[0].text) == toc.structured_content
    best = max((node for node in walk(trees) if node["hit"]), key=lambda node: node["score"])
    read = await client.call_tool("Read", {"node_ids": [best["id"]], "offset": None})
    assert not read.is_error
    assert read.structured_content["nodes"][0]["text"] == "Logs rotate daily; keep fourteen files.\n\n" \
                                                          "Set the log level with SHOP_LOG=debug."

    for name, args, reason in [("Read", {"node_ids": ["nosuchnode00"], "offset": None}, "unknown_ids"),
                               ("Read", {"node_ids": "x", "offset": None}, "invalid_arguments"),
                               ("GetToC", {"query": ""}, "invalid_arguments"),
                               ("Search", {"query": "x"}, "unknown_tool")]:
        result = await client.call_tool(name, args)
        assert result.is_error and json.loads(result.content[0].text)["error"]["reason"] == reason


async def budget_round_trip(client: Client) -> None:
    meta = {EPISODE_META_KEY: "mcp-episode"}
    first = await client.call_tool("GetToC", {"query": "tls"}, meta=meta)
    assert first.structured_content["budget"] == {"episode_id": "mcp-episode", "calls_left": 2, "get_toc_left": 0}
    refused = await client.call_tool("GetToC", {"query": "tls"}, meta=meta)
    error = json.loads(refused.content[0].text)["error"]
    assert refused.is_error and error["reason"] == "budget_exhausted" and error["budget"]["calls_left"] == 2


def test_mcp_over_streamable_http(tiny_index):
    service = ToolService(loaded_index(str(tiny_index)), budgets=EpisodeBudgets(Budget(calls=3, toc_calls=1)),
                          toc_format="outline")

    async def main(url: str) -> None:
        async with Client(url + "/mcp") as client:
            outline = await client.call_tool("GetToC", {"query": "tls"})
            assert outline.content[0].text.startswith("GetToC v000001:")
            assert parse_outline(outline.structured_content["outline"]) and "trees" not in outline.structured_content
            service.toc_format = "json"
            await round_trip(client)
            await budget_round_trip(client)

    with serving(streamable_http_app(service)) as url:
        anyio.run(main, url)


def test_mcp_over_streamable_http_needs_the_api_key_when_set(tiny_index):
    service = ToolService(loaded_index(str(tiny_index)))
    with serving(streamable_http_app(service, api_key="k3y")) as url:
        refused = httpx.post(url + "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert refused.status_code == 401 and refused.json()["error"]["reason"] == "unauthorized"

        async def main() -> None:
            async with httpx2.AsyncClient(headers={"Authorization": "Bearer k3y"}) as http, \
                    Client(streamable_http_client(url + "/mcp", http_client=http)) as client:
                assert len((await client.list_tools()).tools) == 2

        anyio.run(main)


def test_mcp_over_stdio(tiny_index):
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "ritrag.cli", "mcp", str(tiny_index), "--max_calls", "3", "--max_toc_calls", "1"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, cwd=os.getcwd())

    async def main() -> None:
        async with Client(params, read_timeout_seconds=120) as client:
            await round_trip(client)
            await budget_round_trip(client)

    anyio.run(main)
