"""The outline form: it says what the JSON ToC says (nodes, titles, hits and
their order, tree shape, read marks), parsed back exactly, in fewer tokens."""
from __future__ import annotations

import json
import threading

import httpx
import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from ritrag.serving.http import create_app
from ritrag.serving.outline import (HANDLE, PARENT_MARK, answer_letters, cap_depth, count_tokens, hit_ranks,
                                    parse_outline, preorder, render_outline, toc_json_text)
from ritrag.serving.tools import ToolService
from serving_fixtures import loaded_index, serving

TITLE_WORDS = st.sampled_from(["Getting", "started", "Guide", "…", "\\x", "*2", "✓", "a1", "[v3]", "Über",
                               "21.12.", "-", "|", "Configuring", "the", "server"])
TITLES = st.lists(TITLE_WORDS, min_size=0, max_size=4).map(" ".join)


@st.composite
def forests(draw, depth: int = 0) -> list[dict]:
    """Sub-forests as `RitragIndex.get_toc` returns them: distinct ids, titles
    (often extending their parent's), hits with scores, optional metadata."""
    trees = []
    for _ in range(draw(st.integers(0, 3 if depth < 3 else 0))):
        node = {"id": f"n{draw(st.uuids()).hex[:11]}", "title": draw(TITLES), "hit": draw(st.booleans())}
        if draw(st.booleans()):
            node["title"] = node["title"] + draw(st.sampled_from([" tutorials", ".to_csv", " > 21.12 Auth"]))
        if node["hit"]:
            node["score"] = draw(st.floats(0, 1, allow_nan=False))
        if draw(st.integers(0, 9)) == 0:
            node["summary"] = draw(TITLES)
            node["keywords"] = draw(st.lists(st.sampled_from(["port", "tls", "Über"]), min_size=1, max_size=2))
        children = draw(forests(depth + 1))
        if children:
            node["children"] = children
        trees.append(node)
    return trees


def with_parent_prefixes(trees: list[dict], parent: str = "") -> list[dict]:
    """Children titled "<parent title><more>", as the trimming expects."""
    for tree in trees:
        if parent and len(tree["title"]) % 2:
            tree["title"] = parent + tree["title"]
        with_parent_prefixes(tree.get("children", []), " ".join(tree["title"].split()))
    return trees


def shape(trees: list[dict], label=lambda node: node["id"]) -> list:
    """What the outline must keep of a JSON ToC: per node its label, title
    (whitespace collapsed), hit rank, read mark, metadata and children."""
    ranks = hit_ranks(trees)

    def one(node: dict) -> tuple:
        return (label(node), " ".join(node["title"].split()), ranks.get(node["id"]), bool(node.get("read")),
                node.get("summary") or None, tuple(node.get("keywords") or ()) or None,
                tuple(one(child) for child in node.get("children", [])))
    return [one(tree) for tree in trees]


def parsed_shape(trees: list[dict]) -> list:
    def one(node: dict) -> tuple:
        return (node["label"], node["title"], node["rank"], node["read"], node.get("summary"),
                tuple(node["keywords"]) if "keywords" in node else None,
                tuple(one(child) for child in node["children"]))
    return [one(tree) for tree in trees]


@seed(13)
@settings(max_examples=150, deadline=None)
@given(forests().map(with_parent_prefixes), st.booleans())
def test_outline_round_trips_to_the_json_tree(trees, handles):
    read = {node["id"] for node, _ in preorder(trees)
            if node.get("hit") and len(node["id"]) % 3 == 0}
    for node, _ in preorder(trees):
        if node["id"] in read:
            node["read"] = True
    outline = render_outline(trees, handle_letters="c" if handles else None, read=read)
    lines = [node["id"] for node, _ in preorder(trees)]
    label = (lambda node: f"c{lines.index(node['id']) + 1}") if handles else (lambda node: node["id"])
    assert parsed_shape(parse_outline(outline)) == shape(trees, label)


def test_titles_that_extend_their_parents_are_trimmed():
    trees = [{"id": "p", "title": "Getting  started", "hit": False, "children": [
        {"id": "c", "title": "Getting started tutorials", "hit": True, "score": 0.5, "children": [
            {"id": "g", "title": "Getting started tutorials", "hit": False}]},
        {"id": "e", "title": "…and more", "hit": False}]}]
    outline = render_outline(trees, handle_letters="a")
    assert outline.splitlines() == ["a1 Getting started", f" a2*1 {PARENT_MARK} tutorials",
                                    "  a3 Getting started tutorials",  # nothing after the parent's title
                                    f" a4 \\{PARENT_MARK}and more"]  # a title starting with the mark: escaped
    assert parsed_shape(parse_outline(outline)) == shape(trees, lambda n: f"a{'pcge'.index(n['id']) + 1}")


