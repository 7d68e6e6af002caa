"""Model metadata (transforms/metadata/, docs/METADATA.md) against a local
server speaking the OpenAI chat-completions protocol, scripted per test and
logging every request: normal, malformed, 429 with Retry-After, 500s, a hang
past the deadline, an answer of 1 MB; builds whose every node ends enriched or
counted, an update that asks only for changed nodes (the index's model, without
naming it) and refuses to describe them unlike the build, and the token budget."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from ritrag.chat import retry_after_seconds
from ritrag.evaluation.forest_report import forest_report, render_text
from ritrag.layout import IndexLayout
from ritrag.pipelines import update
from ritrag.pipelines.options import JobOptionsError
from ritrag.representation import NODE_DOC_ORDINAL
from ritrag.serving.api import RitragIndex
from ritrag.transforms.metadata.base import (MAX_KEYWORDS, MetadataFailure, MetadataRequest, metadata_key,
                                             parse_answer)
from ritrag.transforms.metadata.enrich import AdmitWithinBudget, within
from ritrag.transforms.metadata.openai_compatible import EndpointConfig, OpenAICompatibleModel
from chat_endpoint import FakeEndpoint
from support import TINY_SITE, build_index, live_table, node_row, tiny_page, write_tiny_site

def title_of(body: dict) -> str:
    """The node title a request asks about: the last level of its title path."""
    user = body["messages"][-1]["content"]
    return user.split("\n", 1)[0].removeprefix("Title path: ").split(" > ")[-1]


def asked_titles(endpoint: FakeEndpoint) -> list[str]:
    return sorted(title_of(body) for body in endpoint.log)


def answer(title: str) -> str:
    return json.dumps({"summary": f"Model summary of {title}.", "keywords": ["modelkw", title.lower()]})


def normal(body: dict, n: int) -> tuple:
    return ("ok", answer(title_of(body)))


def ask(endpoint: FakeEndpoint, *titles: str, **config) -> list:
    model = OpenAICompatibleModel(EndpointConfig(endpoint.url, "fake-model", **{"backoff_s": 0.05, **config}))
    try:
        return model.describe([MetadataRequest(f"k{i}", f"Site > {t}", f"Text of {t}.") for i, t in enumerate(titles)])
    finally:
        model.close()


# --- the backend, request by request -------------------------------------------------

def test_a_normal_answer_gives_the_metadata_and_its_tokens():
    with FakeEndpoint(normal) as endpoint:
        (got,) = ask(endpoint, "Install")
    assert got.failure is None and got.requests == 1
    assert got.value.summary == "Model summary of Install." and got.value.keywords == ("modelkw", "install")
    assert got.tokens_in > 0 and got.tokens_out > 0
    body = endpoint.log[0]
    assert body["model"] == "fake-model" and body["messages"][0]["role"] == "system"
    assert "Title path: Site > Install" in body["messages"][1]["content"]


def test_a_malformed_answer_is_a_counted_failure_not_retried():
    with FakeEndpoint(lambda body, n: ("ok", '{"summary": "cut off", "keywo')) as endpoint:
        (got,) = ask(endpoint, "Install")
    assert (got.value, got.failure, got.requests) == (None, "malformed", 1)


def test_429_waits_for_retry_after_then_succeeds():
    script = lambda body, n: ("status", 429, {"Retry-After": "1"}) if n == 0 else normal(body, n)  # noqa: E731
    with FakeEndpoint(script) as endpoint:
        (got,) = ask(endpoint, "Install")
    assert got.failure is None and got.requests == 2 and len(endpoint.log) == 2


def test_retry_after_reads_seconds_only():
    assert [retry_after_seconds(v) for v in ("3", "0.5", None, "Wed, 21 Oct 2015 07:28:00 GMT", "-1", "inf")] == [
        3.0, 0.5, None, None, None, None]


def test_500s_are_retried_then_counted_as_failed():
    with FakeEndpoint(lambda body, n: ("status", 500, {})) as endpoint:
        (got,) = ask(endpoint, "Install", max_attempts=3)
    assert (got.value, got.failure, got.requests) == (None, "http_500", 3)
    assert len(endpoint.log) == 3


def test_a_4xx_other_than_429_is_not_retried():
    with FakeEndpoint(lambda body, n: ("status", 400, {})) as endpoint:
        (got,) = ask(endpoint, "Install")
    assert (got.failure, got.requests) == ("http_400", 1)


def test_a_hanging_answer_fails_at_the_deadline():
    with FakeEndpoint(lambda body, n: ("hang", answer("late"))) as endpoint:
        (got,) = ask(endpoint, "Install", deadline_s=2.0)
    assert (got.value, got.failure, got.requests) == (None, "timeout", 1)


def test_an_answer_of_1_mb_is_cut_at_the_cap():
    with FakeEndpoint(lambda body, n: ("big", 1 << 20)) as endpoint:
        (got,) = ask(endpoint, "Install", max_answer_bytes=64 << 10)
    assert (got.value, got.failure, got.requests) == (None, "too_large", 1)


def test_a_reply_nested_past_the_parser_is_not_a_completion():
    with FakeEndpoint(lambda body, n: ("raw", b'{"choices": ' + b"[" * 50_000)) as endpoint:
        (got,) = ask(endpoint, "Install")
    assert (got.value, got.failure, got.requests) == (None, "not_a_completion", 1)


def test_one_batch_mixes_answers_in_order():
    script = lambda body, n: ("ok", "not json") if title_of(body) == "Bad" else normal(body, n)  # noqa: E731
    with FakeEndpoint(script) as endpoint:
        got = ask(endpoint, "One", "Bad", "Three", in_flight=2)
    assert [a.failure for a in got] == [None, "malformed", None]
    assert [a.value.summary for a in got if a.value] == ["Model summary of One.", "Model summary of Three."]


# --- the answer's checks ------------------------------------------------------------

def test_parse_answer_takes_the_object_asked_for():
    assert parse_answer('```json\n{"summary": "Ports  and TLS.", "keywords": ["port", " tls ", "port"]}\n```') \
        .keywords == ("port", "tls")


@pytest.mark.parametrize("content", [
    "Sure! Here it is.", "[]", '{"summary": "x"}', '{"summary": "x", "keywords": [], "extra": 1}',
    '{"summary": "", "keywords": []}', '{"summary": "x", "keywords": "a, b"}',
    json.dumps({"summary": "word " * 61, "keywords": []}),
    json.dumps({"summary": "x", "keywords": [f"k{i}" for i in range(MAX_KEYWORDS + 1)]}),
    '```python\n{"summary": "x", "keywords": []}\n```', "[" * 100_000])
def test_parse_answer_refuses_anything_else(content):
    with pytest.raises(MetadataFailure):
        parse_answer(content)


def test_the_cache_key_is_the_node_text_model_and_prompt_not_its_place():
    node = node_row(title="TLS", body="Certificates.", ancestor_titles=["A"])
    assert metadata_key("m", node) == metadata_key("m", node._replace(ancestor_titles=["B", "C"]))
    assert len({metadata_key("m", node), metadata_key("m2", node), metadata_key("m", node._replace(body="x"))}) == 3


def test_the_budget_admits_a_prefix_in_key_order_whatever_the_merge_order():
    costs = [(f"k{i:02d}", 10 + i) for i in range(30)]
    fn = AdmitWithinBudget(100)
    whole = fn.extract_output(fn.add_input(fn.create_accumulator(), costs[0]) + costs[1:])
    parts = [fn.create_accumulator() for _ in range(3)]
    for i, element in enumerate(reversed(costs)):
        parts[i % 3] = fn.add_input(parts[i % 3], element)
    assert fn.extract_output(fn.merge_accumulators(parts)) == whole == costs[:7]  # 10+...+16 = 91; +17 > 100
    assert fn.extract_output(fn.create_accumulator()) == []
    assert within(whole, 100) == ("k06", 91) and within(whole, 40) == ("k02", 33) and within(whole, 5) == ("", 0)


# --- builds and updates -------------------------------------------------------------------

def metadata_flags(endpoint: FakeEndpoint, *extra: str) -> tuple[str, ...]:
    return ("--embedding_model", "hashing:384", "--metadata_endpoint", endpoint.url, "--metadata_model",
            "fake-model", "--metadata_deadline_s", "5", *extra)


def manifest_of(index: Path):
    return IndexLayout(str(index)).load_manifest()


def nodes_by_title(index: Path) -> dict[str, dict]:
    return {row["title"]: row for row in live_table(index, "nodes").values()}


def node_docs(index: Path) -> list[str]:
    layout = IndexLayout(str(index))
    texts = []
    for segment in manifest_of(index).segments:
        for path in sorted(Path(layout.segment_dir(segment["id"])).glob("chunks-*.parquet")):
            table = pq.read_table(path, columns=["ordinal", "text"]).to_pylist()
            texts += [r["text"] for r in table if r["ordinal"] == NODE_DOC_ORDINAL]
    return texts


def accounted(counts: dict) -> bool:
    return counts["metadata_nodes"] == counts["metadata_enriched"] + counts["metadata_failed"] + \
        counts["metadata_not_asked"]


@pytest.fixture(scope="module")
def enriched(tmp_path_factory):
    """The tiny site built with model metadata; the "Logging" page's requests always fail with 500."""
    root = tmp_path_factory.mktemp("metadata")
    site = write_tiny_site(root / "a")
    index = root / "index"
    script = lambda body, n: ("status", 500, {}) if title_of(body) == "Logging" else normal(body, n)  # noqa: E731
    with FakeEndpoint(script) as endpoint:
        build_index(site, index, *metadata_flags(endpoint, "--metadata_max_attempts", "2"))
    return site, index, endpoint


