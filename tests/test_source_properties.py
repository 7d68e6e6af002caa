"""Property-based tests of the YAML and JSON input parsers (issue 25): whatever
the nesting, the aliases or the shape of a Markdown front matter, an mkdocs.yml
nav, a Discourse topic or a paper, a file becomes pages or one dead letter with
a reason, at a cost bounded by its size: never another exception, never a node
deeper than MAX_TREE_DEPTH, never an unbounded title.

Derandomized with bounded example counts, so a failure reproduces."""
from __future__ import annotations

import json
import time
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ritrag.schema import MAX_TREE_DEPTH, DeadLetter
from ritrag.transforms.pages import PageParser, parse_or_dead_letter, read_file
from ritrag.transforms.sources.common import MAX_META_CHARS, MAX_YAML_NODES, RefusedYaml, load_yaml

# Large inputs are the point here (topics of 300 posts, deep chains): hypothesis'
# entropy check would refuse them, depending on what ran before in the process.
FAST = settings(derandomize=True, max_examples=80, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])
BASE = "http://localhost/"
SECONDS_PER_FILE = 5.0  # of CPU (a loaded machine's waits do not count): far above any input here (a few KB); a blow-up takes minutes

keys = st.text("abcdefgh_", min_size=1, max_size=6)
texts = st.text(max_size=40) | st.sampled_from(["", "x" * 5_000, "\ud800", "a\x00b", "*", "&", "[[", "{{"])
scalars = st.none() | st.booleans() | st.integers(-(2 ** 70), 2 ** 70) | st.floats(allow_nan=True) | texts
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=30)


@st.composite
def aliased_yaml(draw) -> str:
    """Anchored lists each naming earlier anchors several times (a "billion
    laughs" of random width and depth, sometimes naming itself), and a title
    that aliases one of them, or a plain value."""
    levels, width = draw(st.integers(1, 10)), draw(st.integers(1, 12))
    lines = [f"a0: &a0 [{', '.join(['lol'] * width)}]"]
    for level in range(1, levels + 1):
        named = draw(st.lists(st.integers(0, level), min_size=1, max_size=width))  # `level`: itself
        lines.append(f"a{level}: &a{level} [{', '.join(f'*a{i}' for i in named)}]")
    title = draw(st.sampled_from([f"*a{draw(st.integers(0, levels))}", "Plain title", "[1, [2, [3]]]"]))
    nesting = draw(st.integers(0, 300))
    return "\n".join(lines + [f"title: {title}", f"deep: {'[' * nesting}x{']' * nesting}"]) + "\n"


def parse_file(path: Path, root: Path):
    parser = PageParser(str(root) + "/", BASE, 1, 1 << 22)
    started = time.process_time()
    outcome = parse_or_dead_letter(parser, str(path), lambda: read_file(str(path)), "parse")
    assert time.process_time() - started < SECONDS_PER_FILE
    return outcome


def pages_and_dead_letters(outcome) -> tuple[list, list]:
    """parse_or_dead_letter's outcome as (pages, dead letters); a `parser_error`
    dead letter is an exception the parser did not expect: a bug, not a refusal."""
    if isinstance(outcome, DeadLetter):
        assert outcome.reason != "parser_error", outcome
        return [], [outcome]
    return list(outcome), []


def assert_bounded(pages) -> None:
    for page in pages:
        assert len(page.title) <= MAX_META_CHARS * 2  # a title, not an expanded structure
        assert len(page.trail) <= MAX_TREE_DEPTH + 1  # the forest places nothing deeper than the cap
        assert all(len(section.path) <= MAX_TREE_DEPTH for section in getattr(page, "sections", ()))


@FAST
@given(text=aliased_yaml() | st.text(max_size=300))
def test_load_yaml_returns_a_value_or_refuses_at_the_cost_of_its_size(text):
    started = time.process_time()
    try:
        value = load_yaml(text)
    except RefusedYaml as refused:
        assert "alias" in str(refused) or "nest" in str(refused)
    except yaml.YAMLError:
        pass  # malformed YAML: its own documented error
    else:
        json.dumps(value, default=str)  # a finite value (an alias into itself would never render)
    assert time.process_time() - started < SECONDS_PER_FILE


