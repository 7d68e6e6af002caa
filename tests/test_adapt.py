"""`ritrag adapt`: training pairs drawn from an index's forest, a deterministic
fine-tune of the bundled model, the adapted model through build and serve, the
refusal of an index whose model folder is missing or changed, and `ritrag eval
--compare`."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ritrag import cli
from ritrag.adaptation import AdaptConfig, adapt
from ritrag.adaptation.pairs import TrainingPair, sample_pairs
from ritrag.adaptation.train import pack_batches, training_batches
from ritrag.embedder import ADAPTATION_RECORD, folder_max_seq_length, model_checksum, resolve_model_path
from ritrag.layout import DamagedIndexError, IndexLayout, MissingIndexError
from ritrag.reader import IndexReader
from ritrag.serving.api import RitragIndex
from support import BASE, build_index, tiny_page, write_tiny_site

BUNDLED = "bundled:all-MiniLM-L6-v2"
TINY_ADAPT = ["--steps", "6", "--batch_size", "8", "--seed", "3", "--base_model", BUNDLED, "--device", "cpu"]
# A page of the tiny site's Version 3 that links its siblings: anchor pairs.
FAQ = ("FAQ", [("Shop Server", "shop/"), ("Version 3", "shop/v3/")],
       [("Links", f'See <a href="{BASE}/shop/v3/logging.html">log rotation settings</a>, '
                  f'<a href="{BASE}/shop/v3/guide/deploy.html">running replicas</a> and '
                  f'<a href="{BASE}/shop/v3/config.html">here</a>.')])


@pytest.fixture(scope="module")
def linked_site(tmp_path_factory) -> Path:
    site = write_tiny_site(tmp_path_factory.mktemp("linked_site"))
    (site / "shop/v3/faq.html").write_text(tiny_page(*FAQ), encoding="utf-8")
    return site


@pytest.fixture(scope="module")
def hash_index(linked_site, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("adapt_hash_index")
    build_index(linked_site, out, "--embedding_model", "hashing:384")
    return out


@pytest.fixture(scope="module")
def adapted_model(hash_index, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("adapted") / "model"
    config = AdaptConfig(steps=6, batch_size=8, seed=3, base_model=BUNDLED, device="cpu")
    adapt(str(hash_index), str(out), config, progress=lambda line: None)
    return out


@pytest.fixture(scope="module")
def adapted_index(linked_site, adapted_model, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("adapted_index")
    build_index(linked_site, out, "--embedding_model", str(adapted_model))
    return out


def _manifest_embedder(index: Path) -> dict:
    return IndexLayout(str(index)).load_manifest().config["embedder"]


def test_pairs_are_drawn_from_the_forest(hash_index):
    reader = IndexReader(str(hash_index))
    sample = sample_pairs(reader, 100, seed=0)
    by_anchor = {p.anchor: p for p in sample.pairs}
    logging = by_anchor["Shop Server > Version 3 > Logging"]  # path -> a chunk's body, its title line left out
    assert logging.kind == "path" and logging.positive.startswith("Logs rotate daily")
    assert "Logging" not in logging.positive
    linked = by_anchor["log rotation settings"]  # link text -> the target's first chunk
    assert linked.kind == "anchor" and linked.positive == logging.positive
    assert by_anchor["running replicas"].positive.startswith("Run the shop image")
    assert "here" not in by_anchor  # a link text that names nothing
    # A look-alike as hard negative: a sibling under Version 3, or a same-titled node of another site.
    v3_bodies = {p.positive for p in sample.pairs if p.anchor.startswith("Shop Server > Version 3 > ")}
    config3 = by_anchor["Shop Server > Version 3 > Configuring the server"]
    assert config3.negative in v3_bodies - {config3.positive}
    assert sample.counts["anchor_pairs"] == 2 and sample.counts["hard_negatives"] >= 4
    assert sample_pairs(reader, 100, seed=0) == sample  # the same seed, the same pairs in the same order
    other = sample_pairs(reader, 100, seed=1)
    assert {(p.anchor, p.positive) for p in other.pairs} == {(p.anchor, p.positive) for p in sample.pairs}
    assert [p.anchor for p in other.pairs] != [p.anchor for p in sample.pairs]
    assert len(sample_pairs(reader, 3, seed=0).pairs) == 3  # bounded by the limit
    assert all(p.negative is None for p in sample_pairs(reader, 100, 0, hard_negatives=False).pairs)


def test_batches_never_score_a_text_as_its_own_negative():
    pairs = [TrainingPair("path", f"a{i}", "same" if i < 3 else f"p{i}", None, i) for i in range(6)]
    batches = pack_batches(pairs, 4)
    assert [[p.anchor for p in b] for b in batches] == [["a0", "a3", "a4", "a5"], ["a1"], ["a2"]]
    mixed = pairs[3:] + [TrainingPair("anchor", f"b{i}", f"q{i}", f"n{i}", i) for i in range(4)]
    seen = [b for _, b in zip(range(8), training_batches(mixed, 4, seed=0))]
    assert all(len({p.negative is None for p in b}) == 1 and len(b) >= 2 for b in seen)  # one shape per batch
    assert seen == [b for _, b in zip(range(8), training_batches(mixed, 4, seed=0))]


def test_adaptation_is_deterministic_and_recorded(hash_index, adapted_model, tmp_path, capsys):
    again = tmp_path / "again"
    assert cli.main(["adapt", str(hash_index), "--out", str(again), *TINY_ADAPT]) == 0
    record = json.loads(capsys.readouterr().out)
    assert (again / "model.safetensors").read_bytes() == (adapted_model / "model.safetensors").read_bytes()
    first = json.loads((adapted_model / ADAPTATION_RECORD).read_text())
    assert record["model_sha256"] == first["model_sha256"] == model_checksum(str(again))
    assert record["model_sha256"] != model_checksum(resolve_model_path(BUNDLED))  # the weights moved
    assert record["base_model_sha256"] == model_checksum(resolve_model_path(BUNDLED))
    assert record["steps_done"] == 6 and record["stopped_by"] == "steps" and record["losses"][-1]["step"] == 6
    assert record["config"]["seed"] == 3 and record["index_version"] == IndexReader(str(hash_index)).version
    assert record["pairs"]["pairs"] == record["pairs"]["path_pairs"] + record["pairs"]["anchor_pairs"] > 0


def test_adapt_refuses_what_it_cannot_start_from(hash_index, tmp_path, capsys):
    assert cli.main(["adapt", str(hash_index), "--out", str(tmp_path / "m")]) == 2  # hashing: no weights
    assert "--base_model bundled:all-MiniLM-L6-v2" in json.loads(capsys.readouterr().err)["error"]["message"]
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    assert cli.main(["adapt", str(hash_index), "--out", str(tmp_path / "full"), *TINY_ADAPT]) == 2
    assert "not an empty folder" in json.loads(capsys.readouterr().err)["error"]["message"]
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"
    assert cli.main(["adapt", str(hash_index), "--out", str(tmp_path / "m"), "--base_model", "org/hub-model"]) == 2
    assert "nothing downloads" in json.loads(capsys.readouterr().err)["error"]["message"]
    assert cli.main(["adapt", str(hash_index), "--out", str(tmp_path / "m"), "--batch_size", "1"]) == 2
    assert not (tmp_path / "m").exists()


def test_an_adapted_model_round_trips_through_build_and_serve(hash_index, adapted_index, adapted_model, capsys):
    # sentence-transformers 6 saves the length limit with the tokenizer: the adapted folder reads as 256
    # tokens like the bundled one, so the index is chunked exactly like one of the bundled model's.
    assert folder_max_seq_length(str(adapted_model)) == folder_max_seq_length(resolve_model_path(BUNDLED)) == 256
    assert _chunk_ids(adapted_index) == _chunk_ids(hash_index)
    embedder = _manifest_embedder(adapted_index)
    record = json.loads((adapted_model / ADAPTATION_RECORD).read_text())
    assert embedder["model"] == str(adapted_model.resolve()) and embedder["model_sha256"] == record["model_sha256"]
    assert embedder["dimension"] == 384
    index = RitragIndex(str(adapted_index))
    toc = index.get_toc("How often do logs rotate?", k=20, n=5)
    assert any(entry["title"] == "Logging" for entry in _entries(toc["trees"]))
    assert cli.main(["toc", str(adapted_index), "How often do logs rotate?"]) == 0  # the command's face too
    assert json.loads(capsys.readouterr().out)["version"] == index.version


def _chunk_ids(index: Path) -> set[int]:
    return set(IndexReader(str(index)).table("chunks", ["chunk_id"])["chunk_id"].to_pylist())


def _entries(trees: list[dict]) -> list[dict]:
    return [e for t in trees for e in (t, *_entries(t.get("children", [])))]


def test_a_missing_or_changed_model_folder_is_refused_at_load(adapted_index, adapted_model, tmp_path, capsys):
    model, index = tmp_path / "model", tmp_path / "index"
    shutil.copytree(adapted_model, model)
    shutil.copytree(adapted_index, index)
    layout = IndexLayout(str(index))
    path = Path(layout.manifest_path(layout.current_version()))
    manifest = json.loads(path.read_text())
    manifest["config"]["embedder"]["model"] = str(model)  # the index's copy names the model's copy
    path.write_text(json.dumps(manifest))
    RitragIndex(str(index))  # loads: the same files

    weights = model / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(DamagedIndexError, match="changed since the index's vectors were made"):
        RitragIndex(str(index))
    assert cli.main(["toc", str(index), "logs"]) == 1
    error = json.loads(capsys.readouterr().err)["error"]
    assert error["reason"] == "index_unavailable" and str(model) in error["message"]

    shutil.rmtree(model)
    with pytest.raises(MissingIndexError, match="which is missing"):
        RitragIndex(str(index))


def test_eval_compares_two_indexes_in_one_run(hash_index, adapted_index, tmp_path, capsys):
    questions = tmp_path / "q.jsonl"
    questions.write_text("\n".join(json.dumps(q) for q in [
        {"id": "rotate", "question": "How often do logs rotate?", "gold": ["shop/v3/logging.html"],
         "evidence": ["Logs rotate daily"]},
        {"id": "ports3", "question": "Which port does version 3 listen on?", "gold": ["shop/v3/config.html"]},
    ]), encoding="utf-8")
    assert cli.main(["eval", str(hash_index), str(questions), "--compare", str(adapted_index),
                     "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "(hashing:384) vs other" in out and "change" in out
    comparison = json.loads((tmp_path / "out" / "eval.json").read_text())["comparison"]
    assert comparison["base"]["embedder"] == "hashing:384"
    assert comparison["other"]["embedder"] == str(Path(_manifest_embedder(adapted_index)["model"]))
    dense = comparison["overall"]["dense"]["mrr"]
    assert dense["change"] == pytest.approx(dense["other"] - dense["base"])
    assert comparison["overall"]["scored"] == [2, 2]


def test_a_manifest_checksum_is_64_hex_digits():
    from ritrag.embedder import EmbedderSpec

    assert EmbedderSpec(model_sha256="ab" * 32).model_sha256 == "ab" * 32
    for bad in (12, "abc", "AB" * 32, "../" * 30):
        with pytest.raises(ValueError, match="model_sha256 must be 64 hex digits"):
            EmbedderSpec(model_sha256=bad)
