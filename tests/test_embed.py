"""The embed step: token-budget batching, length sorting that keeps every id
with its own vector, out-of-memory back-off, device choice, and EmbedChunks in
a real (in-process) Beam pipeline. CPU only, with the bundled model."""
from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from apache_beam import Create
from apache_beam.pipeline import PipelineVisitor
from apache_beam.metrics import MetricsFilter
from apache_beam.ml.inference.base import KeyedModelHandler
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import BeamAssertException, assert_that
from apache_beam.transforms.resources import AcceleratorHint, MinRamHint

from ritrag import embedder, encoders
from ritrag.embedder import (DTYPES, EmbedderSpec, IncompatibleEmbedderError, check_backend_available,
                             check_compatible, choose_device, cpu_has_amx_bf16, resolve_dtype)
from ritrag.encoders import QueryEmbedder, SentenceEncoder, embed_with_backoff, encode, token_budget_batches
from ritrag.transforms.embed import DTYPE_COUNTER_PREFIX, METRICS_NAMESPACE, EmbedChunks, SentenceTransformerModelHandler

SPEC = EmbedderSpec()
TEXTS = [
    "Configure the server port.",
    "Version 3 listens on port 9443 with QUIC enabled, and reads its TLS certificates "
    "from the vault service at start-up; rotate them with the admin CLI.",
    "Logs rotate daily.",
    "Set the log level with SHOP_LOG=debug; the default is info, and warnings also go to syslog "
    "when the service runs under systemd.",
    "Widgets.",
    "Release two of the shop server reads certificates from /etc/shop/tls and listens on 8080.",
    "QUIC",
]
COSINE_TOLERANCE = 1e-5  # same arithmetic (float32), another batching
# float16/bfloat16 vs float32, per text. On 1,000 real corpus chunks bfloat16
# stayed above cosine 0.9999 (benchmarks/RESULTS.md); ten times that margin.
LOW_PRECISION_COSINE_TOLERANCE = 1e-3


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module")
def encoder() -> SentenceEncoder:
    # A budget this small splits TEXTS into several batches of mixed sizes.
    # float32: these tests compare batchings with plain encode, bit for bit nearly.
    return SentenceEncoder(SPEC, "cpu", "float32", max_batch_tokens=64)


@pytest.fixture(autouse=True)
def restore_torch_threads():
    # The embed handler narrows torch to one thread per batch, process-wide.
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_token_budget_batches_sort_longest_first_within_the_budget():
    lengths = [5, 100, 7, 100, 50, 3, 49, 6]
    batches = token_budget_batches(lengths, 200)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    flat = [lengths[i] for b in batches for i in b]
    assert flat == sorted(lengths, reverse=True)
    for batch in batches:
        assert len(batch) * max(lengths[i] for i in batch) <= 200
    assert [[lengths[i] for i in b] for b in batches] == [[100, 100], [50, 49, 7, 6], [5, 3]]


def test_a_row_over_the_budget_gets_a_batch_of_its_own():
    assert token_budget_batches([300, 10, 20], 100) == [[0], [2, 1]]
    assert token_budget_batches([], 100) == []


@pytest.mark.parametrize("map_batches", [map, ThreadPoolExecutor(3).map], ids=["serial", "threads"])
def test_every_vector_goes_back_to_its_own_index(map_batches):
    lengths = [random.Random(1).randint(1, 300) for _ in range(200)]
    result = embed_with_backoff(lengths, 1000, lambda batch: np.array([[i, lengths[i]] for i in batch], np.float32),
                                map_batches=map_batches)
    assert result.vectors.tolist() == [[i, n] for i, n in enumerate(lengths)]
    assert result.oom_backoffs == 0 and result.max_batch_tokens == 1000


def fake_cuda_model(lengths: list[int], fits: int, calls: list[list[int]]):
    """A model that runs out of CUDA memory on batches over `fits` padded tokens."""
    def run_batch(batch: list[int]) -> np.ndarray:
        calls.append(batch)
        if len(batch) * max(lengths[i] for i in batch) > fits:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return np.array([[i] for i in batch], np.float32)
    return run_batch