def test_handles_are_short_and_never_node_ids():
    letters = [answer_letters(i) for i in range(26 + 26 ** 2 + 26 ** 3)]
    assert letters[:3] == ["a", "b", "c"] and letters[25:28] == ["z", "aa", "ab"] and letters[-1] == "zzz"
    assert len(set(letters)) == len(letters) and answer_letters(len(letters)) == "a"  # then around again
    assert HANDLE.fullmatch("zzz99999") and not HANDLE.fullmatch("a0") and not HANDLE.fullmatch("abcd1")
    assert not HANDLE.fullmatch("2xkv3k2ralu7")  # node ids are 12 characters


@pytest.mark.parametrize("bad", ["oneword", "a1 x\n\na2 y", "a1 x\n   a2 too deep",
                                 f"a1 {PARENT_MARK} root has no parent"])
def test_parse_refuses_what_is_not_outline(bad):
    with pytest.raises(ValueError):
        parse_outline(bad)


def test_served_outline_matches_the_served_json(tiny_hash_index):
    """Over a real index: both forms of one answer carry the same nodes, and the
    episode's outline (handles) is at most half the compact JSON's tokens."""
    service = ToolService(loaded_index(str(tiny_hash_index)))
    for query in ("which port does version 3 listen on", "log rotation", "tls certificates"):
        toc = service.get_toc(query, format="both", episode_id=f"episode {query}")
        lines = [node["id"] for node, _ in preorder(toc["trees"])]
        parsed = parse_outline(toc["outline"])
        assert parsed_shape(parsed) == shape(toc["trees"], lambda node: f"a{lines.index(node['id']) + 1}")
        resolved, unknown = service.episodes.resolve(f"episode {query}", [f"a{i}" for i in range(1, len(lines) + 1)])
        assert not unknown and list(resolved.values()) == lines
        assert count_tokens(toc["outline"]) <= 0.5 * count_tokens(toc_json_text(toc["trees"]))
        assert json.loads(toc_json_text(toc))["trees"] == toc["trees"]


def test_an_episode_over_http_reads_by_handle_then_collapses_what_it_read(tiny_hash_index):
    service = ToolService(loaded_index(str(tiny_hash_index)))
    with serving(create_app(lambda: service)) as url, httpx.Client(base_url=url, timeout=30) as client:
        for _ in range(600):
            if client.get("/readyz").status_code == 200:
                break
            threading.Event().wait(0.05)
        episode = {"episode_id": "http-outline", "format": "both", "n": 3}
        toc = client.post("/v1/toc", json={"query": "log rotation", **episode}).json()
        best = next(n["label"] for n, _ in preorder(parse_outline(toc["outline"])) if n["rank"] == 1)
        read = client.post("/v1/read", json={"node_ids": [best], "episode_id": "http-outline"}).json()
        (node,) = read["nodes"]
        assert node["handle"] == best
        again = client.post("/v1/toc", json={"query": "log rotation", "collapse_read": True, **episode}).json()
        assert node["id"] not in [n["id"] for n, _ in preorder(again["trees"])] and again["collapsed"] == 1
        marked = client.post("/v1/toc", json={"query": "log rotation", **episode}).json()
        assert [n["id"] for n, _ in preorder(marked["trees"]) if n.get("read")] == [node["id"]]
        refused = client.post("/v1/read", json={"node_ids": [node["handle"]]})  # no episode
        assert refused.status_code == 404 and refused.json()["error"]["reason"] == "unknown_handles"


def chain(depth: int) -> list[dict]:
    """One tree: a root, then one child per level down to `depth`, every
    fifth node a hit; the root also has a shallow second child."""
    nodes = [{"id": f"n{level:011d}", "title": f"Level {level}", "hit": level % 5 == 0, "score": 1.0 / (level + 1)}
             for level in range(depth + 1)]
    for parent, child in zip(nodes, nodes[1:]):
        parent["children"] = [child]
    nodes[0]["children"].append({"id": "shallow00000", "title": "Shallow", "hit": True, "score": 0.5})
    return [nodes[0]]


def test_cap_depth_lifts_deeper_nodes_in_order_with_their_depth():
    trees, full = chain(12), chain(12)
    cap_depth(trees, max_depth=4)
    shown = list(preorder(trees))
    assert [node["id"] for node, _ in shown] == [node["id"] for node, _ in preorder(full)]  # same order
    assert max(depth for _, depth in shown) == 4
    assert {node["id"]: node.get("depth") for node, _ in shown if node.get("depth")} == {
        f"n{level:011d}": level for level in range(5, 13)}
    assert hit_ranks(trees) == hit_ranks(full)
    parsed = parse_outline(render_outline(trees))
    assert [(node["label"], node.get("depth"), depth) for node, depth in preorder(parsed)] == [
        (node["id"], node.get("depth"), depth) for node, depth in shown]


def test_cap_depth_leaves_a_tree_within_the_cap_alone():
    trees = chain(4)
    cap_depth(trees, max_depth=4)
    assert trees == chain(4)
