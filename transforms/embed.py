"""The embed step: (chunk_id, text) -> (chunk_id, float32 vector), on a GPU when
the worker has one.

`EmbedChunks` is Beam's RunInference over a `KeyedModelHandler`, so the chunk
id travels with its text through batching and comes back with its vector. The
handler is thin; `ritrag.encoders.SentenceEncoder` does the work (length-sorted
token-budget batches, float16 on CUDA, `torch.inference_mode`, halving the
budget on out-of-memory), so that the server embeds queries through the same
code.

How the step lands on GPU machines:

- RunInference applies the handler's resource hints to its inference ParDo
  only, so `--embed_accelerator` asks for a GPU for this step alone (Dataflow
  right fitting); parsing and chunking stay on cheap CPU workers.
- On a GPU, one model copy per GPU serves every SDK process and thread of the
  worker (Beam's `share_model_across_processes`): N processes each loading a
  copy would multiply device memory and fight over the device. On CPU each
  SDK process keeps its own copy (a small model is cheaper to copy than to
  reach through a proxy) and runs `--embed_cpu_threads` batches at once, one
  torch thread each.

Counts (namespace "ritrag.embed", data: transforms/counts.py, recorded in the
manifest): `chunks_embedded` counts texts that went through the model (the
incremental update checks it to prove that cached chunks were not
re-embedded), `chunks_embedded_<dtype>` the same per arithmetic the workers
ran (`--embed_dtype auto` resolves on each worker, by its device). The metric
`oom_backoffs` counts budget halvings (monitoring only). RunInference reports
its own batch and latency metrics under the same namespace.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping, Sequence

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics
from apache_beam.ml.inference.base import KeyedModelHandler, ModelHandler, RunInference
from apache_beam.options.pipeline_options import PipelineOptions

from ritrag.embedder import DTYPES, EmbedderSpec, available_cpus, choose_device
from ritrag.encoders import SentenceEncoder, load_encoder
from ritrag.flags import add_arguments, from_arguments, option
from ritrag.transforms.counts import COUNTS, CountingDoFn, record_counts

METRICS_NAMESPACE = "ritrag.embed"
CHUNKS_EMBEDDED_COUNTER = "chunks_embedded"
DTYPE_COUNTER_PREFIX = "chunks_embedded_"  # + the dtype: chunks each worker dtype embedded
# Texts per RunInference batch: the pool that SentenceEncoder sorts by length
# and cuts into token-budget batches. Bigger pools pad less; 1024 chunks of
# text is a few MB, cheap to hold and to send through the shared-model proxy.
DEFAULT_BATCH_SIZE = 1024


@dataclasses.dataclass(frozen=True)
class EmbedRuntime:
    """Where and how a job runs the model (EmbedderSpec says which model):
    the embed step's flags, as `EmbedChunks.from_options` reads them."""

    embed_device: str | None = option(None, "cuda, mps or cpu (default: auto)")
    embed_accelerator: str | None = option(
        None, 'Beam accelerator resource hint for the embed step only, e.g. '
              '"type:nvidia-l4;count:1;install-nvidia-driver" (docs/GPU.md)')
    embed_min_ram: str | None = option(None, "Beam min_ram resource hint for the embed step, e.g. 16GB")
    embed_dtype: str = option("auto", "auto: float16 on CUDA, bfloat16 on a CPU with AMX (Intel Xeon since "
                                      "Sapphire Rapids), float32 elsewhere; all give interchangeable vectors "
                                      "(docs/GPU.md)", choices=("auto", *DTYPES))
    embed_max_batch_tokens: int | None = option(None, "padded tokens per forward pass (default: by device)")
    embed_batch_size: int = option(DEFAULT_BATCH_SIZE, "texts per RunInference batch, sorted by length inside")
    embed_model_copies: int | None = option(None, "model copies per worker (default: one per visible GPU)")
    embed_cpu_threads: int | None = option(None, "CPU workers: batches embedded at once per SDK process, one torch "
                                                 "thread each (default: the process's CPUs; 1 where the runner "
                                                 "starts one SDK process per core)")


class EmbedOptions(PipelineOptions):
    """Options of the embed step."""  # (its argument group's title) EmbedRuntime's flags

    @classmethod
    def _add_argparse_args(cls, parser):
        add_arguments(parser, EmbedRuntime)