def test_a_build_ends_with_every_node_enriched_or_counted_failed(enriched):
    _, index, endpoint = enriched
    manifest = manifest_of(index)
    counts = manifest.stats["pages"]
    assert accounted(counts) and counts["metadata_failed"] == counts["metadata_failed_http_500"] == 1
    assert counts["metadata_not_asked"] == 0 and counts["metadata_cache_hits"] == 0
    assert counts["metadata_enriched"] == counts["metadata_asked"] - 1 > 3
    assert counts["metadata_requests"] == len(endpoint.log) == counts["metadata_asked"] + 1  # Logging, twice
    assert counts["metadata_tokens_in"] > 0 and counts["metadata_tokens_out"] > 0
    assert manifest.config["metadata"] == {"model": "fake-model", "prompt_version": "node-metadata-v1"}
    described = [n for n in live_table(index, "nodes").values() if n["metadata_key"]]
    assert len(described) == counts["metadata_enriched"]
    for node in described:
        assert node["summary"] == f"Model summary of {node['title']}." and "modelkw" in node["keywords"]
    failed = nodes_by_title(index)["Logging"]
    assert failed["metadata_key"] == "" and failed["summary"] == failed["source_summary"]


def test_model_metadata_reaches_node_documents_toc_and_inspect(enriched):
    _, index, _ = enriched
    assert any("Model summary of" in doc and "modelkw" in doc for doc in node_docs(index))
    trees = RitragIndex(str(index)).get_toc("modelkw summary")
    shown = json.dumps(trees)
    assert "Model summary of" in shown and "modelkw" in shown
    report = forest_report(str(index))
    counts = manifest_of(index).stats["pages"]
    assert report["model_metadata"]["nodes"] == counts["metadata_enriched"]
    assert f"model metadata: {counts['metadata_enriched']} nodes (fake-model, node-metadata-v1)" in render_text(report)


