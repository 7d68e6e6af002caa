"""ritrag/index_config.py: one typed IndexConfig, from which the build's flags,
the manifest's record and the update's check come."""
from __future__ import annotations

import argparse

import pytest

from ritrag.embedder import EmbedderSpec
from ritrag.index_config import DEFAULT_BASE_URL, INDEX_FLAGS, IndexConfig, ModelSteps
from ritrag.pipelines.launcher import BuildOptions, index_config_of
from ritrag.pipelines.options import parse_job_options
from ritrag.representation import LEGACY, Representation

DENSE_INFO = {"factory": "IDMap2,Flat", "nprobe": 1, "rerank": 1, "dim": 384, "n_vectors": 10}
# A flag of every INDEX_FLAGS value, each other than the default config's.
OTHER_VALUES = {"base_url": "https://docs.example/", "site_depth": 2, "granularity": "section", "num_shards": 3,
                "embedding_model": "hashing:64", "query_prefix": "query: ", "document_prefix": "passage: ",
                "dense_factory": "IVF1,SQ8", "dense_nprobe": 7, "dense_rerank": 4,
                "chunk_template": "{title}\\n{body}", "path_levels": 2, "node_docs": "off", "anchor_docs": "off",
                "node_doc_vectors": "on", "metadata_retrieval": "off", "metadata_model": "qwen", "metadata_nodes": "off", "induce_toc": "llm",
                "induce_toc_min_pages": 3}


def build_flags(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    BuildOptions._add_argparse_args(parser)
    return parser.parse_args(list(argv))


def test_the_flags_defaults_are_the_configs():
    assert {flag.name for flag in INDEX_FLAGS} == set(OTHER_VALUES)
    defaults = build_flags()
    assert index_config_of(parse_job_options([], {BuildOptions: None})) == IndexConfig()
    for flag in INDEX_FLAGS:
        shown = getattr(defaults, flag.name)
        # a flag that states its default in its help has None: left out, the config's default applies
        assert shown == (None if flag.default_in_help else flag.value(IndexConfig())), flag.name
    assert IndexConfig().with_flags(vars(defaults)) == IndexConfig()


def test_every_flag_sets_its_value():
    config = index_config_of(parse_job_options([f"--{name}={value}" for name, value in OTHER_VALUES.items()],
                                               {BuildOptions: None}))
    assert config == IndexConfig(base_url="https://docs.example/", site_depth=2, granularity="section", num_shards=3,
                                 embedder=EmbedderSpec("hashing:64", "query: ", "passage: "),
                                 representation=Representation(template="{title}\n{body}", path_levels=2,
                                                                node_docs=False, anchor_docs=False,
                                                                node_doc_vectors=True, metadata_retrieval=False),
                                 dense_factory="IVF1,SQ8", dense_nprobe=7, dense_rerank=4,
                                 model_steps=ModelSteps("qwen", metadata_nodes=False, induce_toc=True,
                                                        induce_toc_min_pages=3))


def test_the_manifest_record_round_trips():
    config = IndexConfig(base_url="https://docs.example/", site_depth=1, granularity="section", num_shards=2,
                         embedder=EmbedderSpec("hashing:384"), representation=Representation(path_levels=3),
                         dense_factory="IDMap2,Flat", dense_nprobe=1, dense_rerank=1)
    recorded = config.to_manifest(DENSE_INFO, {})
    assert set(recorded) == {"embedder", "dense", "bm25", "representation", "retrieval", "granularity",
                             "num_shards", "base_url", "base_url_given", "site_bases", "site_depth"}
    assert recorded["embedder"]["dimension"] == 384 and recorded["base_url_given"] is True
    assert IndexConfig.from_manifest(recorded) == config
    # a base URL left to the sites' pages: recorded as the fallback, read back as not given
    inferred = IndexConfig().to_manifest(DENSE_INFO, {"site": {"base": "https://x/"}})
    assert (inferred["base_url"], inferred["base_url_given"]) == (DEFAULT_BASE_URL, False)
    assert IndexConfig.from_manifest(inferred).base_url is None


@pytest.mark.parametrize("steps, entries", [
    (ModelSteps(), set()),
    (ModelSteps("qwen", metadata_prompt="node-v9"), {"metadata"}),
    (ModelSteps("qwen", metadata_nodes=False, induce_toc=True, induce_toc_min_pages=3, toc_prompt="toc-v9"),
     {"induce_toc"}),
    (ModelSteps("qwen", induce_toc=True, induce_toc_min_pages=3, metadata_prompt="node-v9", toc_prompt="toc-v9"),
     {"metadata", "induce_toc"}),
])
def test_what_the_model_is_asked_is_recorded_only_when_asked_and_round_trips(steps, entries):
    config = IndexConfig(embedder=EmbedderSpec("hashing:384"), dense_factory="IDMap2,Flat", dense_nprobe=1,
                         dense_rerank=1, model_steps=steps)
    recorded = config.to_manifest(DENSE_INFO, {})
    assert {"metadata", "induce_toc"} & set(recorded) == entries
    assert IndexConfig.from_manifest(recorded) == config
    if "induce_toc" in entries:
        assert recorded["induce_toc"] == {"model": "qwen", "prompt_version": "toc-v9", "min_pages": 3}


def test_a_manifest_that_predates_a_value_reads_as_its_builds_did():
    old = {"embedder": {"model": "hashing:384", "dimension": 384}, "base_url": "http://localhost/",
           "granularity": "page", "num_shards": 1}
    config = IndexConfig.from_manifest(old)
    assert config.base_url == "http://localhost/"  # before sites' bases were inferred, the base URL was the one used
    assert config.site_depth == 0 and config.representation == LEGACY
    assert config.embedder == EmbedderSpec("hashing:384")  # prefixes, backend: their defaults
    assert (config.dense_factory, config.dense_nprobe, config.dense_rerank) == (None, None, None)


@pytest.mark.parametrize("name", OTHER_VALUES)
def test_a_flag_that_asks_for_another_value_is_a_change(name):
    live = IndexConfig(embedder=EmbedderSpec("hashing:384"), dense_factory="IDMap2,Flat", dense_nprobe=1,
                       dense_rerank=1)
    flag = next(f for f in INDEX_FLAGS if f.name == name)
    assert live.changes_asked({name: flag.value(live)} if flag.value(live) is not None else {}) == []
    changes = live.changes_asked({name: OTHER_VALUES[name], "input": "elsewhere"})
    assert changes == [f"--{name} {OTHER_VALUES[name]!r} (the index has {flag.value(live)!r})"]


def test_the_template_flag_writes_a_newline_as_backslash_n():
    assert IndexConfig().changes_asked({"chunk_template": "{path}\\n{body}"}) == []
    with pytest.raises(ValueError, match="must contain"):
        IndexConfig().with_flags({"chunk_template": "{title}"})
