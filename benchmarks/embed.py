"""Embedding throughput: the embed step's encoder against a plain
`SentenceTransformer.encode` loop, same model, same chunks, same run.

    python benchmarks/embed.py                                  # CPU, 256 chunks
    python benchmarks/embed.py --chunks 1000 --dtypes float32,bfloat16 --dynamic-int8
                                                                # CPU precisions (docs/GPU.md)
    python benchmarks/embed.py --device cuda --chunks 20000     # a GPU (docs/GPU.md)

Chunks are real: pages sampled from the HTML corpus, parsed and cut by the
project's own parser and chunker (`ritrag.transforms.parse.parse_page`,
`ritrag.transforms.chunk.chunk_text`) at the model's token limit, in page order as the
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
               CUDA, and on CPU `--cpu-threads` single-threaded batches at once;
               one contender per `--dtypes` entry (the build's --embed_dtype).
  int8         (`--dynamic-int8`) the float32 embed step with torch's dynamic
               int8 quantization of every Linear layer: measured, not offered
               by the build (it fails the quality check below).

Quality, without labels, against the plain loop's float32 vectors: cosine of
each chunk's two vectors (min and mean), and top-10 neighbour agreement (the
share of each chunk's 10 nearest float32 neighbours among the contender's 10
nearest), for chunks among chunks and for queries (the sampled pages' titles)
among chunks. A contender passes at agreement >= 0.95 on both and cosine
>= 0.999 on every chunk; `--embed_dtype auto` picks only dtypes that passed.
Tokens are the model's input tokens (special tokens included, truncated at its
max sequence length), not the padding. On a GPU, model FLOPs utilization is
estimated as 2 x parameters x tokens / time / the GPU's dense 16-bit peak.

Peak memory is the whole process's resident set while a contender runs (every
contender's model stays loaded), beside its own weights.

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

from benchmarks.results import ProcessTreeMemory, cpu_description, write_section  # noqa: E402
from ritrag.embedder import (DEFAULT_MODEL, EmbedderSpec, available_cpus, choose_device,  # noqa: E402
                             load_sentence_transformer, load_tokenizer, model_token_limit)
from ritrag.encoders import SentenceEncoder, token_budget_batches  # noqa: E402
from ritrag.transforms.chunk import chunk_text, counts_add_up, tokenizer_counter  # noqa: E402
from ritrag.transforms.parse import UnparseablePage, parse_page  # noqa: E402
from ritrag.transforms.embed import DEFAULT_BATCH_SIZE  # noqa: E402

DEV_CORPUS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "corpus")
SITE = "http://localhost/"  # the corpus is a directory: pages get URLs under it
# Dense float16/bfloat16 tensor-core peaks (no sparsity), from the vendors' data sheets.
PEAK_TFLOPS = {"H200": 989, "H100 SXM": 989, "H100 80GB HBM3": 989, "H100 PCIe": 756, "H100": 756,
               "A100": 312, "L40S": 362, "L4": 121, "A10": 125, "T4": 65, "V100": 125}
PROJECTED_CHUNKS = 10_000_000
WARM_UP_CHUNKS = 16
NEIGHBOURS = 10
MIN_AGREEMENT = 0.95  # top-10 neighbour agreement with float32, chunks and queries
MIN_COSINE = 0.999  # every chunk's vector against its float32 vector


def corpus_chunks(corpus: str, spec: EmbedderSpec, count: int, seed: int) -> list[dict[str, str]]:
    """`count` chunks of pages drawn at random from the corpus manifest: one
    node per page, as the build's page granularity makes them; each with its
    page's title (the quality check's queries)."""
    with open(os.path.join(corpus, "manifest.tsv"), encoding="utf-8") as fh:
        pages = [(row["product"], row["relative_path"]) for row in csv.DictReader(fh, delimiter="\t")]
    random.Random(seed).shuffle(pages)
    tokenizer = load_tokenizer(spec)
    count_tokens, limit = tokenizer_counter(tokenizer), model_token_limit(spec, tokenizer)
    additive = counts_add_up(tokenizer)
    chunks: list[dict[str, str]] = []
    for product, path in pages:
        with open(os.path.join(corpus, product, path), "rb") as fh:
            try:
                page = parse_page(fh.read(), f"{SITE}{product}/{path}", f"{SITE}{product}/")
            except UnparseablePage:
                continue
        chunks.extend({"text": text, "title": page.title}
                      for text in chunk_text(page.title, page.body, count_tokens, limit, additive))
        if len(chunks) >= count:
            return chunks[:count]
    raise SystemExit(f"the corpus has only {len(chunks)} chunks")


def load_chunks(args: argparse.Namespace, spec: EmbedderSpec) -> list[dict[str, str]]:
    """Chunks as {"text", "title"}; a cache file from before titles has none."""
    if args.chunks_file and os.path.exists(args.chunks_file):
        with open(args.chunks_file, encoding="utf-8") as fh:
            chunks = [json.loads(line) for line in fh]
        if len(chunks) < args.chunks:
            raise SystemExit(f"{args.chunks_file} holds {len(chunks)} chunks, fewer than --chunks")
        return chunks[:args.chunks]
    chunks = corpus_chunks(args.corpus, spec, args.chunks, args.seed)
    if args.chunks_file:
        with open(args.chunks_file, "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(chunk) + "\n" for chunk in chunks)
    return chunks


def slices(items: Sequence, size: int) -> list:
    return [items[i:i + size] for i in range(0, len(items), size)]


class Contender(NamedTuple):
    run: Callable[[Sequence[str]], np.ndarray]
    torch_threads: int  # process-wide in torch, so every contender sets its own
    threads_label: str
    dtype: str


class Timed(NamedTuple):
    seconds: dict[str, list[float]]  # per run
    vectors: dict[str, np.ndarray]
    peak_rss: dict[str, int]  # bytes, the process's, over the contender's runs


def time_interleaved(contenders: dict[str, Contender], chunks: Sequence[str], repeats: int) -> Timed:
    """Wall seconds per run of each contender, its vectors and the process's
    peak memory while it ran. A short warm-up run each first; the order rotates
    every repeat so that no contender always runs right after another."""
    def run(name: str, texts: Sequence[str]) -> np.ndarray:
        torch.set_num_threads(contenders[name].torch_threads)
        return contenders[name].run(texts)

    names = list(contenders)
    for name in names:
        run(name, chunks[:WARM_UP_CHUNKS])
    seconds: dict[str, list[float]] = {name: [] for name in names}
    vectors: dict[str, np.ndarray] = {}
    peak_rss = dict.fromkeys(names, 0)
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            with ProcessTreeMemory(every_s=0.05) as memory:
                start = time.perf_counter()
                vectors[name] = run(name, chunks)
                seconds[name].append(time.perf_counter() - start)
            peak_rss[name] = max(peak_rss[name], memory.peak_total)
    return Timed(seconds, vectors, peak_rss)


def neighbour_agreement(reference: np.ndarray, candidate: np.ndarray, ref_queries: np.ndarray | None = None,
                        candidate_queries: np.ndarray | None = None, k: int = NEIGHBOURS) -> float:
    """Mean share of each query's k nearest reference rows that are also among
    its k nearest candidate rows. Without queries, the rows are the queries and
    a row is not its own neighbour."""
    def top_k(queries: np.ndarray | None, rows: np.ndarray) -> np.ndarray:
        scores = (rows if queries is None else queries) @ rows.T
        if queries is None:
            np.fill_diagonal(scores, -np.inf)
        return np.argpartition(-scores, k, axis=1)[:, :k]

    expected, got = top_k(ref_queries, reference), top_k(candidate_queries, candidate)
    return float(np.mean([len(set(e) & set(g)) / k for e, g in zip(expected.tolist(), got.tolist())]))


def state_bytes(values) -> int:
    """Bytes of the tensors in a state dict's values; dynamic int8 keeps each
    Linear's packed weight and bias in a tuple, outside parameters()."""
    total = 0
    for value in values:
        if isinstance(value, torch.Tensor):
            total += value.numel() * value.element_size()
        elif isinstance(value, (tuple, list)):
            total += state_bytes(value)
    return total


