"""Embedding throughput: the embed step's encoder against a plain
`SentenceTransformer.encode` loop, same model, same chunks, same run.

    python benchmarks/embed.py                                  # CPU, 256 chunks
    python benchmarks/embed.py --device cuda --chunks 20000     # a GPU (docs/GPU.md)

Chunks are real: pages sampled from the HTML corpus, parsed and cut by the
project's own parser and chunker (`transforms.parse.parse_page`,
`transforms.chunk.chunk_text`) at the model's token limit, in page order as the
chunk step emits them.
`--chunks-file` caches them as JSONL, for machines without the corpus.

Contenders, each timed as a median of `--repeats` runs, interleaved so that
load from other processes falls on all of them alike:
  plain loop   `model.encode(slice)` per `--plain-batch-size` chunks in arrival
               order, float32, torch's default threads: what a naive
               RunInference handler does with each batch it gets.
  encode(all)  one `model.encode(all chunks)` call: sentence-transformers'
               own length sort over the whole set. A reference point, not a
               contender: a pipeline worker never holds the whole corpus.
  embed step   `SentenceEncoder.embed` per RunInference batch (`--batch-size`
               chunks): token-length sort, token-budget batches, float16 on
               CUDA, and on CPU `--cpu-threads` single-threaded batches at once.
Tokens are the model's input tokens (special tokens included, truncated at its
max sequence length), not the padding. On a GPU, model FLOPs utilization is
estimated as 2 x parameters x tokens / time / the GPU's dense 16-bit peak.

Results go to stdout and into this script's own section of
benchmarks/RESULTS.md (one section per device kind and model, replaced on
rerun; other sections are left alone).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import random
import shlex
import statistics
import sys
import time
from typing import Callable, NamedTuple, Sequence

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from benchmarks.results import cpu_description, write_section  # noqa: E402
from ritrag.embedder import (DEFAULT_MODEL, EmbedderSpec, SentenceEncoder, available_cpus,  # noqa: E402
                             choose_device, load_sentence_transformer, load_tokenizer,
                             model_token_limit, token_budget_batches)
from transforms.chunk import chunk_text, counts_add_up, tokenizer_counter  # noqa: E402
from transforms.parse import UnparseablePage, parse_page  # noqa: E402
from transforms.embed import DEFAULT_BATCH_SIZE  # noqa: E402

SITE = "http://localhost/"  # the corpus is a directory: pages get URLs under it
# Dense float16/bfloat16 tensor-core peaks (no sparsity), from the vendors' data sheets.
PEAK_TFLOPS = {"H200": 989, "H100 SXM": 989, "H100 80GB HBM3": 989, "H100 PCIe": 756, "H100": 756,
               "A100": 312, "L40S": 362, "L4": 121, "A10": 125, "T4": 65, "V100": 125}
PROJECTED_CHUNKS = 10_000_000
WARM_UP_CHUNKS = 16


def corpus_chunks(corpus: str, spec: EmbedderSpec, count: int, seed: int) -> list[str]:
    """`count` chunks of pages drawn at random from the corpus manifest: one
    node per page, as the build's page granularity makes them."""
    with open(os.path.join(corpus, "manifest.tsv"), encoding="utf-8") as fh:
        pages = [(row["product"], row["relative_path"]) for row in csv.DictReader(fh, delimiter="\t")]
    random.Random(seed).shuffle(pages)
    tokenizer = load_tokenizer(spec)
    count_tokens, limit = tokenizer_counter(tokenizer), model_token_limit(spec, tokenizer)
    additive = counts_add_up(tokenizer)
    chunks: list[str] = []
    for product, path in pages:
        with open(os.path.join(corpus, product, path), "rb") as fh:
            try:
                page = parse_page(fh.read(), f"{SITE}{product}/{path}", f"{SITE}{product}/")
            except UnparseablePage:
                continue
        chunks.extend(chunk_text(page.title, page.body, count_tokens, limit, additive))
        if len(chunks) >= count:
            return chunks[:count]
    raise SystemExit(f"the corpus has only {len(chunks)} chunks")