def test_out_of_memory_halves_the_budget_and_replans_the_rest():
    lengths = [random.Random(2).randint(1, 50) for _ in range(100)]
    calls: list[list[int]] = []
    released = []
    result = embed_with_backoff(lengths, 1000, fake_cuda_model(lengths, 130, calls),
                                on_oom=lambda: released.append(True))
    assert result.vectors[:, 0].tolist() == list(range(100))
    assert result.oom_backoffs >= 1 and len(released) == result.oom_backoffs
    assert result.max_batch_tokens <= 130
    failures = [b for b in calls if len(b) * max(lengths[i] for i in b) > 130]
    assert len(failures) == result.oom_backoffs  # a halved budget is kept, never hit again


def test_a_single_row_that_does_not_fit_reraises():
    with pytest.raises(torch.cuda.OutOfMemoryError):
        embed_with_backoff([80, 10], 1000, fake_cuda_model([80, 10], 50, []))


def test_other_errors_are_not_retried():
    calls = []

    def broken(batch):
        calls.append(batch)
        raise ValueError("not a memory problem")
    with pytest.raises(ValueError):
        embed_with_backoff([10, 20, 30], 1000, broken)
    assert len(calls) == 1


def test_encoder_keeps_the_halved_budget(encoder, monkeypatch):
    real_forward = encoder._forward

    def small_device(texts, prefix):
        if len(texts) > 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return real_forward(texts, prefix)
    monkeypatch.setattr(encoder, "_forward", small_device)
    monkeypatch.setattr(encoder, "max_batch_tokens", 10_000)
    embedded = encoder.embed(TEXTS)
    assert embedded.oom_backoffs >= 1
    assert encoder.max_batch_tokens < 10_000
    assert encoder.embed(TEXTS).oom_backoffs == 0  # the next call starts from the halved budget
    assert np.all(cosines(embedded.vectors, encode(encoder.model, TEXTS, "", True)) > 1 - COSINE_TOLERANCE)


@pytest.mark.parametrize("prefix", ["", "passage: "])
def test_vectors_equal_plain_sentence_transformers_encode(encoder, prefix):
    embedded = encoder.embed(TEXTS, prefix)
    plain = encode(encoder.model, TEXTS, prefix, normalize=True)
    assert embedded.vectors.dtype == np.float32 and embedded.vectors.shape == plain.shape
    assert np.all(cosines(embedded.vectors, plain) > 1 - COSINE_TOLERANCE)
    assert np.allclose(np.linalg.norm(embedded.vectors, axis=1), 1, atol=1e-5)


def test_cpu_parallelism_gives_the_same_vectors(encoder):
    parallel = SentenceEncoder(SPEC, "cpu", "float32", max_batch_tokens=64, cpu_parallelism=2)
    assert torch.get_num_threads() == 1 and parallel.parallelism == 2
    assert np.all(cosines(parallel.embed(TEXTS).vectors, encoder.embed(TEXTS).vectors) > 1 - COSINE_TOLERANCE)


def test_query_embedder_uses_the_query_prefix(encoder):
    spec = EmbedderSpec(query_prefix="query: ", document_prefix="passage: ")
    queries = QueryEmbedder(spec, "cpu").embed(TEXTS[:3])  # the CPU's auto dtype
    assert np.all(cosines(queries, encode(encoder.model, TEXTS[:3], "query: ", True))
                  > 1 - LOW_PRECISION_COSINE_TOLERANCE)
    assert QueryEmbedder(spec, "cpu").embed([]).shape == (0, 384)


def test_check_compatible_refuses_another_embedder():
    check_compatible(SPEC.to_dict(), EmbedderSpec())
    with pytest.raises(IncompatibleEmbedderError, match="model.*query_prefix"):
        check_compatible(SPEC, EmbedderSpec(model="/models/gte-modernbert-base", query_prefix="q: "))
    with pytest.raises(IncompatibleEmbedderError, match="normalize"):
        check_compatible({**SPEC.to_dict(), "dimension": 384}, EmbedderSpec(normalize=False))


def fake_gpus(monkeypatch, count: int, used: list[int] | None = None, mps: bool = False) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
    if used is not None:
        monkeypatch.setattr(torch.cuda, "device_memory_used", lambda i: used[i])


