"""The agent-framework adapters (ritrag.serving.adapters), each with its real
library, over both backends: the local ToolService, and the app `ritrag serve`
runs, served on 127.0.0.1 and reached through RemoteTools. No model: the tools
are called through each framework's own tool interface. A framework's tests
skip only when its library is not installed (the dev extra installs all three).

One service answers both backends, with a budget of 4 calls (2 GetToC) per
episode; each test runs its own episodes."""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import uuid

import httpx
import pytest

from ritrag.serving.adapters.base import EpisodeTools, RemoteTools, error_text, tools_backend
from ritrag.serving.budget import GET_TOC, READ, Budget, EpisodeBudgets
from ritrag.serving.errors import ToolError
from ritrag.serving.http import HttpSettings, create_app
from ritrag.serving.outline import preorder
from ritrag.serving.tool_models import TOOLS, strict_schema
from ritrag.serving.tools import ToolService
from serving_fixtures import loaded_index, serving

QUERY = "how often do logs rotate"
BUDGET = Budget(calls=4, toc_calls=2)
API_KEY = "adapter-test-key"


@pytest.fixture(scope="module")
def service(tiny_hash_index) -> ToolService:
    return ToolService(loaded_index(str(tiny_hash_index)), budgets=EpisodeBudgets(BUDGET))


@pytest.fixture(scope="module")
def server_url(service) -> str:
    """The served app, behind an API key (the client must send it)."""
    with serving(create_app(lambda: service, HttpSettings(api_key=API_KEY))) as url:
        with httpx.Client(base_url=url, timeout=30) as client:
            for _ in range(600):
                if client.get("/readyz").status_code == 200:
                    break
                threading.Event().wait(0.05)
            else:
                raise AssertionError("the server never became ready")
        yield url


@pytest.fixture(params=["local", "remote"])
def backend(request, service):
    if request.param == "local":
        yield service
        return
    with RemoteTools(request.getfixturevalue("server_url"), api_key=API_KEY) as remote:
        yield remote


def episode() -> str:
    return f"adapters-{uuid.uuid4().hex[:12]}"


def expected_refusal(service: ToolService, episode_id: str, calls: list[tuple[str, dict]]) -> dict:
    """What the service itself refuses after `calls` in a fresh episode, for
    `episode_id`: the answer every adapter must give at the same point."""
    own = episode()
    tools = EpisodeTools(service, own)
    for tool, arguments in calls[:-1]:
        tools.call(tool, arguments)
    with pytest.raises(ToolError) as refused:
        tools.call(*calls[-1])
    return json.loads(error_text(refused.value).replace(own, episode_id))


def toc_calls(count: int) -> list[tuple[str, dict]]:
    return [(GET_TOC, {"query": QUERY})] * count


def best_hit(toc: dict) -> dict:
    return max((node for node, _ in preorder(toc["trees"]) if node["hit"]), key=lambda node: node["score"])


# ---- the backend contract ----------------------------------------------------------------------------------------

def test_remote_tools_answer_as_the_service_does(service, server_url):
    with RemoteTools(server_url, api_key=API_KEY) as remote:
        assert remote.get_toc(QUERY) == service.get_toc(QUERY)
        node = best_hit(service.get_toc(QUERY))["id"]
        assert remote.read([node, "nosuchnode00"], max_chars=10) == service.read([node, "nosuchnode00"], max_chars=10)
        assert remote.get_toc(QUERY, format="outline")["outline"] == service.get_toc(QUERY, format="outline")["outline"]


def test_remote_refusals_are_the_servers_tool_errors(server_url):
    with RemoteTools(server_url, api_key=API_KEY) as remote:
        with pytest.raises(ToolError) as unknown:
            remote.read(["nosuchnode00"])
        assert unknown.value.reason == "unknown_ids" and unknown.value.details["unknown_ids"] == ["nosuchnode00"]
        with pytest.raises(ToolError) as over:
            remote.get_toc("x" * 1001)
        assert over.value.reason == "limit_exceeded" and over.value.details["limit"] == 1000
    with RemoteTools(server_url) as keyless, pytest.raises(ToolError) as unauthorized:
        keyless.get_toc(QUERY)
    assert unauthorized.value.reason == "unauthorized"


def test_a_server_that_does_not_answer_is_not_ready():
    with socket.socket() as closed:  # bound, never listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        with RemoteTools(url, timeout_s=5) as remote, pytest.raises(ToolError) as refused:
            remote.get_toc(QUERY)
    assert refused.value.reason == "not_ready" and url in refused.value.message


def test_tools_backend_takes_a_url_an_index_or_a_backend(service, tiny_hash_index):
    assert tools_backend(service) is service
    with tools_backend("http://127.0.0.1:9") as remote:
        assert isinstance(remote, RemoteTools)
    local = tools_backend(tiny_hash_index)
    assert isinstance(local, ToolService) and local.index.version == service.index.version


# ---- LangChain ---------------------------------------------------------------------------------------------------

