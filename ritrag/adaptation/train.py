"""Fine-tuning an index's embedder on pairs from its own forest (`adapt`).

The loss is sentence-transformers' MultipleNegativesRankingLoss: each anchor
against its positive, every other positive of the batch, and the batch's hard
negatives (ritrag/adaptation/pairs.py). The loop is a plain torch loop over that
loss rather than SentenceTransformerTrainer, which needs the `datasets` and
`accelerate` packages this install does not carry; the loop is what the
trainer runs on one device (AdamW, linear warm-up then decay, gradients clipped
at norm 1) and lets a step budget and a time budget stop it between steps.

Deterministic: the pairs are a function of the index and the seed, batches are
cut by a seeded permutation, torch is seeded and runs its deterministic
algorithms, so two runs on one CPU (same torch build and thread count) write
byte-identical weights. The model is saved in the sentence-transformers format with ADAPTATION_RECORD
beside it: the training's settings, pair counts, source index version, losses
and the folder's checksum (`model_checksum`, which a build with
`--embedding_model FOLDER` records and the server checks).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import time
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ritrag.adaptation.pairs import TrainingPair, sample_pairs
from ritrag.embedder import (ADAPTATION_RECORD, HASHING_PREFIX, EmbedderSpec, check_model_files, choose_device,
                             is_model_folder, model_checksum, quiet_model_loading, resolve_model_path)
from ritrag.flags import option
from ritrag.reader import IndexReader
from ritrag.storage import is_remote

LOG = logging.getLogger(__name__)
WARMUP_FRACTION = 0.1  # of the planned steps, the learning rate rising linearly from 0
MAX_GRAD_NORM = 1.0
WEIGHT_DECAY = 0.01  # sentence-transformers' fit default
PROGRESS_LINES = 20  # loss lines per run (and the last step's)


class AdaptError(ValueError):
    """An adaptation that cannot start: its index, model or output refused."""


@dataclasses.dataclass(frozen=True)
class AdaptConfig:
    """What an adaptation runs with; every field is a flag of `ritrag adapt`."""

    steps: int = option(200, "optimizer steps (the step budget)")
    max_minutes: float = option(60.0, "stop after the step that passes this many minutes (the time budget)")
    batch_size: int = option(32, "pairs per step; each anchor's negatives are the batch's other positives")
    seed: int = option(0, "seed of the pair sample, the batches and torch")
    lr: float = option(2e-5, "peak learning rate (AdamW)")
    hard_negatives: bool = option(True, "add a look-alike node's text (a sibling, or the same title on another "
                                        "site) to each pair as a hard negative", choices=("on", "off"))
    base_model: str | None = option(None, "model to start from: a local folder or bundled:all-MiniLM-L6-v2 "
                                          "(default: the index's own model)")
    device: str | None = option(None, "torch device (default: cuda, then mps, then cpu; runs are "
                                      "byte-for-byte repeatable on a CPU)")

    def __post_init__(self):
        if self.steps < 1 or self.batch_size < 2:
            raise AdaptError(f"steps must be at least 1 and batch size at least 2 (in-batch negatives), not "
                             f"{self.steps} and {self.batch_size}")
        if not self.max_minutes > 0 or not self.lr > 0:
            raise AdaptError(f"max minutes and learning rate must be positive, not {self.max_minutes} and {self.lr}")


@dataclasses.dataclass(frozen=True)
class AdaptOutput:
    """Where `adapt` saves the model: `ritrag adapt`'s --out."""

    out: str | None = option(None, "new folder for the adapted model")


def pack_batches(pairs: Sequence[TrainingPair], batch_size: int) -> list[list[TrainingPair]]:
    """`pairs` in order, cut into batches in which no anchor repeats and no text
    is both one row's candidate and another's (a duplicate positive would be
    scored as its own negative); a pair that collides waits for a later batch."""
    batches: list[list[TrainingPair]] = []
    pending = list(pairs)
    while pending:
        batch: list[TrainingPair] = []
        anchors: set[str] = set()
        candidates: set[str] = set()
        waiting: list[TrainingPair] = []
        for pair in pending:
            texts = {pair.positive} | ({pair.negative} if pair.negative is not None else set())
            if len(batch) < batch_size and pair.anchor not in anchors and not texts & candidates:
                batch.append(pair)
                anchors.add(pair.anchor)
                candidates |= texts
            else:
                waiting.append(pair)
        batches.append(batch)
        pending = waiting
    return batches


def training_batches(pairs: Sequence[TrainingPair], batch_size: int, seed: int) -> Iterator[list[TrainingPair]]:
    """Batches of `pairs`, epoch after epoch, each epoch in a seeded order. A
    batch is all triplets or all pairs (the loss takes one shape per batch);
    batches of one pair (nothing to contrast) are left out."""
    for epoch in range(1 << 30):
        rng = np.random.default_rng([seed, epoch])
        ordered = [pairs[i] for i in rng.permutation(len(pairs))]
        batches = [batch for with_negative in (True, False)
                   for batch in pack_batches([p for p in ordered if (p.negative is not None) == with_negative],
                                             batch_size) if len(batch) >= 2]
        if not batches:
            return
        for i in rng.permutation(len(batches)):
            yield batches[i]


@contextlib.contextmanager
def deterministic_torch(seed: int) -> Iterator[None]:
    """torch seeded and on its deterministic algorithms, the caller's setting restored after."""
    import torch

    was = torch.are_deterministic_algorithms_enabled()
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was)