def test_device_is_cuda_then_mps_then_cpu_unless_asked(monkeypatch):
    fake_gpus(monkeypatch, 1, mps=True)
    assert choose_device() == "cuda" and choose_device("cpu") == "cpu"
    fake_gpus(monkeypatch, 0, mps=True)
    assert choose_device() == "mps"
    fake_gpus(monkeypatch, 0)
    assert choose_device() == "cpu"


def test_model_copies_go_to_the_least_used_gpu(monkeypatch):
    fake_gpus(monkeypatch, 3, used=[5_000, 1_000, 3_000])
    assert encoders._least_used_gpu() == "cuda:1"
    fake_gpus(monkeypatch, 1, used=[5_000])
    assert encoders._least_used_gpu() == "cuda"


def test_one_shared_model_copy_per_gpu(monkeypatch):
    fake_gpus(monkeypatch, 2)
    auto = KeyedModelHandler(SentenceTransformerModelHandler(SPEC))
    assert auto.share_model_across_processes() and auto.model_copies() == 2
    pinned = SentenceTransformerModelHandler(SPEC, "cuda:1")
    assert pinned.share_model_across_processes() and pinned.model_copies() == 1
    cpu = SentenceTransformerModelHandler(SPEC, "cpu")
    assert not cpu.share_model_across_processes() and cpu.model_copies() == 1
    assert not SentenceTransformerModelHandler(SPEC, large_model=False).share_model_across_processes()
    fake_gpus(monkeypatch, 0)
    assert not auto.share_model_across_processes() and auto.model_copies() == 1


def test_auto_dtype_is_float16_on_cuda_bfloat16_on_amx_cpus_else_float32(monkeypatch):
    for amx in (True, False):
        monkeypatch.setattr(embedder, "cpu_has_amx_bf16", lambda: amx)
        assert resolve_dtype("cuda:0") == torch.float16
        assert resolve_dtype("mps") == torch.float32
        assert resolve_dtype("cpu") == (torch.bfloat16 if amx else torch.float32)
        assert resolve_dtype("cpu", "float32") == torch.float32
    assert resolve_dtype("cuda", "bfloat16") == torch.bfloat16
    with pytest.raises(ValueError):
        resolve_dtype("cpu", "int8")


def test_a_torch_without_the_amx_probe_counts_as_no_amx(monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    assert cpu_has_amx_bf16()
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported")
    assert not cpu_has_amx_bf16()


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d != "float32"])
def test_every_dtype_loads_offline_and_embeds_close_to_float32(encoder, dtype):
    low = SentenceEncoder(SPEC, "cpu", dtype, max_batch_tokens=64)
    embedded = low.embed(TEXTS)
    assert low.dtype == embedded.dtype == dtype and next(low.model.parameters()).dtype == getattr(torch, dtype)
    assert embedded.vectors.dtype == np.float32
    assert np.all(cosines(embedded.vectors, encoder.embed(TEXTS).vectors) > 1 - LOW_PRECISION_COSINE_TOLERANCE)


def test_an_index_from_another_backend_is_refused():
    assert EmbedderSpec.from_dict({"model": SPEC.model}).backend == "torch"  # manifests before the field
    check_backend_available(SPEC)
    other = EmbedderSpec(backend="onnx-int8")
    with pytest.raises(IncompatibleEmbedderError, match="backend 'onnx-int8'.*embeds with: torch"):
        check_backend_available(other)
    with pytest.raises(IncompatibleEmbedderError, match="backend"):
        check_compatible(other, SPEC)
    with pytest.raises(IncompatibleEmbedderError, match="onnx-int8"):
        SentenceEncoder(other, "cpu")  # before loading any weights


def test_the_server_refuses_an_index_from_another_backend_at_load(tiny_hash_index, tmp_path):
    import json
    import shutil

    from ritrag.layout import IndexLayout
    from ritrag.serving.api import RitragIndex

    copy = tmp_path / "index"
    shutil.copytree(tiny_hash_index, copy)
    layout = IndexLayout(str(copy))
    path = layout.manifest_path(layout.current_version())
    with open(path, encoding="utf-8") as fh:
        manifest = json.load(fh)
    assert manifest["config"]["embedder"]["backend"] == "torch"  # the build records it
    manifest["config"]["embedder"]["backend"] = "openvino-int8"
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(manifest, fh)
    with pytest.raises(IncompatibleEmbedderError, match="openvino-int8"):
        RitragIndex(str(copy))


