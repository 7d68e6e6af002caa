"""A focused Read (issue 27): with a query, a node longer than the size limit
comes as its passages most relevant to the query, best first, each with its
exact offset; without one, the whole text in order, as the method reads."""
from __future__ import annotations

import pytest

from ritrag.serving.api import RitragIndex
from ritrag.serving.passages import SKIP_MARK, split_passages
from ritrag.serving.tool_models import tool_definitions
from ritrag.serving.tools import ToolService
from support import build_index

FILLER = ("The handbook describes the daily routine of the maintenance crew in general terms, "
          "without naming any single procedure in particular. ") * 3
NEEDLE = "To rotate the zanzibar keys, run keyctl rotate --zanzibar and restart the gateway."


def long_page() -> str:
    paragraphs = [f"<p>Section {i}. {FILLER}</p>" for i in range(12)]
    paragraphs.insert(8, f"<p>{NEEDLE}</p>")
    return ("<!doctype html><html><head><title>Operations handbook</title></head><body><main>"
            f"<h1>Operations handbook</h1>{''.join(paragraphs)}</main></body></html>")


@pytest.fixture(scope="module")
def handbook(tmp_path_factory) -> RitragIndex:
    site = tmp_path_factory.mktemp("handbook_site")
    (site / "ops").mkdir()
    (site / "ops" / "handbook.html").write_text(long_page(), encoding="utf-8")
    out = tmp_path_factory.mktemp("handbook_index")
    build_index(site, out, "--embedding_model", "hashing:384")
    return RitragIndex(str(out))


def node_id(index: RitragIndex) -> str:
    return next(nid for nid in index.loaded.node_row if index.read([nid])["nodes"][0]["total_chars"] > 2_000)


def test_the_matching_passage_comes_first_with_its_offset(handbook):
    nid = node_id(handbook)
    whole = handbook.read([nid])["nodes"][0]
    focused = handbook.read([nid], max_chars=800, query="how do I rotate the zanzibar keys")["nodes"][0]
    assert NEEDLE in focused["text"].split(SKIP_MARK)[0]  # the best passage first
    assert len(focused["text"]) <= 800 and "next_offset" not in focused
    assert focused["skipped_chars"] == whole["total_chars"] - sum(p["chars"] for p in focused["passages"])
    for ref, shown in zip(focused["passages"], focused["text"].split(SKIP_MARK)):
        assert whole["text"][ref["offset"]: ref["offset"] + ref["chars"]] == shown  # offsets are exact
    # reading on in order from the passage's offset, without a query
    at = focused["passages"][0]["offset"]
    onward = handbook.read([nid], max_chars=500, offset=at)["nodes"][0]
    assert onward["text"] == whole["text"][at: at + 500] and onward["next_offset"] == at + 500


def test_without_a_query_or_when_the_text_fits_the_whole_text_comes_in_order(handbook):
    nid = node_id(handbook)
    whole = handbook.read([nid])["nodes"][0]
    assert "passages" not in whole and NEEDLE in whole["text"]
    fits = handbook.read([nid], query="zanzibar")["nodes"][0]  # 20,000 characters hold it all
    assert fits["text"] == whole["text"] and "passages" not in fits
    continued = handbook.read([nid], max_chars=300, offset=300, query="zanzibar")["nodes"][0]
    assert continued["text"] == whole["text"][300:600]  # an offset reads on in order


def test_a_query_that_matches_nothing_still_returns_passages_in_text_order(handbook):
    nid = node_id(handbook)
    whole = handbook.read([nid])["nodes"][0]["text"]
    focused = handbook.read([nid], max_chars=600, query="qwertyuiop")["nodes"][0]
    assert whole.startswith(focused["text"].split(SKIP_MARK)[0])
    assert [p["offset"] for p in focused["passages"]] == sorted(p["offset"] for p in focused["passages"])


def test_passages_cover_the_text_at_paragraph_breaks():
    text = "a" * 50 + "\n\n" + "b " * 900 + "\n\n" + "c" * 30
    spans = split_passages(text, max_chars=600)
    assert all(hi - lo <= 600 for lo, hi in spans)
    assert "".join(text[lo:hi] for lo, hi in spans).replace("\n", "").replace(" ", "") == \
        text.replace("\n", "").replace(" ", "")
    assert split_passages("") == []


def test_every_face_takes_the_query(handbook):
    service = ToolService(handbook)
    nid = node_id(handbook)
    result = service.call("Read", {"node_ids": [nid], "query": "zanzibar keys"})
    assert "passages" not in result["nodes"][0]  # the service's default max_chars holds the node
    focused = service.read([nid], max_chars=700, query="zanzibar keys")
    assert NEEDLE in focused["nodes"][0]["text"].split(SKIP_MARK)[0]
    for dialect in ("openai", "anthropic", "mcp"):
        read = next(t for t in tool_definitions(dialect) if "Read" in str(t))
        assert "query" in str(read)