def test_the_alias_limit_is_where_it_says():
    def aliases(n: int) -> str:  # a list of 1,000 scalars named n times
        return "a0: &a0 [" + ", ".join(["x"] * 1000) + "]\nb: [" + ", ".join(["*a0"] * n) + "]\n"

    assert len(load_yaml(aliases(90))["b"]) == 90  # about 91,000 nodes: kept
    try:
        load_yaml(aliases(200))
    except RefusedYaml:
        pass
    else:
        raise AssertionError(f"an expansion past {MAX_YAML_NODES} nodes was accepted")


@FAST
@given(front_matter=aliased_yaml(), body=st.text(max_size=200))
def test_markdown_front_matter_of_any_shape_is_a_page_or_a_dead_letter(tmp_path_factory, front_matter, body):
    root = tmp_path_factory.mktemp("md")
    path = root / "doc.md"
    path.write_text(f"---\n{front_matter}---\n# Heading\n\n{body}\n", encoding="utf-8", errors="surrogatepass")
    pages, dead = pages_and_dead_letters(parse_file(path, root))
    assert len(pages) + len(dead) >= 1 and all(d.reason for d in dead)
    assert_bounded(pages)


@FAST
@given(nav=aliased_yaml())
def test_any_mkdocs_nav_places_the_documents_or_falls_back_to_folders(tmp_path_factory, nav):
    root = tmp_path_factory.mktemp("mkdocs")
    (root / "docs").mkdir()
    (root / "mkdocs.yml").write_text(f"site_name: S\n{nav}nav:\n  - Home: index.md\n  - *a0\n", encoding="utf-8")
    (root / "docs" / "index.md").write_text("# Home\n\nWelcome.\n", encoding="utf-8")
    pages, dead = pages_and_dead_letters(parse_file(root / "docs" / "index.md", root))
    assert pages and not dead  # a bad nav never costs the document
    assert_bounded(pages)


@st.composite
def discourse_topics(draw) -> dict:
    """A topic whose posts reply to arbitrary earlier (or later, or missing)
    posts, long chains included, with arbitrary extra values."""
    n = draw(st.integers(1, 300))
    chain = draw(st.booleans())  # each post replying to the one before: a chain as deep as the topic
    posts = []
    for number in range(1, n + 1):
        reply_to = number - 1 if chain else draw(st.none() | st.integers(-2, n + 2))
        posts.append({"post_number": number, "reply_to_post_number": reply_to or None,
                      "cooked": f"<p>post {number}</p>", "username": draw(texts), "extra": draw(json_values)})
    return {"title": draw(texts) or "Topic", "id": 7, "post_stream": {"posts": posts}}


@FAST
@given(topic=discourse_topics())
def test_a_discourse_topic_of_any_shape_is_pages_within_the_depth_cap(tmp_path_factory, topic):
    root = tmp_path_factory.mktemp("discourse")
    path = root / "t.json"
    path.write_text(json.dumps(topic), encoding="utf-8", errors="surrogatepass")
    pages, dead = pages_and_dead_letters(parse_file(path, root))
    assert pages or dead
    assert_bounded(pages)


@FAST
@given(depth=st.integers(0, 3_000), shape=st.sampled_from(["sections", "full_text", "lists", "dicts"]),
       junk=json_values)
def test_a_paper_nested_to_any_depth_is_a_page_or_a_dead_letter(tmp_path_factory, depth, shape, junk):
    root = tmp_path_factory.mktemp("paper")
    if shape == "sections":
        paper = {"title": "P", "abstract": "A.", "sections": [{"heading": "H", "text": "t", "extra": junk}]}
        text = json.dumps(paper)
    elif shape == "full_text":
        name = " ::: ".join(f"S{i}" for i in range(min(depth, 500)))
        text = json.dumps({"title": "P", "abstract": "A.",
                           "full_text": [{"section_name": name or "Body", "paragraphs": ["p", junk]}]})
    else:  # raw nesting of lists or objects, as deep as the example asks
        opening, closing = ("[", "]") if shape == "lists" else ('{"a": ', "}")
        text = '{"title": "P", "abstract": "A.", "sections": ' + opening * depth + "1" + closing * depth + "}"
    path = root / "paper.json"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    pages, dead = pages_and_dead_letters(parse_file(path, root))
    assert pages or dead
    assert all(d.reason for d in dead)
    assert_bounded(pages)