def test_resource_hints_land_on_the_inference_step_only():
    options = PipelineOptions(["--embed_accelerator=type:nvidia-l4;count:1;install-nvidia-driver",
                               "--embed_min_ram=16GB", "--embed_device=cpu"])
    p = test_pipeline.TestPipeline(runner="FnApiRunner")
    _ = p | Create([(1, "a")]) | EmbedChunks.from_options(SPEC, options)
    hinted = {}

    class Hints(PipelineVisitor):
        def visit_transform(self, applied):
            hinted[applied.full_label] = applied.resource_hints
    p.visit(Hints())
    inference = hinted["EmbedChunks/RunInference/BeamML_RunInference"]
    assert inference[AcceleratorHint.urn] == b"type:nvidia-l4;count:1;install-nvidia-driver"
    assert inference[MinRamHint.urn] == b"16000000000"  # Beam reads GB as 10**9
    assert not any(hints for label, hints in hinted.items() if "BeamML_RunInference" not in label)


def test_embed_chunks_gives_every_chunk_its_own_vector(encoder):
    ids = random.Random(3).sample(range(10**12), len(TEXTS))
    expected = dict(zip(ids, encode(encoder.model, TEXTS, "", True)))

    def matches(actual):
        assert sorted(k for k, _ in actual) == sorted(ids), actual
        for chunk_id, vector in actual:
            assert vector.dtype == np.float32
            if cosines(vector[None], expected[chunk_id][None])[0] < 1 - COSINE_TOLERANCE:
                raise BeamAssertException(f"chunk {chunk_id} got another chunk's vector")

    # FnApiRunner: Beam's in-process runner. "DirectRunner" would first try to
    # start Prism, a separate Go binary that it downloads.
    p = test_pipeline.TestPipeline(runner="FnApiRunner")
    vectors = (p | Create(list(zip(ids, TEXTS)))
               | EmbedChunks(SPEC, "cpu", dtype="float32", batch_size=3, max_batch_tokens=64))
    assert_that(vectors, matches)
    result = p.run()
    result.wait_until_finish()
    for name in ("chunks_embedded", DTYPE_COUNTER_PREFIX + "float32"):  # the dtype the manifest's stats record
        counters = result.metrics().query(MetricsFilter().with_namespace(METRICS_NAMESPACE).with_name(
            name))["counters"]
        assert sum(c.committed for c in counters) == len(TEXTS)


def test_hashing_encoder_is_a_deterministic_normalized_stand_in():
    from ritrag.embedder import resolve_model_path
    from ritrag.encoders import HashingEncoder, load_encoder

    encoder = load_encoder(EmbedderSpec(model="hashing:64"))
    assert isinstance(encoder, HashingEncoder) and encoder.dimension == 64
    first = encoder.embed(["Logs rotate daily", "Ports and TLS", ""]).vectors
    again = encoder.embed(["Logs rotate daily", "Ports and TLS", ""]).vectors
    np.testing.assert_array_equal(first, again)
    np.testing.assert_allclose(np.linalg.norm(first[:2], axis=1), 1.0, rtol=1e-6)
    assert not first[2].any()  # no tokens, no direction
    assert float(first[0] @ encoder.embed(["daily logs rotate"]).vectors[0]) == pytest.approx(1.0)
    # chunks are cut with the bundled model's tokenizer, exactly as for the default model
    assert resolve_model_path("hashing:64") == resolve_model_path("bundled:all-MiniLM-L6-v2")


def test_the_hashing_encoder_costs_what_its_words_hold_not_the_longest_word_times_their_count():
    from ritrag.encoders import HashingEncoder

    encoder = HashingEncoder(64)
    texts = ["x" * 5_000_000, " ".join(["word"] * 100_000), "Logs rotate daily"]
    vectors = encoder.embed(texts).vectors  # a fixed-width array of the words asked for 1.8 TiB here
    assert vectors.shape == (3, 64)
    np.testing.assert_array_equal(vectors[2], encoder.embed(["Logs rotate daily"]).vectors[0])