class SentenceTransformerModelHandler(ModelHandler[str, tuple[np.ndarray, str], SentenceEncoder]):
    """RunInference handler for a sentence-transformers model: a batch of
    texts -> (float32 vector, the dtype that embedded it) per text, in batch order."""

    def __init__(
        self,
        spec: EmbedderSpec,
        device: str | None = None,
        *,
        dtype: str = "auto",
        max_batch_tokens: int | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        large_model: bool | None = None,
        model_copies: int | None = None,
        cpu_threads: int | None = None,
        resource_hints: Mapping[str, str] | None = None,
    ):
        """`batch_size` texts go to each `run_inference` call, where they are
        sorted by length and cut into batches of at most `max_batch_tokens`
        padded tokens. `large_model` None shares one copy across processes
        exactly when the worker's device is CUDA; `model_copies` None loads one
        per visible GPU when sharing: both are decided on the worker, the
        machine that knows its GPUs. `cpu_threads` (CPU only): batches run at
        once, one torch thread each; default all of the process's CPUs."""
        super().__init__(min_batch_size=batch_size, max_batch_size=batch_size)
        self._spec = spec
        self._device = device
        self._dtype = dtype
        self._max_batch_tokens = max_batch_tokens
        self._large_model = large_model
        self._model_copies = model_copies
        self._cpu_threads = cpu_threads
        self._resource_hints = dict(resource_hints or {})
        self._oom_backoffs = Metrics.counter(METRICS_NAMESPACE, "oom_backoffs")

    def load_model(self) -> SentenceEncoder:
        return load_encoder(self._spec, self._device, dtype=self._dtype,
                            max_batch_tokens=self._max_batch_tokens,
                            cpu_parallelism=self._cpu_threads or available_cpus())

    def run_inference(
        self,
        batch: Sequence[str],
        model: SentenceEncoder,
        inference_args: dict[str, Any] | None = None,
    ) -> Iterable[tuple[np.ndarray, str]]:
        # With a shared model, `model` is a proxy to another process, where Beam
        # metrics would be lost: the encoder returns its back-off count and the
        # counter is bumped here, in the DoFn's own thread. The dtype goes with
        # each vector, for CountEmbeddedFn to count as data.
        embedded = model.embed(batch, self._spec.document_prefix)
        if embedded.oom_backoffs:
            self._oom_backoffs.inc(embedded.oom_backoffs)
        return [(vector, embedded.dtype) for vector in embedded.vectors]

    def get_metrics_namespace(self) -> str:
        return METRICS_NAMESPACE

    def get_resource_hints(self) -> dict:
        return dict(self._resource_hints)

    def share_model_across_processes(self) -> bool:
        if self._large_model is not None:
            return self._large_model
        return choose_device(self._device).startswith("cuda")

    def model_copies(self) -> int:
        if self._model_copies:
            return self._model_copies
        # An explicit "cuda:N" pins one device, so one copy.
        if self.share_model_across_processes() and choose_device(self._device) == "cuda":
            import torch

            return max(1, torch.cuda.device_count())
        return 1


class EmbedChunks(beam.PTransform):
    """(chunk_id, text) -> (chunk_id, float32 vector): the embedding of each
    chunk's text with the spec's document prefix, L2-normalized when the spec
    says so. Every chunk id keeps its own vector whatever order batching and
    length sorting put the texts in.

    `resource_hints` (e.g. {"accelerator": "type:nvidia-l4;count:1;install-nvidia-driver",
    "min_ram": "16GB"}) apply to the inference step only; see
    `EmbedChunks.from_options` for the command-line form.
    """

    def __init__(self, spec: EmbedderSpec, device: str | None = None, **handler_options: Any):
        """`handler_options`: the keyword options of `SentenceTransformerModelHandler`."""
        super().__init__()
        self._handler = KeyedModelHandler(SentenceTransformerModelHandler(spec, device, **handler_options))

    @classmethod
    def from_options(cls, spec: EmbedderSpec, options: PipelineOptions) -> "EmbedChunks":
        """The embed step configured by `EmbedOptions` flags."""
        run = from_arguments(EmbedRuntime, options.view_as(EmbedOptions))
        hints = {"accelerator": run.embed_accelerator, "min_ram": run.embed_min_ram}
        return cls(spec, run.embed_device, dtype=run.embed_dtype, max_batch_tokens=run.embed_max_batch_tokens,
                   batch_size=run.embed_batch_size, model_copies=run.embed_model_copies,
                   cpu_threads=run.embed_cpu_threads, resource_hints={k: v for k, v in hints.items() if v})

    def expand(self, chunks: beam.PCollection[tuple[int, str]]) -> beam.PCollection[tuple[int, np.ndarray]]:
        return record_counts(chunks
                             | "RunInference" >> RunInference(self._handler)
                             | "Count" >> beam.ParDo(CountEmbeddedFn()).with_outputs(COUNTS, main="vectors")
                             ).vectors


class CountEmbeddedFn(CountingDoFn):
    """(chunk id, (vector, dtype)) -> (chunk id, vector), counting chunks_embedded and chunks_embedded_<dtype>."""

    def __init__(self):
        super().__init__(METRICS_NAMESPACE)

    def process(self, embedded: tuple[int, tuple[np.ndarray, str]]) -> Iterable[tuple[int, np.ndarray]]:
        chunk_id, (vector, dtype) = embedded
        self.count(CHUNKS_EMBEDDED_COUNTER)
        self.count(DTYPE_COUNTER_PREFIX + dtype)
        yield chunk_id, vector