def fine_tune(model, pairs: Sequence[TrainingPair], config: AdaptConfig, spec: EmbedderSpec,
              progress: Callable[[str], None]) -> dict[str, Any]:
    """Train `model` (a SentenceTransformer, in place) on `pairs` for
    `config.steps` steps or `config.max_minutes`, whichever ends first; what
    the run did, for the record."""
    import torch
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from sentence_transformers.util import batch_to_device

    loss_fn = MultipleNegativesRankingLoss(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=WEIGHT_DECAY)
    warmup = max(1, round(config.steps * WARMUP_FRACTION))
    decay = max(1, config.steps - warmup)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min((step + 1) / warmup, max(0.0, (config.steps - step) / decay)))
    model.train()
    started, losses, window = time.monotonic(), [], []
    every = max(1, config.steps // PROGRESS_LINES)
    stopped_by = "steps"
    step = 0
    for step, batch in enumerate(training_batches(pairs, config.batch_size, config.seed), start=1):
        columns = [[spec.query_prefix + p.anchor for p in batch], [spec.document_prefix + p.positive for p in batch]]
        if batch[0].negative is not None:
            columns.append([spec.document_prefix + p.negative for p in batch])
        features = [batch_to_device(model.preprocess(texts), model.device) for texts in columns]
        loss = loss_fn(features, None)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        window.append(float(loss.detach()))
        elapsed = time.monotonic() - started
        last = step == config.steps or elapsed > config.max_minutes * 60
        if step % every == 0 or last:
            losses.append({"step": step, "loss": round(float(np.mean(window)), 5)})
            progress(f"step {step}/{config.steps}: loss {np.mean(window):.4f} "
                     f"(lr {schedule.get_last_lr()[0]:.2e}, {elapsed:.0f} s)")
            window = []
        if last:
            stopped_by = "steps" if step == config.steps else "max_minutes"
            break
    else:
        stopped_by = "pairs"  # fewer than two pairs to contrast: nothing to train on
    model.eval()
    return {"steps_done": step, "stopped_by": stopped_by, "seconds": round(time.monotonic() - started, 1),
            "losses": losses}


def _checked_out(out: str) -> str:
    if is_remote(out):
        raise AdaptError(f"--out {out}: a model folder is written on the local disk (the build reads it there)")
    out = os.path.abspath(out)
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise AdaptError(f"--out {out} exists and is not an empty folder; name a new one")
    return out


def _base_model(reader: IndexReader, config: AdaptConfig) -> tuple[EmbedderSpec, str]:
    """(the index's embedder spec, the model to start from)."""
    spec = reader.manifest.settings.index.embedder
    base = config.base_model or spec.model
    if base.startswith(HASHING_PREFIX):
        raise AdaptError(f"the index was embedded with {base}, a stand-in without weights; start from a model: "
                         "--base_model bundled:all-MiniLM-L6-v2")
    if base == spec.model:
        check_model_files(spec)  # an adapted index adapted again: from the weights its vectors came from
    elif not (base.startswith("bundled:") or is_model_folder(base)):
        raise AdaptError(f"--base_model {base}: not a local model folder nor a bundled model (nothing downloads "
                         "weights)")
    return spec, base


def adapt(index: str, out: str, config: AdaptConfig = AdaptConfig(), version: str | None = None,
          progress: Callable[[str], None] = LOG.info) -> dict[str, Any]:
    """Fine-tune the embedder of `index` (its live version, or `version`) on
    pairs from its forest and save it to the folder `out` (which must not
    exist, or be empty); returns the training record written there. Re-embed
    with `ritrag build INPUT --out NEW_INDEX --embedding_model OUT`."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never download weights
    out = _checked_out(out)
    reader = IndexReader(index, version)
    spec, base = _base_model(reader, config)
    started = time.monotonic()
    sample = sample_pairs(reader, config.steps * config.batch_size, config.seed, config.hard_negatives)
    if len(sample.pairs) < 2:
        raise AdaptError(f"{index}: {len(sample.pairs)} training pairs found (nodes with text, link texts); "
                         "an index this small has nothing to adapt to")
    progress(f"{sample.counts['pairs']} pairs ({sample.counts['path_pairs']} path, {sample.counts['anchor_pairs']} "
             f"anchor; {sample.counts['hard_negatives']} with a hard negative) in {time.monotonic() - started:.1f} s")
    from sentence_transformers import SentenceTransformer

    quiet_model_loading()
    base_folder = resolve_model_path(base)
    with deterministic_torch(config.seed):
        model = SentenceTransformer(base_folder, device=choose_device(config.device))
        if spec.max_seq_length:
            model.max_seq_length = min(spec.max_seq_length, model.max_seq_length or spec.max_seq_length)
        run = fine_tune(model, sample.pairs, config, spec, progress)
    if run["steps_done"] == 0:
        raise AdaptError(f"{index}: no batch of two pairs without a shared text; nothing to train on")
    partial = f"{out}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    model.save(partial, create_model_card=False)
    record = {
        "index": index if is_remote(index) else os.path.abspath(index), "index_version": reader.version,
        "base_model": base,
        "base_model_sha256": model_checksum(base_folder),
        "config": {**dataclasses.asdict(config), "base_model": base}, "pairs": sample.counts, **run,
        "model_sha256": model_checksum(partial),
    }
    with open(os.path.join(partial, ADAPTATION_RECORD), "w", encoding="utf-8") as fh:
        json.dump(record, fh, indent=1, sort_keys=True)
    if os.path.isdir(out):
        os.rmdir(out)  # empty (checked above): the finished folder takes its place whole
    os.replace(partial, out)
    progress(f"saved {out} (sha256 {record['model_sha256'][:12]}..., {run['steps_done']} steps, "
             f"stopped by {run['stopped_by']})")
    return record
