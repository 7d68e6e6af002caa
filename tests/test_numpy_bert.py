"""The numpy BERT query encoder (ritrag/numpy_bert.py) against
sentence-transformers in float32 on the bundled model, and what it spares a
cold `ritrag toc`: no torch import."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from ritrag.embedder import DEFAULT_MODEL, EmbedderSpec, resolve_model_path
from ritrag.encoders import BertQueryEncoder, SentenceEncoder, load_query_encoder
from ritrag.numpy_bert import numpy_bert_refusal

TEXTS = ["How do I configure SSL client certificates?", "reclaim disk space from deleted rows", "a",
         "Ünïcödé, ponctuation — et “guillemets” ; 数据库 🙂", "word " * 400]  # the last one past 256 tokens


def test_query_vectors_equal_sentence_transformers_float32():
    spec = EmbedderSpec()
    reference = SentenceEncoder(spec, "cpu", dtype="float32").embed(TEXTS, "query: ").vectors
    encoder = load_query_encoder(spec)
    assert isinstance(encoder, BertQueryEncoder)
    ours = encoder.embed(TEXTS, "query: ").vectors
    assert ours.shape == reference.shape and ours.dtype == np.float32
    assert np.abs(ours - reference).max() < 1e-5
    assert (np.sum(ours * reference, axis=1) > 0.99999).all()


def test_a_folder_it_cannot_run_goes_to_torch(tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(resolve_model_path(DEFAULT_MODEL), folder)
    assert not isinstance(numpy_bert_refusal(str(folder)), str)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "roberta"}))
    assert "roberta" in numpy_bert_refusal(str(folder))
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 384, "pooling_mode_max_tokens": True}))
    assert "pooling" in numpy_bert_refusal(str(folder))
    assert isinstance(load_query_encoder(EmbedderSpec(model=str(folder))), SentenceEncoder)
    (folder / "modules.json").write_text("[")
    assert numpy_bert_refusal(str(folder)) == "no modules.json"


@pytest.mark.slow
def test_a_cold_toc_imports_no_torch(sample_index, tmp_path):
    program = ("import sys, json\nfrom ritrag.serving.api import RitragIndex\n"
               f"toc = RitragIndex({str(sample_index)!r}).get_toc('configure SSL client certificates')\n"
               "print(json.dumps({'torch': 'torch' in sys.modules, 'beam': 'apache_beam' in sys.modules, "
               "'hits': toc['hits']}))")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["torch"] is False and seen["beam"] is False and seen["hits"] > 0
