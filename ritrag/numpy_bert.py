"""A BERT sentence encoder in numpy, for queries on a CPU: `ritrag toc` and a
server's first query pay no torch import and no model load through
sentence-transformers (4.3 of the 5.9 s of a cold `ritrag toc` on the sample,
benchmarks/RESULTS.md "A first answer in seconds").

It runs the forward pass of a sentence-transformers folder whose modules are a
BERT `Transformer`, a CLS or mean `Pooling` and optionally `Normalize` (the
bundled all-MiniLM-L6-v2 and most of the small English encoders): the Rust
tokenizer of `tokenizer.json` (the `tokenizers` package), the weights read
from `model.safetensors` as numpy arrays, float32 throughout. A query's vector
equals sentence-transformers' float32 one to float rounding (tests/
test_numpy_bert.py); `numpy_bert_refusal` names what keeps another model on the
torch path (ritrag/encoders.py `load_query_encoder`).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ritrag.embedder import folder_max_seq_length

# erf by Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7, float32's own rounding): numpy has no erf,
# and BERT's "gelu" is the exact one.
_ERF_P = 0.3275911
_ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")
_POOLINGS = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean"}


def _erf(x: np.ndarray) -> np.ndarray:
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + _ERF_P * a)
    poly = t * (_ERF_A[0] + t * (_ERF_A[1] + t * (_ERF_A[2] + t * (_ERF_A[3] + t * _ERF_A[4]))))
    return sign * (1.0 - poly * np.exp(-a * a))


def _activation(name: str, x: np.ndarray) -> np.ndarray:
    if name == "gelu":
        return 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0)))
    if name == "relu":
        return np.maximum(x, 0)
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))  # the tanh forms


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def _read_json(path: str) -> dict | list | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class BertFolder:
    """What the forward pass needs to know of a sentence-transformers folder."""

    path: str
    config: dict
    pooling: str  # cls | mean
    normalize: bool
    max_seq_length: int


def numpy_bert_refusal(path: str) -> str | BertFolder:
    """The folder's `BertFolder`, or why this encoder does not run it (a string)."""
    modules = _read_json(os.path.join(path, "modules.json"))
    if not isinstance(modules, list) or not modules:
        return "no modules.json"
    types = [m.get("type", "").rsplit(".", 1)[-1] for m in modules if isinstance(m, dict)]
    if types[:2] != ["Transformer", "Pooling"] or types[2:] not in ([], ["Normalize"]):
        return f"modules {types} (only Transformer, Pooling[, Normalize])"
    if modules[0].get("path", "") != "":
        return "the Transformer module is not at the folder's root"
    config = _read_json(os.path.join(path, "config.json")) or {}
    if config.get("model_type") != "bert" or config.get("position_embedding_type", "absolute") != "absolute":
        return f"model_type {config.get('model_type')!r} (only BERT with absolute positions)"
    if config.get("hidden_act") not in _ACTIVATIONS:
        return f"activation {config.get('hidden_act')!r}"
    pooling_config = _read_json(os.path.join(path, modules[1].get("path", ""), "config.json")) or {}
    modes = [mode for key, mode in _POOLINGS.items() if pooling_config.get(key)]
    others = [k for k, v in pooling_config.items() if k.startswith("pooling_mode_") and v and k not in _POOLINGS]
    if len(modes) != 1 or others or pooling_config.get("include_prompt", True) is not True:
        return f"pooling {pooling_config} (only one of CLS or mean, prompt included)"
    for name in ("model.safetensors", "tokenizer.json"):
        if not os.path.isfile(os.path.join(path, name)):
            return f"no {name}"
    max_len = folder_max_seq_length(path) or config.get("max_position_embeddings", 512)
    return BertFolder(path, config, modes[0], types[2:] == ["Normalize"], int(max_len))


