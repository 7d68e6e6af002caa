"""Dense recall@k against exact search, and query latency, at 1M-10M vectors.

    python -m benchmarks.dense_recall --work DIR --n 1000000 --shards 4 \
        [--factory STRING ...] [--nprobe 16 32 64] [--rerank 1 2 4 8] [--threads 1 2]

Runs the build's and the server's own code on synthetic vectors:
1. writes `--shards` vector files (ritrag.vectors, float16) of `--n` vectors in
   batches, never holding more than one shard, while keeping the exact top-k of
   every query over the float32 vectors (the reference) and over their float16
   copies (the best a re-ranking can do);
2. trains each factory once on `--train` vectors of the same distribution
   (transforms.dense.train_empty_index), and builds every shard's index from its
   vectors file (transforms.dense.rebuild_index, as a rebuild would);
3. searches one query at a time as the server does (the shards joined behind
   one coarse quantizer as serving.index loads them, `joined_by_quantizer`;
   serving.retrieval.dense_top_k, depth rerank x k), re-ranks exactly (ritrag.vectors.rerank_exact)
   when rerank > 1, and reports recall@k, latency p50/p99 per FAISS thread count,
   and the median CPU time per query (what the latency would be on an idle machine).
The dataset (vector files, queries, ground truth) is kept in --work and reused
by later runs with the same --n, --shards, --queries, --k and --seed; so are
trained indexes and shard indexes (with the time they took).

The vectors imitate sentence embeddings (benchmarks/synthetic_index.py's
`SyntheticEmbeddings`, which the synthetic indexes use too).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import time

import faiss
import numpy as np

from ritrag.layout import shard_file_name
from ritrag.vectors import VECTORS_EXTENSION, VECTORS_KIND, VectorStore, rerank_exact, write_vectors
from ritrag.serving.dense_shards import joined_by_quantizer
from ritrag.serving.retrieval import dense_top_k
from ritrag.transforms.dense import choose_params, rebuild_index, train_empty_index
from benchmarks.synthetic_index import BATCH, QUERY_STREAM, SyntheticEmbeddings

TRAIN_STREAM = 1 << 41  # batch indices of training vectors, apart from the corpus's and the queries'


def merge_top_k(best: tuple[np.ndarray, np.ndarray], scores: np.ndarray, ids: np.ndarray, k: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """The k best (scores, ids) per query of the running best and a new batch."""
    all_scores = np.concatenate([best[0], scores], axis=1)
    all_ids = np.concatenate([best[1], np.broadcast_to(ids, scores.shape)], axis=1)
    keep = np.argpartition(-all_scores, k - 1, axis=1)[:, :k]
    return np.take_along_axis(all_scores, keep, 1), np.take_along_axis(all_ids, keep, 1)


def vector_paths(work: str, shards: int) -> list[str]:
    return [os.path.join(work, shard_file_name(VECTORS_KIND, s, shards, VECTORS_EXTENSION)) for s in range(shards)]


def make_dataset(args, gen: SyntheticEmbeddings) -> dict:
    """Vector files, queries and exact top-k of both precisions, made or reused."""
    spec = {"n": args.n, "shards": args.shards, "queries": args.queries, "k": args.k, "seed": args.seed}
    spec_path = os.path.join(args.work, "dataset.json")
    truth_path = os.path.join(args.work, "ground_truth.npz")
    if os.path.exists(spec_path) and json.load(open(spec_path)) == spec:
        with np.load(truth_path) as saved:  # plain arrays: no pickle
            return {name: saved[name] for name in saved.files} | {"seconds": 0.0}
    started = time.time()
    queries = gen.batch(QUERY_STREAM, args.queries)
    empty = (np.full((args.queries, 0), -np.inf, np.float32), np.zeros((args.queries, 0), np.int64))
    exact, exact16 = empty, empty
    id_rng = np.random.default_rng([args.seed, 7])
    bounds = np.linspace(0, args.n, args.shards + 1).astype(np.int64)
    batch_index, writing_s = 0, 0.0
    for shard, path in enumerate(vector_paths(args.work, args.shards)):
        size = int(bounds[shard + 1] - bounds[shard])
        # chunk id % shards == shard, as the build's shard_of assigns them
        ids = id_rng.integers(0, (1 << 63) // args.shards, size) * args.shards + shard
        if len(np.unique(ids)) != size:
            raise RuntimeError("colliding synthetic chunk ids; use another --seed")
        vectors = np.empty((size, gen.common.shape[0]), np.float16)
        for start in range(0, size, BATCH):
            x = gen.batch(batch_index, min(BATCH, size - start))
            batch_index += 1
            part = ids[start: start + len(x)]
            vectors[start: start + len(x)] = x
            exact = merge_top_k(exact, queries @ x.T, part, args.k)
            exact16 = merge_top_k(exact16, queries @ vectors[start: start + len(x)].astype(np.float32).T,
                                  part, args.k)
        writing = time.time()
        order = np.argsort(ids)
        with open(path, "wb") as fh:
            write_vectors(fh, ids[order], vectors[order])
        del vectors, order
        writing_s += time.time() - writing
        print(f"  shard {shard}: {size} vectors written ({time.time() - started:.0f} s, of which "
              f"{writing_s:.0f} s sorting and writing stores; peak RSS {peak_rss_gib():.1f} GiB)", flush=True)
    truth = {"queries": queries, "exact": exact[1], "exact16": exact16[1]}
    np.savez(truth_path, **truth)
    json.dump(spec, open(spec_path, "w"))
    return truth | {"seconds": time.time() - started}


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    return len(np.intersect1d(found, truth)) / len(truth)


def set_nprobe(shards: list, nprobe: int) -> None:
    for shard in shards:
        try:
            faiss.extract_index_ivf(shard).nprobe = nprobe
        except RuntimeError:
            pass  # exact index: nothing to probe


def search(query: np.ndarray, shards: list, store: VectorStore, k: int, rerank: int) -> np.ndarray:
    """The server's dense retrieval: top rerank x k from the index, re-ranked exactly to k."""
    ids, _ = dense_top_k(query, shards, rerank * k)
    if rerank > 1:
        ids, _ = rerank_exact(query, ids, store)
    return ids[:k]


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def trained_index(factory: str, args, gen: SyntheticEmbeddings) -> tuple[bytes, float]:
    """The trained empty index and its training seconds, kept in --work for later runs."""
    path = os.path.join(args.work, f"trained-{factory.replace(',', '_')}-{args.train}.faiss")
    if os.path.exists(path):
        return open(path, "rb").read(), json.load(open(path + ".json"))["train_s"]
    started = time.time()
    trained = train_empty_index(factory, gen.rows(TRAIN_STREAM, args.train))
    train_s = time.time() - started
    open(path, "wb").write(trained)
    json.dump({"train_s": train_s}, open(path + ".json", "w"))
    return trained, train_s


