"""ritrag/index_config.py: one typed IndexConfig, from which the build's flags,
the manifest's record and the update's check come; one typed ManifestConfig,
which every reader of a manifest's config reads."""
from __future__ import annotations

import argparse
import json

import pytest

from ritrag.embedder import EmbedderSpec
from ritrag.index_config import (DEFAULT_BASE_URL, INDEX_FLAGS, Bm25Parameters, DenseSettings, IndexConfig,
                                 ManifestConfig, ModelSteps)
from ritrag.layout import DamagedIndexError, IndexLayout, Manifest
from ritrag.pipelines.launcher import BuildOptions, index_config_of
from ritrag.pipelines.options import parse_job_options
from ritrag.representation import DEFAULT_RETRIEVAL, LEGACY, Representation, retrieval_defaults
from ritrag.serving.retrieval import RetrievalParams

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
    assert ManifestConfig.from_manifest(recorded).index == config
    # a base URL left to the sites' pages: recorded as the fallback, read back as not given
    inferred = IndexConfig().to_manifest(DENSE_INFO, {"site": {"base": "https://x/"}})
    assert (inferred["base_url"], inferred["base_url_given"]) == (DEFAULT_BASE_URL, False)
    assert ManifestConfig.from_manifest(inferred).index.base_url is None


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
    assert ManifestConfig.from_manifest(recorded).index == config
    if "induce_toc" in entries:
        assert recorded["induce_toc"] == {"model": "qwen", "prompt_version": "toc-v9", "min_pages": 3}


def test_a_manifest_that_predates_a_value_reads_as_its_builds_did():
    old = {"embedder": {"model": "hashing:384", "dimension": 384}, "base_url": "http://localhost/",
           "granularity": "page", "num_shards": 1}
    settings = ManifestConfig.from_manifest(old)
    config = settings.index
    assert config.base_url == "http://localhost/"  # before sites' bases were inferred, the base URL was the one used
    assert config.site_depth == 0 and config.representation == LEGACY
    assert config.embedder == EmbedderSpec("hashing:384")  # prefixes, backend: their defaults
    # searched as the server did then: 64 lists probed, no re-ranking
    assert settings.dense == DenseSettings(factory=None, nprobe=64, rerank=1)
    assert (config.dense_factory, config.dense_nprobe, config.dense_rerank) == (None, 64, 1)
    assert settings.bm25 == Bm25Parameters(1.2, 0.75) and settings.site_bases is None
    assert settings.retrieval == retrieval_defaults(LEGACY)  # without node documents: the paper's rule


def test_a_representation_that_predates_node_doc_vectors_embeds_node_documents():
    """Before the flag, builds embedded node documents; the default is off now."""
    recorded = {k: v for k, v in Representation().to_dict().items() if k != "node_doc_vectors"}
    settings = ManifestConfig.from_manifest({"embedder": {"model": "hashing:384"}, "representation": recorded})
    assert settings.index.representation.node_doc_vectors and settings.index.representation.dense_node_docs
    assert not ManifestConfig.from_manifest(IndexConfig().to_manifest(DENSE_INFO, {})).index.representation \
        .node_doc_vectors


def test_a_build_record_reads_back_typed():
    recorded = IndexConfig(representation=Representation(node_docs=False)).to_manifest(
        {**DENSE_INFO, "metric": "inner_product", "train_sample": 10}, {"site": {"base": None}})
    settings = ManifestConfig.from_manifest(recorded)
    assert settings.dense == DenseSettings("IDMap2,Flat", nprobe=1, rerank=1, dim=384, n_vectors=10, train_sample=10)
    assert settings.retrieval == recorded["retrieval"] and settings.retrieval["node_score"] == "max"
    assert settings.site_bases == {"site": {"base": None}} and settings.bm25 == Bm25Parameters()
    # a retrieval record missing a parameter (built before it existed): its default
    partial = {**recorded, "retrieval": {"fusion": "rrf"}}
    assert ManifestConfig.from_manifest(partial).retrieval == {**DEFAULT_RETRIEVAL, "fusion": "rrf"}


@pytest.mark.parametrize("change, refusal", [
    (lambda c: c.update(granularity="chapter"), "config: granularity must be one of"),
    (lambda c: c.update(site_depth="1"), "config: "),
    (lambda c: c["representation"].update(path_levels=0), "config.representation: path levels"),
    (lambda c: c["representation"].update(colour="red"), "config.representation: "),
    (lambda c: c["embedder"].update(model=7), "config.embedder: embedder model must be a string"),
    (lambda c: c.update(metadata={"prompt_version": "v1"}), "config.metadata or induce_toc: no entry 'model'"),
])
def test_a_manifest_config_no_reader_could_use_is_refused_at_load(tmp_path, change, refusal):
    config = IndexConfig(embedder=EmbedderSpec("hashing:384")).to_manifest(DENSE_INFO, {})
    change(config)
    with pytest.raises(ValueError, match=refusal.replace(".", r"\.")):
        ManifestConfig.from_manifest(config)
    manifest = Manifest(version="v000001", parent=None, created=1.0, segments=[], tombstones={}, stats={},
                        config=IndexConfig(embedder=EmbedderSpec("hashing:384")).to_manifest(DENSE_INFO, {}))
    raw = json.loads(manifest.to_json())
    change(raw["config"])
    (tmp_path / "versions").mkdir()
    (tmp_path / "versions" / "v000001.json").write_text(json.dumps(raw))
    (tmp_path / "CURRENT").write_text("v000001\n")
    with pytest.raises(DamagedIndexError, match="not a valid manifest") as refused:
        IndexLayout(str(tmp_path)).load_manifest()
    assert refusal.split(":")[0] in str(refused.value)


@pytest.mark.parametrize("retrieval", [{"fusion": "bogus"}, {"node_score": "sum"}, {"rrf_k": 0}])
def test_recorded_retrieval_parameters_no_fusion_takes_are_refused(retrieval):
    """The typed config holds them; RetrievalParams, which every reader makes of
    them (the server at load: its one-line refusal, test_serving_hostile), refuses them."""
    config = {**IndexConfig().to_manifest(DENSE_INFO, {}), "retrieval": {**DEFAULT_RETRIEVAL, **retrieval}}
    with pytest.raises(ValueError, match="must be"):
        RetrievalParams(**ManifestConfig.from_manifest(config).retrieval)


def test_the_typed_config_is_not_written():
    manifest = Manifest(version="v000001", parent=None, created=1.0, segments=[], tombstones={}, stats={},
                        config=IndexConfig().to_manifest(DENSE_INFO, {}))
    written = json.loads(manifest.to_json())
    assert set(written) == {"version", "parent", "created", "segments", "tombstones", "stats", "config",
                            "format_version"}
    assert Manifest.from_json(manifest.to_json()) == manifest
    assert Manifest.from_json(manifest.to_json()).settings == manifest.settings


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