def dynamic_int8(encoder: SentenceEncoder) -> SentenceEncoder:
    """`encoder` (float32) with every Linear layer quantized to int8 weights and
    per-batch int8 activations (torch's dynamic quantization, in place)."""
    import warnings

    with warnings.catch_warnings():  # torch points users of this API to torchao
        warnings.simplefilter("ignore")
        encoder.model = torch.ao.quantization.quantize_dynamic(encoder.model, {torch.nn.Linear}, dtype=torch.qint8)
    encoder.dtype = "int8 (dynamic)"
    return encoder


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
    parser.add_argument("--dtypes", default="auto",
                        help="comma-separated: one embed step per dtype (auto: the build's default here)")
    parser.add_argument("--dynamic-int8", action="store_true",
                        help="also the float32 embed step with torch's dynamic int8 quantization")
    parser.add_argument("--chunks", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--plain-batch-size", type=int, default=32,
                        help="the plain loop's batch (sentence-transformers' default)")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE,
                        help="chunks per RunInference batch handed to the embed step")
    parser.add_argument("--max-batch-tokens", type=int, default=None)
    parser.add_argument("--cpu-threads", type=int, default=None,
                        help="CPU: batches at once, one torch thread each (default: all CPUs)")
    parser.add_argument("--corpus", default=os.environ.get("RITRAG_DEV_CORPUS", DEV_CORPUS),
                        help="a corpus folder with manifest.tsv (default: $RITRAG_DEV_CORPUS, else "
                             "../corpus beside the checkout)")
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
    texts = [chunk["text"] for chunk in chunks]
    queries = sorted({chunk["title"] for chunk in chunks if chunk.get("title")})
    load_before = os.getloadavg()[0]

    plain_threads = torch.get_num_threads()  # before SentenceEncoder narrows it on CPU
    plain_model = load_sentence_transformer(spec, device)
    parallelism = args.cpu_threads or available_cpus()
    encoders = [SentenceEncoder(spec, device, dtype, args.max_batch_tokens, cpu_parallelism=parallelism)
                for dtype in args.dtypes.split(",")]
    if args.dynamic_int8:
        encoders.append(dynamic_int8(SentenceEncoder(spec, device, "float32", args.max_batch_tokens,
                                                     cpu_parallelism=parallelism)))
    embed_threads = torch.get_num_threads()
    lengths = [len(ids) for ids in plain_model.tokenizer(
        texts, truncation=True, max_length=plain_model.max_seq_length,
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

    plain_dtype = str(next(plain_model.parameters()).dtype).replace("torch.", "")
    models = {"plain loop": plain_model, "encode(all)": plain_model,
              **{f"embed step {e.dtype}": e.model for e in encoders}}
    contenders = {
        "plain loop": Contender(plain_loop, plain_threads, str(plain_threads), plain_dtype),
        "encode(all)": Contender(encode_all, plain_threads, str(plain_threads), plain_dtype),
        **{f"embed step {e.dtype}": Contender(embed_step(e), embed_threads,
                                              f"{embed_threads} per batch, {e.parallelism} batches at once", e.dtype)
           for e in encoders},
    }
    encoder = encoders[0]
    if encoder.parallelism > 1:
        # Which part of the gain is the batching and which the threading.
        threaded = SentenceEncoder(spec, device, encoder.dtype, args.max_batch_tokens)
        models[f"embed step {encoder.dtype}, torch threading"] = threaded.model
        contenders[f"embed step {encoder.dtype}, torch threading"] = Contender(
            embed_step(threaded), plain_threads, f"{plain_threads}, one batch at a time", encoder.dtype)
    timed = time_interleaved(contenders, texts, args.repeats)
    median = {name: statistics.median(s) for name, s in timed.seconds.items()}
    load_after = os.getloadavg()[0]

    embed_padded = sum(len(b) * pool[b[0]] for pool in slices(lengths, args.batch_size)
                       for b in token_budget_batches(pool, encoder.max_batch_tokens))
    padded = {"plain loop": sum(len(s) * max(s) for s in slices(lengths, args.plain_batch_size)),
              **{name: embed_padded for name in contenders if name.startswith("embed step")}}
    reference = timed.vectors["plain loop"]
    # Queries are embedded once per contender, untimed, as the server would
    # embed them with that contender's arithmetic.
    query_vectors = {name: contenders[name].run(queries) for name in contenders} if queries else {}
    weights = {name: state_bytes(m.state_dict().values()) for name, m in models.items()}
    params = sum(p.numel() for p in encoder.model.parameters())
    peak = peak_flops(device, args.peak_tflops) if device.startswith("cuda") else None

    rows = ["| contender | torch threads | dtype | median s | chunks/s | chunks/s per CPU | tokens/s "
            "| x plain loop | real/padded tokens | weights MB | process peak RSS MB "
            "| top-10 agreement, chunks | top-10 agreement, queries | cosine min | cosine mean | passes "
            f"| hours for {PROJECTED_CHUNKS / 1e6:.0f}M chunks |" + (" MFU |" if peak else ""),
            "|---" * 17 + "|" + ("---|" if peak else "")]
    for name, secs in median.items():
        vectors = timed.vectors[name]
        cosine = np.sum(vectors * reference, axis=1) / (np.linalg.norm(vectors, axis=1)
                                                        * np.linalg.norm(reference, axis=1))
        chunk_agreement = neighbour_agreement(reference, vectors)
        query_agreement = (neighbour_agreement(reference, vectors, query_vectors["plain loop"], query_vectors[name])
                           if queries else float("nan"))
        passes = (chunk_agreement >= MIN_AGREEMENT and cosine.min() >= MIN_COSINE
                  and (not queries or query_agreement >= MIN_AGREEMENT))
        efficiency = f"{tokens / padded[name]:.0%}" if name in padded else "n/a"
        row = (f"| {name} | {contenders[name].threads_label} | {contenders[name].dtype} "
               f"| {secs:.2f} | {len(texts) / secs:.1f} | {len(texts) / secs / available_cpus():.1f} "
               f"| {tokens / secs:,.0f} | {median['plain loop'] / secs:.2f} | {efficiency} "
               f"| {weights[name] / 2**20:.0f} | {timed.peak_rss[name] / 2**20:,.0f} "
               f"| {chunk_agreement:.3f} | {query_agreement:.3f} | {cosine.min():.5f} | {cosine.mean():.5f} "
               f"| {'yes' if passes else 'no'} | {PROJECTED_CHUNKS / (len(texts) / secs) / 3600:,.1f} |")
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
        f"quality against the plain loop's {plain_dtype} vectors: {len(queries)} queries (the sampled pages' "
        f"titles); passes = top-10 agreement >= {MIN_AGREEMENT} (chunks and queries) and cosine >= {MIN_COSINE} "
        "on every chunk; peak RSS is the whole process's (all contenders' models stay loaded)",
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