def test_langchain_tools_are_the_tools_with_their_schemas(backend):
    pytest.importorskip("langchain_core")
    from langchain_core.utils.function_calling import convert_to_openai_tool

    from ritrag.serving.adapters.langchain import ritrag_tools

    tools = ritrag_tools(backend)
    assert [(t.name, t.description, t.args_schema) for t in tools] == [
        (name, description, model) for name, (model, description) in TOOLS.items()]
    assert convert_to_openai_tool(tools[1])["function"]["parameters"]["required"] == ["node_ids"]


def test_langchain_tools_get_toc_and_read(backend):
    pytest.importorskip("langchain_core")
    from ritrag.serving.adapters.langchain import ritrag_tools

    get_toc, read = ritrag_tools(backend, episode_id=episode())
    toc = json.loads(get_toc.invoke({"query": QUERY}))
    hit = best_hit(toc)
    assert hit["title"] == "Logging" and toc["budget"]["calls_left"] == 3
    message = read.invoke({"type": "tool_call", "id": "call-1", "name": READ, "args": {"node_ids": [hit["id"]]}})
    assert message.status == "success" and message.tool_call_id == "call-1"
    node = message.artifact["nodes"][0]
    assert json.loads(message.content) == message.artifact
    assert "Logs rotate daily" in node["text"] and node["path"][:2] == ["Shop Server", "Version 3"]


def test_langchain_tools_keep_the_episode_budget(backend, service):
    pytest.importorskip("langchain_core")
    from ritrag.serving.adapters.langchain import ritrag_tools

    episode_id = episode()
    get_toc, _ = ritrag_tools(backend, episode_id=episode_id)
    for _ in range(2):
        get_toc.invoke({"query": QUERY})
    refused = get_toc.invoke({"type": "tool_call", "id": "call-3", "name": GET_TOC, "args": {"query": QUERY}})
    assert refused.status == "error"
    assert json.loads(refused.content) == expected_refusal(service, episode_id, toc_calls(3))
    assert json.loads(refused.content)["error"]["reason"] == "budget_exhausted"


def test_langchain_tools_refuse_bad_arguments_as_the_service_does(backend):
    pytest.importorskip("langchain_core")
    from ritrag.serving.adapters.langchain import ritrag_tools

    get_toc, read = ritrag_tools(backend)
    extra = json.loads(get_toc.invoke({"query": QUERY, "surprise": 1}))["error"]
    assert extra["reason"] == "invalid_arguments" and extra["errors"][0]["field"] == "surprise"
    unknown = json.loads(read.invoke({"node_ids": ["nosuchnode00"]}))["error"]
    assert unknown["reason"] == "unknown_ids" and unknown["unknown_ids"] == ["nosuchnode00"]


def test_langchain_retriever_returns_the_hits_as_documents_with_their_paths(backend, service):
    pytest.importorskip("langchain_core")
    from ritrag.serving.adapters.langchain import RitragRetriever

    episode_id = episode()
    retriever = RitragRetriever(backend=backend, documents=3, episode_id=episode_id)
    documents = retriever.invoke(QUERY)
    assert 1 <= len(documents) <= 3 and [d.metadata["rank"] for d in documents] == list(range(1, len(documents) + 1))
    first = documents[0]
    assert first.metadata["title"] == "Logging" and "Logs rotate daily" in first.page_content
    assert first.metadata["path"][:2] == ["Shop Server", "Version 3"] and first.id == first.metadata["id"]
    assert first.metadata["url"].startswith("https://docs.example.com/shop/v3/logging.html")
    assert [d.metadata["id"] for d in documents] == [
        n["id"] for n in sorted((n for n, _ in preorder(service.get_toc(QUERY)["trees"]) if n["hit"]),
                                key=lambda n: (-n["score"], n["id"]))][:len(documents)]
    retriever.invoke(QUERY)  # GetToC and Read again: the episode's 4 calls are spent
    with pytest.raises(ToolError) as refused:
        retriever.invoke(QUERY)
    assert refused.value.reason == "budget_exhausted"


def test_langchain_retriever_takes_an_index_directory(tiny_hash_index, service):
    pytest.importorskip("langchain_core")
    from ritrag.serving.adapters.langchain import RitragRetriever

    retriever = RitragRetriever(backend=str(tiny_hash_index), documents=1, max_chars=9)
    (document,) = retriever.invoke(QUERY)
    (node,) = service.read([best_hit(service.get_toc(QUERY))["id"]])["nodes"]
    assert document.page_content == node["text"][:9] and document.metadata["next_offset"] == 9


# ---- LlamaIndex --------------------------------------------------------------------------------------------------

def test_llamaindex_tool_spec_gives_the_tools_with_their_schemas(backend):
    pytest.importorskip("llama_index.core")
    from ritrag.serving.adapters.llamaindex import RitragToolSpec

    tools = RitragToolSpec(backend).to_tool_list()
    assert [(t.metadata.name, t.metadata.description, t.metadata.fn_schema) for t in tools] == [
        (name, description, model) for name, (model, description) in TOOLS.items()]


