"""The encoders: texts -> float32 vectors, for documents (the Beam embed step)
and queries (`QueryEmbedder`, the server) alike.

They are in the core, not in transforms/ or serving/, because both sides must
run the same code: a query and a document of the same text get the same
vector only if one path embeds both. `SentenceEncoder` sorts texts by token
length and cuts them into batches bounded by a padded-token budget, so a batch
is padded only to neighbours of similar length; on an out-of-memory error the
budget is halved and the rest replanned. The planning is done by pure functions
(`token_budget_batches`, `embed_with_backoff`) that run without a model.
`HashingEncoder` is the stand-in model "hashing:N" of tests and benchmarks that
do not measure retrieval quality: an index records it like any model, so the
server must be able to embed its queries too.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, NamedTuple, Sequence

import numpy as np

from ritrag.embedder import (HASHING_PREFIX, EmbedderSpec, check_backend_available, check_model_files, choose_device,
                             hashing_dimension, load_sentence_transformer, resolve_dtype, resolve_model_path)
from ritrag.numpy_bert import NumpyBert, numpy_bert_refusal

# Padded tokens (rows x longest row) per forward pass. On one CPU thread, 1024
# to 4096 ran alike and 8192 slower (a batch falls out of cache); on a GPU the
# budget is bounded by memory, and an out-of-memory error halves it.
DEFAULT_MAX_BATCH_TOKENS = {"cuda": 65536, "mps": 16384, "cpu": 2048}


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
        # Python are what this encoder spends its time on. A dict, not a numpy
        # string array: that array is as wide as the longest word for every word
        # (one 5 MB word among 100k asked for 1.8 TiB).
        first: dict[str, int] = {}
        inverse = np.fromiter((first.setdefault(w, len(first)) for ws in words for w in ws), np.int64)
        codes = np.fromiter((zlib.crc32(w.encode()) for w in first), np.int64, len(first))[inverse]
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
        return HashingEncoder(hashing_dimension(spec.model), spec.normalize)
    return SentenceEncoder(spec, device, **options)


def load_query_encoder(spec: EmbedderSpec, device: str | None = None):
    """The encoder that embeds `spec`'s queries: on a CPU, a BERT folder runs in
    numpy (ritrag/numpy_bert.py: no torch import, a cold `ritrag toc` in about a
    second); any other model, or an explicit accelerator, gets `load_encoder`'s.
    Both are the torch backend's arithmetic in float32, to float rounding."""
    if not spec.model.startswith(HASHING_PREFIX) and spec.backend == "torch" and device in (None, "cpu"):
        check_model_files(spec)  # the weights the index's vectors were made with, or none
        folder = numpy_bert_refusal(resolve_model_path(spec.model))
        if not isinstance(folder, str):
            return BertQueryEncoder(NumpyBert(folder, spec.max_seq_length, spec.normalize))
    return load_encoder(spec, device)


class BertQueryEncoder:
    """ritrag/numpy_bert.py's forward pass behind `SentenceEncoder`'s `embed`."""

    dtype = "float32"

    def __init__(self, model: NumpyBert):
        self._model = model

    @property
    def dimension(self) -> int:
        return self._model.dimension

    def embed(self, texts: Sequence[str], prefix: str = "") -> Embedded:
        return Embedded(self._model.encode([prefix + t for t in texts]), 0, self.dtype)


class QueryEmbedder:
    """Embeds search queries for the server: the model loads once, and queries
    take the documents' code path with the spec's query prefix. Build it from
    the manifest's spec (`EmbedderSpec.from_dict`), or pass a configured spec
    through `check_compatible` first."""

    def __init__(self, spec: EmbedderSpec, device: str | None = None):
        self.spec = spec
        self._encoder = load_query_encoder(spec, device)

    @property
    def dimension(self) -> int:
        return self._encoder.dimension

    def embed(self, queries: Sequence[str]) -> np.ndarray:
        """float32 array, one row per query."""
        return self._encoder.embed(queries, self.spec.query_prefix).vectors