def shard_indexes(factory: str, trained: bytes, args, store: VectorStore) -> tuple[list[bytes], float]:
    """Every shard's index built from its vectors file, and the seconds that took;
    kept in --work for later runs."""
    path = os.path.join(args.work, f"dense-{factory.replace(',', '_')}-{args.train}.json")
    paths = [f"{path[:-5]}-{s}.faiss" for s in range(len(store.shards))]
    if os.path.exists(path):
        return [open(p, "rb").read() for p in paths], json.load(open(path))["add_s"]
    started = time.time()
    blobs = [rebuild_index(trained, shard.path) for shard in store.shards]
    add_s = time.time() - started
    for blob, shard_path in zip(blobs, paths):
        open(shard_path, "wb").write(blob)
    json.dump({"add_s": add_s}, open(path, "w"))
    return blobs, add_s


def measure_factory(factory: str, args, gen: SyntheticEmbeddings, data: dict, store: VectorStore) -> list[dict]:
    trained, train_s = trained_index(factory, args, gen)
    blobs, add_s = shard_indexes(factory, trained, args, store)
    index_bytes = sum(len(b) for b in blobs)
    shards = [faiss.deserialize_index(np.frombuffer(b, np.uint8)) for b in blobs]
    del blobs
    print(f"{factory}: train {train_s:.0f} s, add {add_s:.0f} s ({args.n / add_s:,.0f} vectors/s), "
          f"index {index_bytes / 2**20:,.0f} MiB, peak RSS {peak_rss_gib():.1f} GiB", flush=True)
    rows = []
    for nprobe in args.nprobe:
        set_nprobe(shards, nprobe)
        searched, _ = joined_by_quantizer(shards)
        for rerank in args.rerank:
            row = {"factory": factory, "nprobe": nprobe, "rerank": rerank, "train_s": round(train_s, 1),
                   "add_s": round(add_s, 1), "index_mib": round(index_bytes / 2**20, 1)}
            for threads in args.threads:
                faiss.omp_set_num_threads(threads)
                search(data["queries"][0], searched, store, args.k, rerank)  # warm-up
                times, cpu, found = [], [], []
                for query in data["queries"]:
                    wall, used = time.perf_counter(), time.process_time()
                    found.append(search(query, searched, store, args.k, rerank))
                    times.append(time.perf_counter() - wall)
                    cpu.append(time.process_time() - used)
                row[f"p50_ms_{threads}t"] = round(1e3 * float(np.percentile(times, 50)), 2)
                row[f"p99_ms_{threads}t"] = round(1e3 * float(np.percentile(times, 99)), 2)
                row[f"cpu_p50_ms_{threads}t"] = round(1e3 * float(np.percentile(cpu, 50)), 2)
            row["recall"] = round(float(np.mean([recall(f, t) for f, t in zip(found, data["exact"])])), 4)
            rows.append(row)
            print("  " + json.dumps(row), flush=True)
    return rows