def test_a_rebuild_asks_nothing_it_has_cached(enriched, tmp_path):
    site, index, _ = enriched
    with FakeEndpoint(normal) as endpoint:
        build_index(site, tmp_path / "again", *metadata_flags(endpoint, "--metadata_cache",
                                                             str(index / "metadata_cache")))
    counts = manifest_of(tmp_path / "again").stats["pages"]
    assert asked_titles(endpoint) == ["Logging"]  # the one that failed; every other text is a cache hit
    assert counts["metadata_cache_hits"] == counts["metadata_enriched"] - 1 and accounted(counts)


def test_an_update_asks_only_for_the_nodes_whose_text_changed(enriched, tmp_path):
    _, built, _ = enriched
    index = tmp_path / "index"
    shutil.copytree(built, index)  # the index and its metadata cache
    snapshot = write_tiny_site(tmp_path / "b")
    title, trail, _ = TINY_SITE["shop/v3/logging.html"]
    (snapshot / "shop/v3/logging.html").write_text(tiny_page(title, trail, [("Rotation", "Logs rotate hourly.")]))
    (snapshot / "shop/v3/metrics.html").write_text(tiny_page(
        "Metrics", [("Shop Server", "shop/"), ("Version 3", "shop/v3/")], [("Endpoint", "Scrape /metrics.")]))
    before = set(nodes_by_title(index))
    with FakeEndpoint(normal) as endpoint:  # the model, and what it is asked, are the index's
        update.run(["--input", str(snapshot), "--index", str(index), "--metadata_endpoint", endpoint.url,
                    "--metadata_deadline_s", "5"])
    assert asked_titles(endpoint) == ["Logging", "Metrics"]  # the edited page and the new one, nothing else
    assert {body["model"] for body in endpoint.log} == {"fake-model"}
    assert manifest_of(index).config["metadata"] == manifest_of(built).config["metadata"]
    unchanged = nodes_by_title(built)["Deploying"]
    assert nodes_by_title(index)["Deploying"]["summary"] == unchanged["summary"] == "Model summary of Deploying."
    nodes = nodes_by_title(index)
    assert set(nodes) == before | {"Metrics"}
    assert nodes["Metrics"]["summary"] == "Model summary of Metrics." and nodes["Metrics"]["metadata_key"]
    assert nodes["Logging"]["summary"] == "Model summary of Logging."
    counts = manifest_of(index).stats["pages"]
    assert counts["metadata_requests"] == 2 and accounted(counts)
    docs = node_docs(index)
    assert any("Model summary of Metrics." in d for d in docs)


