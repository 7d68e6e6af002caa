import glob
import os

import pytest

from ritrag.embedder import EmbedderSpec, load_tokenizer, model_token_limit
from ritrag.ids import chunk_id_for
from transforms.chunk import chunk_rows, chunk_text, counted_chunks, counts_add_up, tokenizer_counter
from transforms.parse import parse_page

SAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sample", "pages")


def words(texts):
    return [len(t.split()) for t in texts]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(EmbedderSpec())


def test_limit_is_the_models_sequence_length_minus_special_tokens(tokenizer):
    # all-MiniLM-L6-v2 truncates at 256 word pieces, below the 512 of METHOD.md
    assert model_token_limit(EmbedderSpec(), tokenizer) == 254
    assert model_token_limit(EmbedderSpec(max_seq_length=128), tokenizer) == 126


def test_short_node_is_one_chunk_with_its_title():
    assert chunk_text("Install", "Run pip.\n\nThen import it.", words, 50) == [
        "Install\nRun pip.\nThen import it."]


def test_title_only_node_still_gets_a_chunk():
    assert chunk_text("Glossary", "   ", words, 50) == ["Glossary"]
    assert chunk_text("", "", words, 50) == []


def test_paragraphs_are_packed_whole_and_never_exceed_the_limit():
    paragraphs = [" ".join(f"p{i}w{j}" for j in range(30)) for i in range(10)]
    chunks = chunk_text("T", "\n\n".join(paragraphs), words, 100)
    assert all(len(c.split()) <= 100 for c in chunks)
    assert len(chunks) == 4  # 3 paragraphs of 30 words + the title fit in 100
    assert chunks[0] == "T\n" + "\n".join(paragraphs[:3])


def test_long_paragraph_splits_at_sentences_then_words():
    sentence = " ".join(["word"] * 20) + "."
    giant = " ".join(["x"] * 500)
    chunks = chunk_text("T", " ".join([sentence] * 10) + "\n\n" + giant, words, 50)
    assert all(len(c.split()) <= 50 for c in chunks)
    assert sum(c.count("x") for c in chunks) == 500  # no text lost
    assert chunks[0].endswith(".")


def test_real_tokenizer_limit_holds_on_code_and_unbroken_runs(tokenizer):
    count = tokenizer_counter(tokenizer)
    body = ("def f(x):\n    return x ** 2  # square\n" * 200) + "\n\n" + "a" * 5000
    chunks = chunk_text("Module reference", body, count, 254)
    assert len(chunks) > 3
    assert max(count(chunks)) <= 254


def test_additive_counting_stores_the_tokenizers_own_counts(tokenizer):
    assert counts_add_up(tokenizer)  # BERT WordPiece splits at whitespace
    count = tokenizer_counter(tokenizer)
    pages = sorted(glob.glob(os.path.join(SAMPLE, "**", "*.html"), recursive=True))[::6]
    bodies = [parse_page(open(p, "rb").read(), "http://x/" + os.path.basename(p), "x") for p in pages]
    bodies += [parse_page(("<title>Ünïcode 中文</title><p>" + "Straße café naïve 東京都 " * 300 + "</p><p>" + "b" * 3000
                           + "</p>").encode(), "http://x/u", "x")]
    for page in bodies:
        verified = counted_chunks(page.title, page.body, count, 254)
        summed = counted_chunks(page.title, page.body, count, 254, additive=True)
        assert summed == verified
        assert [n for _, n in summed] == count([t for t, _ in summed])


def test_byte_level_tokenizers_are_not_trusted_to_add_up():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel()
    assert not counts_add_up(PreTrainedTokenizerFast(tokenizer_object=backend))


def test_chunk_ids_are_deterministic_and_text_sensitive():
    rows = chunk_rows("node1", "page1", "T", "one.\n\ntwo.", words, 100)
    assert rows == chunk_rows("node1", "page1", "T", "one.\n\ntwo.", words, 100)
    assert rows[0]["chunk_id"] == chunk_id_for("node1", 0, rows[0]["text"])
    assert 0 <= rows[0]["chunk_id"] < 2 ** 63
    assert chunk_rows("node1", "page1", "T", "one!\n\ntwo.", words, 100)[0]["chunk_id"] != rows[0]["chunk_id"]
    assert {r["node_id"] for r in rows} == {"node1"}
