"""Property-based tests of what faces the outside: the HTTP routes, the MCP
tools (through their Python entry point, `ToolService.call`) and the page
parser. Whatever the input (strings with surrogates or NULs, huge numbers,
wrong types, arbitrary bytes and nesting), the answer is a result or a
documented refusal: never a 5xx, never another exception.

Derandomized (the same examples on every run) with bounded example counts, so
the suite is fast and a failure reproduces."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ritrag.serving.errors import STATUS, ToolError
from ritrag.serving.tools import ToolService
from serving_fixtures import loaded_index
from ritrag.transforms.parse import UnparseablePage, parse_page

FAST = settings(derandomize=True, max_examples=60, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# JSON values of every kind, text with surrogates and NULs, integers far beyond 64 bits.
texts = st.text(st.characters(codec=None, categories=None), max_size=80) | st.sampled_from(
    ["\ud800", "a\x00b", "\udfff\ud800", "", " ", "x" * 70_000])
numbers = st.integers(min_value=-(2 ** 80), max_value=2 ** 80) | st.floats(allow_nan=True) | st.booleans()
scalars = st.none() | numbers | texts
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=10), inner, max_size=4), max_leaves=10)
toc_bodies = st.fixed_dictionaries({}, optional={"query": values, "k": values, "n": values, "format": values,
                                                 "episode_id": values}) | values
read_bodies = st.fixed_dictionaries({}, optional={"node_ids": values | st.lists(texts, max_size=25),
                                                  "offset": values, "max_chars": values,
                                                  "episode_id": values}) | values


@pytest.fixture(scope="module")
def service(tiny_hash_index) -> ToolService:
    return ToolService(loaded_index(str(tiny_hash_index)))


@pytest.fixture(scope="module")
def client(service):
    from fastapi.testclient import TestClient

    from ritrag.serving.http import create_app

    with TestClient(create_app(lambda: service)) as client:
        for _ in range(600):
            if client.get("/readyz").status_code == 200:
                break
        yield client


def encoded(body) -> bytes:
    """The JSON a client could send: surrogates escaped (\\ud800), which is what
    a JSON parser turns back into a lone surrogate."""
    return json.dumps(body, ensure_ascii=True, allow_nan=True).encode()


def assert_answered(response) -> None:
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        assert response.json()["error"]["reason"] in STATUS


@FAST
@given(body=toc_bodies)
def test_http_toc_answers_any_body_without_a_5xx(client, body):
    assert_answered(client.post("/v1/toc", content=encoded(body), headers={"content-type": "application/json"}))


@FAST
@given(body=read_bodies)
def test_http_read_answers_any_body_without_a_5xx(client, body):
    assert_answered(client.post("/v1/read", content=encoded(body), headers={"content-type": "application/json"}))


@FAST
@given(raw=st.binary(max_size=200))
def test_http_routes_answer_any_bytes_without_a_5xx(client, raw):
    for route in ("/v1/toc", "/v1/read"):
        assert_answered(client.post(route, content=raw, headers={"content-type": "application/json"}))


@FAST
@given(tool=st.sampled_from(["GetToC", "Read"]) | texts, arguments=values, episode=st.none() | texts)
def test_mcp_tools_answer_any_arguments_with_a_result_or_a_tool_error(service, tool, arguments, episode):
    try:
        result = service.call(tool, arguments if isinstance(arguments, dict) else {"query": arguments}, episode)
    except ToolError as error:
        assert error.status < 500
        json.dumps(error.to_dict())  # renders
        return
    json.dumps(result)  # what MCP sends must render
    service.text_of(result).encode("utf-8")


@FAST
@given(data=st.binary(max_size=2_000))
def test_parse_page_takes_any_bytes(data):
    try:
        parse_page(data, "https://example.com/p.html", "https://example.com/")
    except UnparseablePage as refused:
        assert refused.reason


# containers of body text (a heading would make the text a title, not body)
tags = st.sampled_from(["div", "span", "section", "ul", "li", "table", "td", "p", "b", "main", "pre", "article"])


@FAST
@given(path=st.lists(tags, min_size=0, max_size=40), repeat=st.integers(0, 120), text=texts,
       encoding=st.sampled_from(["utf-8", "utf-16", "latin-1", "cp1252", "shift_jis", "utf-8-sig"]))
def test_parse_page_keeps_nested_text_or_refuses_the_page(path, repeat, text, encoding):
    opening = "".join(f"<{t}>" for t in path) * repeat
    closing = "".join(f"</{t}>" for t in reversed(path)) * repeat
    html = (f'<html><head><meta charset="{encoding}"><title>Nested</title></head><body>{opening}'
            f"<p>needle {text}</p>{closing}</body></html>")
    try:
        data = html.encode(encoding)
    except UnicodeEncodeError:
        data = html.encode(encoding, errors="replace")
    try:
        page = parse_page(data, "https://example.com/p.html", "https://example.com/")
    except UnparseablePage as refused:
        assert refused.reason in ("too_deep", "binary", "undecodable", "no_content", "too_large", "empty")
        return
    assert "needle" in page.body  # a kept page has all its text, however deep