def test_llamaindex_tools_get_toc_read_and_keep_the_budget(backend, service):
    pytest.importorskip("llama_index.core")
    from llama_index.core.tools.calling import call_tool

    from ritrag.serving.adapters.llamaindex import RitragToolSpec

    episode_id = episode()
    get_toc, read = RitragToolSpec(backend, episode_id=episode_id).to_tool_list()
    output = call_tool(get_toc, {"query": QUERY})  # as LlamaIndex's agents call a tool
    hit = best_hit(json.loads(output.content))
    assert not output.is_error and hit["title"] == "Logging"
    node = json.loads(read.call(node_ids=[hit["id"]]).content)["nodes"][0]
    assert "Logs rotate daily" in node["text"] and node["path"][:2] == ["Shop Server", "Version 3"]
    get_toc.call(query=QUERY)
    refused = json.loads(get_toc.call(query=QUERY).content)
    calls = [(GET_TOC, {"query": QUERY}), (READ, {"node_ids": [hit["id"]]}), *toc_calls(2)]
    assert refused == expected_refusal(service, episode_id, calls)
    assert refused["error"]["reason"] == "budget_exhausted"
    bad = json.loads(read.call(node_ids="not a list").content)["error"]
    assert bad["reason"] == "invalid_arguments" and bad["errors"][0]["field"] == "node_ids"


def test_llamaindex_retriever_returns_the_hits_as_nodes_with_their_paths(backend):
    pytest.importorskip("llama_index.core")
    from ritrag.serving.adapters.llamaindex import RitragRetriever

    retriever = RitragRetriever(backend, documents=2, episode_id=episode())
    found = retriever.retrieve(QUERY)
    assert 1 <= len(found) <= 2 and found[0].score >= found[-1].score
    first = found[0].node
    assert first.metadata["title"] == "Logging" and "Logs rotate daily" in first.get_content()
    assert first.metadata["path"][:2] == ["Shop Server", "Version 3"] and first.node_id == first.metadata["id"]
    retriever.retrieve(QUERY)
    with pytest.raises(ToolError) as refused:
        retriever.retrieve(QUERY)
    assert refused.value.reason == "budget_exhausted"
    with pytest.raises(ToolError) as none:
        RitragRetriever(backend, documents=0).retrieve(QUERY)
    assert none.value.reason == "invalid_arguments"


# ---- OpenAI Agents SDK -------------------------------------------------------------------------------------------

def invoke(tool, arguments: str) -> str:
    from agents.tool_context import ToolContext

    context = ToolContext(context=None, tool_name=tool.name, tool_call_id="call-1", tool_arguments=arguments)
    return asyncio.run(tool.on_invoke_tool(context, arguments))


def test_openai_agents_function_tools_carry_the_strict_schemas(backend):
    pytest.importorskip("agents")
    from agents import FunctionTool

    from ritrag.serving.adapters.openai_agents import ritrag_function_tools

    tools = ritrag_function_tools(backend)
    assert all(isinstance(t, FunctionTool) and t.strict_json_schema for t in tools)
    assert [(t.name, t.description, t.params_json_schema) for t in tools] == [
        (name, description, strict_schema(model)) for name, (model, description) in TOOLS.items()]


def test_openai_agents_function_tools_get_toc_read_and_keep_the_budget(backend, service):
    pytest.importorskip("agents")
    from ritrag.serving.adapters.openai_agents import ritrag_function_tools

    episode_id = episode()
    get_toc, read = ritrag_function_tools(backend, episode_id=episode_id, toc_format="outline")
    outline = invoke(get_toc, json.dumps({"query": QUERY, "collapse_read": None}))
    assert outline.startswith("GetToC v") and "Logging" in outline and "budget left: 3 calls" in outline
    handle = next(line.split()[0].split("*")[0] for line in outline.splitlines() if line.endswith(" Logging"))
    node = json.loads(invoke(read, json.dumps({"node_ids": [handle], "offset": None, "query": None})))["nodes"][0]
    assert node["handle"] == handle and "Logs rotate daily" in node["text"]
    for _ in range(2):
        last = invoke(read, json.dumps({"node_ids": [handle], "offset": None, "query": None}))
    assert json.loads(last)["budget"]["calls_left"] == 0
    refused = json.loads(invoke(get_toc, json.dumps({"query": QUERY, "collapse_read": None})))
    assert refused["error"]["reason"] == "budget_exhausted" and refused["error"]["budget"]["calls_left"] == 0
    assert refused["error"]["message"] == f"episode {episode_id!r} has used all 4 tool calls; answer with what you " \
                                          "have read"


def test_openai_agents_function_tools_answer_bad_json_with_invalid_arguments(backend):
    pytest.importorskip("agents")
    from ritrag.serving.adapters.openai_agents import ritrag_function_tools

    get_toc, read = ritrag_function_tools(backend)
    for tool, arguments in ((get_toc, "{not json"), (get_toc, ""), (read, '{"node_ids": [1]}'),
                            (get_toc, '{"query": "x", "surprise": 1}')):
        assert json.loads(invoke(tool, arguments))["error"]["reason"] == "invalid_arguments", arguments