ELSEWHERE = "http://127.0.0.1:9/v1"  # never asked: each of these updates is refused before anything runs


@pytest.mark.parametrize("flags, refusal", [
    ((), "the index was built asking the model 'fake-model' for a summary and keywords per node, and an update "
         "asks the same of its new and changed pages: give --metadata_endpoint"),
    (("--metadata_endpoint", ELSEWHERE, "--metadata_model", "other-model"),
     "--metadata_model 'other-model' (the index has 'fake-model')"),
    (("--metadata_endpoint", ELSEWHERE, "--metadata_nodes", "off"), "--metadata_nodes 'off' (the index has 'on')"),
    (("--metadata_endpoint", ELSEWHERE, "--induce_toc", "llm"), "--induce_toc 'llm' (the index has 'off')"),
])
def test_an_update_that_would_describe_pages_unlike_the_build_is_refused(enriched, flags, refusal):
    site, index, _ = enriched
    live = manifest_of(index).version
    with pytest.raises(JobOptionsError, match=re.escape(refusal)):
        update.run(["--input", str(site), "--index", str(index), *flags])
    assert manifest_of(index).version == live


@pytest.mark.parametrize("flags, refusal", [
    (("--metadata_endpoint", ELSEWHERE), "--metadata_endpoint: the index was built without a model"),
    (("--metadata_endpoint", ELSEWHERE, "--metadata_model", "fake-model"),
     "--metadata_model 'fake-model' (the index has None)"),
])
def test_an_update_cannot_give_an_index_built_without_a_model_one(tiny_site, tiny_hash_index, flags, refusal):
    with pytest.raises(JobOptionsError, match=re.escape(refusal)):
        update.run(["--input", str(tiny_site), "--index", str(tiny_hash_index), *flags])


def test_the_budget_stops_cleanly_and_says_how_far_it_got(tiny_site, tmp_path):
    with FakeEndpoint(normal) as endpoint:
        build_index(tiny_site, tmp_path / "index", *metadata_flags(endpoint, "--metadata_max_tokens", "1500"))
    counts = manifest_of(tmp_path / "index").stats["pages"]
    assert counts["metadata_not_asked"] > 0 and counts["metadata_enriched"] > 0 and accounted(counts)
    assert counts["metadata_requests"] == len(endpoint.log) == counts["metadata_asked"]
    assert counts["metadata_tokens_in"] + counts["metadata_tokens_out"] <= 1500
    described = [n for n in live_table(tmp_path / "index", "nodes").values() if n["metadata_key"]]
    assert len(described) == counts["metadata_enriched"]


def test_metadata_retrieval_off_shows_it_in_the_toc_only(enriched, tmp_path):
    site, index, _ = enriched
    with FakeEndpoint(normal) as endpoint:
        build_index(site, tmp_path / "toc_only", *metadata_flags(endpoint, "--metadata_cache",
                                                                str(index / "metadata_cache"),
                                                                "--metadata_retrieval", "off"))
    out = tmp_path / "toc_only"
    assert manifest_of(out).config["representation"]["metadata_retrieval"] is False
    assert not any("Model summary of" in doc or "modelkw" in doc for doc in node_docs(out))
    nodes = nodes_by_title(out)
    assert nodes["Deploying"]["summary"] == "Model summary of Deploying."
    assert "Model summary of Deploying." in json.dumps(RitragIndex(str(out)).get_toc("deploy containers"))


def test_without_an_endpoint_nothing_changes(tiny_hash_index):
    counts = manifest_of(tiny_hash_index).stats["pages"]
    assert not any(name.startswith("metadata_") for name in counts)
    assert not any(n["metadata_key"] for n in nodes_by_title(tiny_hash_index).values())
    assert "metadata" not in manifest_of(tiny_hash_index).config


def test_a_model_without_an_endpoint_is_refused(tiny_site, tmp_path):
    with pytest.raises(JobOptionsError, match="--metadata_endpoint"):
        build_index(tiny_site, tmp_path / "index", "--metadata_model", "m")
