import glob
import os

import pytest

from ritrag.embedder import EmbedderSpec, load_tokenizer, model_token_limit
from ritrag.ids import chunk_id_for, content_hash
from ritrag.representation import ANCHOR_DOC_ORDINAL, LEGACY, NODE_DOC_ORDINAL, Representation
from ritrag.transforms.chunk import (chunk_rows, chunk_text, counted_chunks, counts_add_up, node_chunk_rows,
                              tokenizer_counter, word_counter)
from ritrag.transforms.parse import parse_page
from support import node_row

SAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sample", "pages")


def words(texts):
    return [len(t.split()) for t in texts]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(EmbedderSpec())


def test_limit_is_the_models_sequence_length_minus_special_tokens(tokenizer):
    # all-MiniLM-L6-v2 truncates at 256 word pieces, below the 512 of docs/METHOD.md
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


def test_word_counts_are_the_tokenizers_counts(tokenizer):
    # Summing cached word counts must give exactly the counts of whole texts: the
    # sample's paragraphs and titles, Unicode, and every character Python splits at
    # (some of which BERT deletes, joining the words around them).
    count = tokenizer_counter(tokenizer)
    by_words = word_counter(count)
    pages = sorted(glob.glob(os.path.join(SAMPLE, "**", "*.html"), recursive=True))[::4]
    texts = []
    for path in pages:
        page = parse_page(open(path, "rb").read(), "http://x/" + os.path.basename(path), "x")
        texts += [page.title + "\n" + page.description, *page.body.split("\n\n")]
    spaces = [chr(c) for c in range(0x110000) if chr(c).isspace()]
    texts += [f"aa{s}aa un{s}able Straße{s}東京都" for s in spaces] + ["", " ", "\x1c", "a" * 300]
    assert by_words(texts) == count(texts)
    assert by_words(texts) == count(texts)  # again, from the cache


def test_byte_level_tokenizers_are_not_trusted_to_add_up():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel()
    assert not counts_add_up(PreTrainedTokenizerFast(tokenizer_object=backend))


def test_chunk_ids_are_deterministic_and_text_sensitive():
    rows = chunk_rows("node1", "page1", "T", "one.\n\ntwo.", words, 100)
    assert rows == chunk_rows("node1", "page1", "T", "one.\n\ntwo.", words, 100)
    assert rows[0].chunk_id == chunk_id_for("node1", 0, rows[0].text)
    assert 0 <= rows[0].chunk_id < 2 ** 63
    assert chunk_rows("node1", "page1", "T", "one!\n\ntwo.", words, 100)[0].chunk_id != rows[0].chunk_id
    assert {r.node_id for r in rows} == {"node1"}


# --- the representation (ritrag/representation.py) -------------------------------------------------------------

NODE = node_row(node_id="n1", page_id="n1", title="Configuring SSL", body="Set the key.\n\nSet the cert.",
                ancestor_titles=["Alpha Server", "Admin Guide", "Security"], summary="TLS setup", keywords=["tls"])


def test_path_keeps_the_root_and_the_last_levels():
    deep = ["Root", "A", "B", "C", "D"]
    assert Representation(path_levels=4).path("T", deep) == "Root > C > D > T"
    assert Representation(path_levels=2).path("T", deep) == "Root > T"
    assert Representation(path_levels=1).path("T", deep) == "T"
    assert Representation(path_levels=9).path("T", ["Root", "", "A"]) == "Root > A > T"


def test_template_must_hold_the_body_and_known_fields_only():
    with pytest.raises(ValueError, match="body"):
        Representation(template="{path}")
    with pytest.raises(ValueError, match="unknown"):
        Representation(template="{site}\n{body}")


def test_embedded_text_states_the_path_once_and_the_stored_text_stays_the_page_text():
    rows = node_chunk_rows(NODE, Representation(), words, 100)
    doc, chunk = rows
    assert doc.ordinal == NODE_DOC_ORDINAL
    assert doc.text == "Alpha Server > Admin Guide > Security > Configuring SSL\nTLS setup\ntls"
    assert chunk.text == "Configuring SSL\nSet the key.\nSet the cert."
    path = "Alpha Server > Admin Guide > Security > Configuring SSL"
    assert chunk.embedded_text == f"{path}\nSet the key.\nSet the cert."
    assert chunk.embedded_text.count("Configuring SSL") == 1
    assert chunk.text_hash == content_hash(chunk.embedded_text)
    # BM25 indexes the body of a chunk (the path lives in the node document) and the document whole.
    assert Representation().bm25_text(chunk.text, chunk.ordinal) == "Set the key.\nSet the cert."
    assert Representation().bm25_text(doc.text, doc.ordinal) == doc.text


def test_a_chunk_under_another_path_is_another_chunk():
    moved = NODE._replace(ancestor_titles=["Beta Server", "Admin Guide", "Security"])
    here = node_chunk_rows(NODE, Representation(), words, 100)
    there = node_chunk_rows(moved, Representation(), words, 100)
    assert here[1].text == there[1].text and here[1].chunk_id != there[1].chunk_id
    assert Representation().node_inputs(NODE) != Representation().node_inputs(moved)
    assert LEGACY.node_inputs(NODE) == LEGACY.node_inputs(moved)  # the legacy form ignores the path


def test_legacy_representation_is_what_builds_did_before_templates():
    rows = node_chunk_rows(NODE, LEGACY, words, 100)
    assert [r.text for r in rows] == chunk_text("Configuring SSL", NODE.body, words, 100)
    assert all(r.embedded_text == r.text and r.ordinal >= 0 for r in rows)
    assert LEGACY.bm25_text(rows[0].text, rows[0].ordinal) == rows[0].text
    assert Representation.from_config({}) == LEGACY


def test_node_documents_are_embedded_only_with_node_doc_vectors():
    assert [Representation().embeds(o) for o in (0, 3, NODE_DOC_ORDINAL, ANCHOR_DOC_ORDINAL)] == [
        True, True, False, False]
    with_vectors = Representation(node_doc_vectors=True)
    assert [with_vectors.embeds(o) for o in (0, NODE_DOC_ORDINAL, ANCHOR_DOC_ORDINAL)] == [True, True, False]
    assert with_vectors.dense_node_docs and not Representation().dense_node_docs
    assert not Representation(node_docs=False, node_doc_vectors=True).dense_node_docs
    # An index recorded before the choice embedded its node documents: it reads so.
    recorded = {k: v for k, v in Representation().to_dict().items() if k != "node_doc_vectors"}
    assert Representation.from_config({"representation": recorded}) == with_vectors


def test_the_path_tokens_are_reserved_so_embedded_texts_fit_the_limit(tokenizer):
    count, limit = tokenizer_counter(tokenizer), 60
    node = NODE._replace(ancestor_titles=["A very long site name " * 3, "Section " * 4],
                         body="\n\n".join(f"Paragraph {i} says something about certificates and keys."
                                            for i in range(30)))
    for additive in (False, True):
        rows = node_chunk_rows(node, Representation(), count, limit, additive)
        assert len(rows) > 3
        for row in rows:
            assert row.n_tokens == count([row.embedded_text])[0] <= limit
            assert row.ordinal == NODE_DOC_ORDINAL or row.text.startswith("Configuring SSL\n")