def load_chunks(args: argparse.Namespace, spec: EmbedderSpec) -> list[str]:
    if args.chunks_file and os.path.exists(args.chunks_file):
        with open(args.chunks_file, encoding="utf-8") as fh:
            chunks = [json.loads(line)["text"] for line in fh]
        if len(chunks) < args.chunks:
            raise SystemExit(f"{args.chunks_file} holds {len(chunks)} chunks, fewer than --chunks")
        return chunks[:args.chunks]
    chunks = corpus_chunks(args.corpus, spec, args.chunks, args.seed)
    if args.chunks_file:
        with open(args.chunks_file, "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps({"text": t}) + "\n" for t in chunks)
    return chunks


def slices(items: Sequence, size: int) -> list:
    return [items[i:i + size] for i in range(0, len(items), size)]


class Contender(NamedTuple):
    run: Callable[[Sequence[str]], np.ndarray]
    torch_threads: int  # process-wide in torch, so every contender sets its own
    threads_label: str
    dtype: str


def time_interleaved(contenders: dict[str, Contender], chunks: Sequence[str], repeats: int,
                     ) -> tuple[dict[str, list[float]], dict[str, np.ndarray]]:
    """Wall seconds per run of each contender, and its vectors. A short warm-up
    run each first; the order rotates every repeat so that no contender always
    runs right after another."""
    def run(name: str, texts: Sequence[str]) -> np.ndarray:
        torch.set_num_threads(contenders[name].torch_threads)
        return contenders[name].run(texts)

    names = list(contenders)
    for name in names:
        run(name, chunks[:WARM_UP_CHUNKS])
    seconds: dict[str, list[float]] = {name: [] for name in names}
    vectors: dict[str, np.ndarray] = {}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = time.perf_counter()
            vectors[name] = run(name, chunks)
            seconds[name].append(time.perf_counter() - start)
    return seconds, vectors


def machine(device: str) -> str:
    if device.startswith("cuda"):
        return f"{torch.cuda.get_device_name(device)}, {cpu_description()}, torch {torch.__version__}"
    return f"{cpu_description()}, torch {torch.__version__}"


def peak_flops(device: str, override_tflops: float | None) -> float | None:
    if override_tflops:
        return override_tflops * 1e12
    name = torch.cuda.get_device_name(device)
    for key, tflops in PEAK_TFLOPS.items():  # most specific names first
        if key in name:
            return tflops * 1e12
    return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--device", default=None, help="cuda, mps or cpu (default: auto)")
    parser.add_argument("--dtype", default="auto", help="the embed step's dtype (auto: float16 on CUDA)")
    parser.add_argument("--chunks", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--plain-batch-size", type=int, default=32,
                        help="the plain loop's batch (sentence-transformers' default)")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE,
                        help="chunks per RunInference batch handed to the embed step")
    parser.add_argument("--max-batch-tokens", type=int, default=None)
    parser.add_argument("--cpu-threads", type=int, default=None,
                        help="CPU: batches at once, one torch thread each (default: all CPUs)")
    parser.add_argument("--corpus", default="/work/corpus/docs")
    parser.add_argument("--chunks-file", default=None,
                        help="JSONL chunk cache: read when present, else written after sampling")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the GPU's dense 16-bit peak, where its name is not in the table")
    parser.add_argument("--no-record", action="store_true", help="do not touch RESULTS.md")
    args = parser.parse_args(argv)
    spec = EmbedderSpec(model=args.model)
    device = choose_device(args.device)
    chunks = load_chunks(args, spec)
    load_before = os.getloadavg()[0]

    plain_threads = torch.get_num_threads()  # before SentenceEncoder narrows it on CPU
    plain_model = load_sentence_transformer(spec, device)
    encoder = SentenceEncoder(spec, device, args.dtype, args.max_batch_tokens,
                              cpu_parallelism=args.cpu_threads or available_cpus())
    embed_threads = torch.get_num_threads()
    lengths = [len(ids) for ids in plain_model.tokenizer(
        chunks, truncation=True, max_length=plain_model.max_seq_length,
        return_attention_mask=False, return_token_type_ids=False)["input_ids"]]
    tokens = sum(lengths)

    def plain_loop(texts: Sequence[str]) -> np.ndarray:
        return np.concatenate([encode_all(s) for s in slices(texts, args.plain_batch_size)])

    def encode_all(texts: Sequence[str]) -> np.ndarray:
        return plain_model.encode(texts, batch_size=args.plain_batch_size, normalize_embeddings=spec.normalize,
                                  convert_to_numpy=True, show_progress_bar=False)

    def embed_step(step_encoder: SentenceEncoder) -> Callable[[Sequence[str]], np.ndarray]:
        return lambda texts: np.concatenate([step_encoder.embed(s, spec.document_prefix).vectors
                                             for s in slices(texts, args.batch_size)])

    plain_dtype, embed_dtype = (str(next(m.parameters()).dtype).replace("torch.", "")
                                for m in (plain_model, encoder.model))
    contenders = {
        "plain loop": Contender(plain_loop, plain_threads, str(plain_threads), plain_dtype),
        "encode(all)": Contender(encode_all, plain_threads, str(plain_threads), plain_dtype),
        "embed step": Contender(embed_step(encoder), embed_threads,
                                f"{embed_threads} per batch, {encoder.parallelism} batches at once",
                                embed_dtype),
    }
    if encoder.parallelism > 1:
        # Which part of the gain is the batching and which the threading.
        contenders["embed step, torch threading"] = Contender(
            embed_step(SentenceEncoder(spec, device, args.dtype, args.max_batch_tokens)),
            plain_threads, f"{plain_threads}, one batch at a time", embed_dtype)
    seconds, vectors = time_interleaved(contenders, chunks, args.repeats)
    median = {name: statistics.median(s) for name, s in seconds.items()}
    load_after = os.getloadavg()[0]

    embed_padded = sum(len(b) * pool[b[0]] for pool in slices(lengths, args.batch_size)
                       for b in token_budget_batches(pool, encoder.max_batch_tokens))
    padded = {"plain loop": sum(len(s) * max(s) for s in slices(lengths, args.plain_batch_size)),
              **{name: embed_padded for name in contenders if name.startswith("embed step")}}
    ours, plain = vectors["embed step"], vectors["plain loop"]
    cosine = np.sum(ours * plain, axis=1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(plain, axis=1))
    params = sum(p.numel() for p in encoder.model.parameters())
    peak = peak_flops(device, args.peak_tflops) if device.startswith("cuda") else None

    rows = ["| contender | torch threads | dtype | median s | chunks/s | tokens/s | x plain loop "
            f"| real/padded tokens | hours for {PROJECTED_CHUNKS / 1e6:.0f}M chunks |"
            + (" MFU |" if peak else ""),
            "|---|---|---|---|---|---|---|---|---|" + ("---|" if peak else "")]
    for name, secs in median.items():
        efficiency = f"{tokens / padded[name]:.0%}" if name in padded else "n/a"
        row = (f"| {name} | {contenders[name].threads_label} | {contenders[name].dtype} "
               f"| {secs:.2f} | {len(chunks) / secs:.1f} | {tokens / secs:,.0f} "
               f"| {median['plain loop'] / secs:.2f} | {efficiency} "
               f"| {PROJECTED_CHUNKS / (len(chunks) / secs) / 3600:,.1f} |")
        if peak:
            row += f" {2 * params * tokens / secs / peak:.1%} |"
        rows.append(row)

    command = "python benchmarks/embed.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    notes = [
        f"machine: {machine(device)}",
        f"command: `{command.strip()}`",
        f"chunks: {len(chunks)} from {args.chunks_file or args.corpus} (seed {args.seed}), "
        f"{tokens:,} tokens, median {statistics.median(lengths):.0f} per chunk; embed step: "
        f"RunInference batches of {args.batch_size}, at most {encoder.max_batch_tokens} padded tokens "
        "per forward pass",
        f"median of {args.repeats} interleaved runs, after a warm-up run on {WARM_UP_CHUNKS} chunks each; "
        f"load average {load_before:.1f} before, {load_after:.1f} after (this run accounts for up to "
        f"{available_cpus()}; the rest is other processes on the machine)",
        f"embed step vs plain loop, cosine of each chunk's two vectors: min {cosine.min():.6f}",
    ]
    if peak:
        notes.append(f"MFU = 2 x {params / 1e6:.1f}M parameters x tokens / time / {peak / 1e12:.0f} TFLOP/s "
                     "dense 16-bit peak (ignores attention's length-squared term, and counts the "
                     "embedding table as if it were multiplied)")
    body = "\n".join([f"## Embedding throughput: {device.split(':')[0]}, {args.model}", "",
                      *(f"- {note}" for note in notes), "", *rows])
    print(body)
    if not args.no_record:
        write_section("benchmarks/embed.py", f"{device.split(':')[0]} {args.model}", body)


if __name__ == "__main__":
    main()