def point_read_ms(store: VectorStore, rows: int, repeats: int = 3) -> dict[str, float]:
    """Reading `rows` random vectors of one shard: memory-mapped vs through zarr."""
    import zarr
    from zarr.storage import ZipStore

    shard = store.shards[0]
    rng = np.random.default_rng(0)
    wanted = [np.sort(rng.choice(len(shard), rows, replace=False)) for _ in range(repeats)]
    array = zarr.open_group(ZipStore(shard.path, mode="r"), mode="r")["vectors"]
    out = {}
    for name, read in (("mmap", shard.read), ("zarr", lambda r: array.get_orthogonal_selection((r, slice(None))))):
        started = time.perf_counter()
        for r in wanted:
            read(r)
        out[name] = round(1e3 * (time.perf_counter() - started) / repeats, 2)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", required=True, help="directory for the dataset (reused) and results")
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--k", type=int, default=200)
    parser.add_argument("--train", type=int, default=200_000, help="training vectors")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--factory", nargs="*", help="default: the table's choice (choose_params)")
    parser.add_argument("--nprobe", type=int, nargs="+", default=[16, 32, 64, 128])
    parser.add_argument("--rerank", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args(argv)
    os.makedirs(args.work, exist_ok=True)

    gen = SyntheticEmbeddings(seed=args.seed)
    data = make_dataset(args, gen)
    store = VectorStore.open(vector_paths(args.work, args.shards), populate=True)  # as a server opens it
    ceiling = np.mean([recall(a, b) for a, b in zip(data["exact16"], data["exact"])])
    print(f"dataset: {args.n:,} vectors in {args.shards} shards ({data['seconds']:.0f} s); recall@{args.k} of "
          f"exact search over the float16 vectors: {ceiling:.4f}; peak RSS {peak_rss_gib():.1f} GiB", flush=True)
    print(f"point read of 800 rows from one shard (ms): {point_read_ms(store, 800)}", flush=True)
    factories = args.factory or [choose_params(args.n, gen.common.shape[0]).factory]
    rows = [row for factory in factories for row in measure_factory(factory, args, gen, data, store)]
    with open(os.path.join(args.work, f"results-{int(time.time())}.json"), "w") as fh:
        json.dump({"args": vars(args), "float16_ceiling": ceiling, "rows": rows,
                   "peak_rss_gib": peak_rss_gib()}, fh, indent=1)
    print(f"peak RSS {peak_rss_gib():.1f} GiB")


if __name__ == "__main__":
    main()