class NumpyBert:
    """The forward pass of one BERT folder in numpy (module docstring)."""

    def __init__(self, folder: BertFolder, max_seq_length: int | None = None, normalize: bool = True):
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        self._config = folder.config
        self._pooling = folder.pooling
        # sentence-transformers normalizes in its Normalize module; the spec asks for it too.
        self._normalize = folder.normalize or normalize
        weights = load_file(os.path.join(folder.path, "model.safetensors"))
        prefix = "bert." if "bert.embeddings.word_embeddings.weight" in weights else ""
        self._w = {k[len(prefix):]: v.astype(np.float32, copy=False) for k, v in weights.items()
                   if k.startswith(prefix) and v.dtype.kind == "f"}
        self._layers = [self._layer(f"encoder.layer.{i}.") for i in range(int(self._config["num_hidden_layers"]))]
        length = min(folder.max_seq_length, max_seq_length or folder.max_seq_length,
                     self._config.get("max_position_embeddings", 512))
        self._tokenizer = Tokenizer.from_file(os.path.join(folder.path, "tokenizer.json"))
        self._tokenizer.no_padding()  # one text at a time: nothing to pad (the file may ask for a fixed width)
        self._tokenizer.enable_truncation(length)
        self.dimension = int(self._config["hidden_size"])

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """float32 vectors, one row per text."""
        if not texts:
            return np.empty((0, self.dimension), np.float32)
        return np.stack([self._one(t) for t in texts]).astype(np.float32)

    def _layer(self, p: str) -> dict[str, np.ndarray]:
        """One encoder layer's weights as `_one` multiplies them: each linear
        map's matrix transposed into a C-contiguous (in, out) array (2x
        faster for OpenBLAS on a query's few rows than multiplying by `.T`),
        the query, key and value maps side by side as one (in, 3 x out)."""
        w = self._w
        linear = lambda name: np.ascontiguousarray(w.pop(p + name + ".weight").T)  # noqa: E731
        qkv = ("attention.self.query", "attention.self.key", "attention.self.value")
        return {
            "qkv": np.concatenate([linear(n) for n in qkv], axis=1),
            "qkv_bias": np.concatenate([w.pop(p + n + ".bias") for n in qkv]),
            "attention_out": linear("attention.output.dense"),
            "attention_out_bias": w[p + "attention.output.dense.bias"],
            "intermediate": linear("intermediate.dense"), "intermediate_bias": w[p + "intermediate.dense.bias"],
            "out": linear("output.dense"), "out_bias": w[p + "output.dense.bias"],
            "norm1": w[p + "attention.output.LayerNorm.weight"], "norm1_bias": w[p + "attention.output.LayerNorm.bias"],
            "norm2": w[p + "output.LayerNorm.weight"], "norm2_bias": w[p + "output.LayerNorm.bias"],
        }

    def _one(self, text: str) -> np.ndarray:
        c, w = self._config, self._w
        ids = np.asarray(self._tokenizer.encode(text).ids, dtype=np.int64)
        eps = float(c.get("layer_norm_eps", 1e-12))
        x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:len(ids)]
             + w["embeddings.token_type_embeddings.weight"][0])
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
        heads = int(c["num_attention_heads"])
        size = self.dimension // heads
        for layer in self._layers:
            qkv = (x @ layer["qkv"] + layer["qkv_bias"]).reshape(len(ids), 3, heads, size)
            q, k, v = (qkv[:, j].transpose(1, 0, 2) for j in range(3))
            scores = q @ k.transpose(0, 2, 1) / np.sqrt(size)
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            context = (scores / scores.sum(-1, keepdims=True)) @ v
            attended = context.transpose(1, 0, 2).reshape(len(ids), -1) @ layer["attention_out"]
            x = _layer_norm(attended + layer["attention_out_bias"] + x, layer["norm1"], layer["norm1_bias"], eps)
            inner = _activation(c["hidden_act"], x @ layer["intermediate"] + layer["intermediate_bias"])
            x = _layer_norm(inner @ layer["out"] + layer["out_bias"] + x, layer["norm2"], layer["norm2_bias"], eps)
        vector = x[0] if self._pooling == "cls" else x.mean(0)
        if self._normalize:
            vector = vector / max(float(np.linalg.norm(vector)), 1e-12)
        return vector
