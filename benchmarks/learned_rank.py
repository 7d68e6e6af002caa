"""A ranking learned from the forest (issue 27, item 3): LambdaMART over
GetToC's candidate nodes, trained on pseudo-queries made from the index's own
nodes, against today's min-max fusion on the dev questions.

    python -m benchmarks.learned_rank --index IDX --questions Q.jsonl --out OUT.json --work DIR
        [--per_site 300] [--candidates 200] [--seed 0] [--model_out MODEL.txt]

1. Pseudo-queries (`pseudo_queries`) come from the index alone: per site, up
   to `--per_site` nodes drawn at random, and per node three queries, its
   title, its heading path (the titles of its ancestors below the site and
   its own) and one sentence of its summary (its body where it has none) with
   the title's words taken out, half of the sentences prefixed with the
   site's title as a question names its product. Relevance: 2 for the node,
   1 for the other nodes of its page (a dev question's gold is a page, and
   `ritrag eval` credits every node of it).
2. Candidates: GetToC's top `--candidates` nodes by today's score
   (`RitragIndex.retrieve` with n = candidates, the index's recorded
   retrieval parameters); `features` describes each (query, candidate) from
   what retrieval computed (the fused score, each ranking's best chunk score,
   rank and number of chunks, the node documents' rankings) and from the
   forest (depth, size, title and path term overlap, ancestors' and
   children's scores, the share of the top candidates in its site and page).
   The features of each set of pseudo-queries are saved in `--work` and
   reused by later runs.
3. LightGBM's `LGBMRanker` (objective lambdarank), stopped early on the
   pseudo-queries of a held-out fifth of the drawn nodes. VARIANTS: the first
   is the configuration fixed before any dev question was scored; the others
   were tried after it lost, judged on half:a (which pseudo-queries, their
   sentences with half their words dropped, the model as a correction added
   to today's score through LightGBM's init_score).
4. Only then are the questions read. Each question's candidates are ordered
   by today's score and by every variant, and the first `--n` (GetToC's
   default) scored as `ritrag eval` scores the sub-forest (rank of the first
   node of any gold target; questions whose gold names no node left out):
   MRR and hit@1 overall and per half, plain RAG's (the fused chunk ranking)
   beside them.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from dataclasses import asdict, dataclass

import lightgbm
import numpy as np

from ritrag.analyzer import analyze
from ritrag.encoders import QueryEmbedder
from ritrag.evaluation.eval import GoldResolver, live_rows, load_questions, open_index
from ritrag.evaluation.metrics import first_rank, gains
from ritrag.serving.api import DEFAULT_K, DEFAULT_N, Retrieval, RitragIndex
from ritrag.serving.retrieval import Ranking, fuse, node_scores

KINDS = ("title", "path", "sentence")
HALVES = ("half:a", "half:b")
TOP = 20  # the candidates the site and page shares are counted over
VALID_SHARE = 0.2  # of the drawn nodes, whose pseudo-queries stop the training
EARLY_STOP = 50  # rounds without a better held-out nDCG (@1 or @10)
SENTENCE_WORDS = 16
MIN_SENTENCE_WORDS = 6
EMBED_BATCH = 64
# Fixed before any dev question was scored; the early stop picks the number of trees.
LGBM_PARAMS = {"objective": "lambdarank", "n_estimators": 500, "learning_rate": 0.05, "num_leaves": 15,
               "min_child_samples": 50, "subsample": 0.8, "subsample_freq": 1, "colsample_bytree": 0.8,
               "lambdarank_truncation_level": 20, "verbose": -1}
FEATURES = (
    "score", "score_rank", "score_ratio",
    "bm25", "bm25_ratio", "bm25_rank", "bm25_chunks",
    "dense", "dense_gap", "dense_rank", "dense_chunks",
    "doc_fused", "doc_bm25", "doc_bm25_ratio", "doc_bm25_rank", "doc_dense", "doc_dense_gap", "doc_dense_rank",
    "depth", "chunks", "is_page", "children_hits",
    "title_overlap", "title_coverage", "path_overlap",
    "parent_score", "ancestor_best",
    "site_share", "site_rank", "page_share",
    "query_terms",
)


@dataclass(frozen=True)
class Variant:
    kinds: tuple[str, ...] = KINDS  # the pseudo-queries trained on
    keep_words: float = 1.0  # each word of a sentence query is kept with this probability
    residual: float = 0.0  # > 0: the model corrects residual x today's score (init_score), else replaces it


VARIANTS = {
    "lambdamart": Variant(),
    "sentences only": Variant(kinds=("sentence",)),
    "words dropped": Variant(keep_words=0.5),
    "sentences only, words dropped": Variant(kinds=("sentence",), keep_words=0.5),
    "residual": Variant(residual=5.0),
    "residual, sentences only, words dropped": Variant(kinds=("sentence",), keep_words=0.5, residual=5.0),
}


@dataclass(frozen=True)
class PseudoQuery:
    text: str
    kind: str
    node: int  # the node row it was made from
    site: int  # the row of its site's root


class Forest:
    """What the features and pseudo-queries read of the index's forest, per
    node row: site root, page, depth, title terms, body chunk count."""

    def __init__(self, index: RitragIndex):
        idx = index.loaded
        sk = idx.skeleton
        self.index = index
        nodes = idx.reader.positions("nodes")  # every node row, in row order
        self.titles = nodes.column("title").to_pylist()
        self.page = np.unique(np.asarray(nodes.column("page_id").to_pylist(), dtype=object).astype(str),
                              return_inverse=True)[1]
        self.parent = sk.parent_row.astype(np.int64)
        self.depth = np.diff(sk.ancestor_indptr)
        rows = np.arange(len(self.depth))
        first = sk.ancestor_rows[np.minimum(sk.ancestor_indptr[:-1], max(len(sk.ancestor_rows) - 1, 0))]
        self.site = np.where(self.depth > 0, first, rows).astype(np.int64)
        indptr = idx.node_chunks[0]
        self.chunks = np.diff(indptr)
        has_parent = self.parent >= 0
        self.is_page = np.ones(len(rows), bool)
        self.is_page[has_parent] = self.page[self.parent[has_parent]] != self.page[has_parent]
        self._terms: dict[int, frozenset[str]] = {}

    def title_terms(self, row: int) -> frozenset[str]:
        if row not in self._terms:
            self._terms[row] = frozenset(analyze(self.titles[row] or ""))
        return self._terms[row]

    def ancestors(self, row: int) -> np.ndarray:
        sk = self.index.loaded.skeleton
        return sk.ancestor_rows[sk.ancestor_indptr[row]:sk.ancestor_indptr[row + 1]]


# ---- pseudo-queries: the index's own nodes, never a question file ----------------------------------------------

def _sentence(text: str, title: str, rng: np.random.Generator, keep_words: float) -> str | None:
    """One sentence of `text` of at least MIN_SENTENCE_WORDS words once the
    title's words are taken out, cut at SENTENCE_WORDS words, each of them
    then kept with probability `keep_words`."""
    title_words = {w.casefold() for w in re.findall(r"\w+", title)}
    sentences = [s for s in re.split(r"(?<=[.!?])\s+|\n+", text) if len(s.split()) >= MIN_SENTENCE_WORDS]
    rng.shuffle(sentences)
    for sentence in sentences:
        words = [w for w in sentence.split() if re.sub(r"\W", "", w).casefold() not in title_words]
        if len(words) >= MIN_SENTENCE_WORDS:
            words = words[:SENTENCE_WORDS]
            return " ".join(w for w, kept in zip(words, rng.random(len(words)) < keep_words) if kept) or None
    return None


def pseudo_queries(forest: Forest, per_site: int, seed: int, keep_words: float) -> list[PseudoQuery]:
    """Up to three pseudo-queries (KINDS) for each of up to `per_site` nodes
    drawn per site, from the index's node table and bodies alone."""
    idx = forest.index.loaded
    rng = np.random.default_rng(seed)
    live = live_rows(forest.index)
    drawn = []
    for site in np.unique(forest.site[live]):
        members = live[(forest.site[live] == site) & (live != site)]
        drawn += rng.choice(members, min(per_site, len(members)), replace=False).tolist()
    summaries = idx.reader.positions("nodes").column("summary").to_pylist()
    no_summary = [row for row in drawn if not (summaries[row] or "").strip()]
    bodies = {row: record["body"] or "" for row, record in idx.node_records(no_summary).items()}
    out = []
    for row in drawn:
        title, site = forest.titles[row] or "", int(forest.site[row])
        path = [forest.titles[a] or "" for a in forest.ancestors(row)[1:]] + [title]
        sentence = _sentence(summaries[row] or bodies.get(row, ""), title, rng, keep_words)
        if sentence and rng.random() < 0.5:
            sentence = f"{forest.titles[site]}: {sentence}"
        for kind, text in (("title", title), ("path", " ".join(path)), ("sentence", sentence)):
            if text and text.strip():
                out.append(PseudoQuery(text, kind, row, site))
    return out


# ---- features of (query, candidate node) ------------------------------------------------------------------------

def _per_node(ranking: Ranking, chunk_node: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per candidate row: the score and 1-based rank of its best item in
    `ranking` (NaN when none) and how many of its items the ranking holds."""
    ranked, scores = ranking
    best, rank, count = (np.full(len(rows), np.nan) for _ in range(3))
    count[:] = 0
    if len(ranked):
        nodes = chunk_node[np.asarray(ranked, np.int64)]
        unique, first, counts = np.unique(nodes, return_index=True, return_counts=True)
        at = np.searchsorted(unique, rows)
        found = (at < len(unique)) & (unique[np.minimum(at, len(unique) - 1)] == rows)
        best[found] = np.asarray(scores, np.float64)[first[at[found]]]
        rank[found] = first[at[found]] + 1
        count[found] = counts[at[found]]
    return best, rank, count


def features(forest: Forest, query: str, retrieval: Retrieval) -> tuple[np.ndarray, np.ndarray]:
    """(candidate node rows in today's order, their FEATURES matrix)."""
    idx, index = forest.index.loaded, forest.index
    rows = np.array([row for row, _ in retrieval.hits], np.int64)
    score = np.array([s for _, s in retrieval.hits], np.float64)
    n = len(rows)
    f = {"score": score, "score_rank": np.arange(1, n + 1, dtype=np.float64),
         "score_ratio": score / score[0] if n and score[0] > 0 else np.zeros(n)}
    sparse, dense = retrieval.rankings.chunks
    f["bm25"], f["bm25_rank"], f["bm25_chunks"] = _per_node(sparse, idx.chunk_node, rows)
    f["bm25_ratio"] = f["bm25"] / sparse[1][0] if len(sparse[1]) else np.full(n, np.nan)
    f["dense"], f["dense_rank"], f["dense_chunks"] = _per_node(dense, idx.chunk_node, rows)
    f["dense_gap"] = f["dense"] - dense[1][0] if len(dense[1]) else np.full(n, np.nan)
    docs = retrieval.rankings.docs  # ranked only under node_score "max+doc"
    if docs is not None:
        doc_fused = node_scores(fuse(docs, index.params), idx.chunk_node)
        f["doc_fused"] = np.array([doc_fused.get(int(r), np.nan) for r in rows])
        f["doc_bm25"], f["doc_bm25_rank"], _ = _per_node(docs[0], idx.chunk_node, rows)
        f["doc_bm25_ratio"] = f["doc_bm25"] / docs[0][1][0] if len(docs[0][1]) else np.full(n, np.nan)
        f["doc_dense"], f["doc_dense_rank"], _ = _per_node(docs[1], idx.chunk_node, rows)
        f["doc_dense_gap"] = f["doc_dense"] - docs[1][1][0] if len(docs[1][1]) else np.full(n, np.nan)
    f["depth"], f["chunks"] = forest.depth[rows].astype(np.float64), forest.chunks[rows].astype(np.float64)
    f["is_page"] = forest.is_page[rows].astype(np.float64)
    terms = frozenset(analyze(query))
    f["query_terms"] = np.full(n, float(len(terms)))
    by_row = dict(zip(rows.tolist(), score.tolist()))
    parents = forest.parent[rows]
    f["children_hits"] = np.array([float(np.sum(parents == r)) for r in rows])
    f["parent_score"] = np.array([by_row.get(int(p), np.nan) for p in parents])
    title_overlap, title_coverage, path_overlap, ancestor_best = (np.zeros(n) for _ in range(4))
    for i, row in enumerate(rows.tolist()):
        title = forest.title_terms(row)
        ancestors = forest.ancestors(row).tolist()
        path = title.union(*(forest.title_terms(a) for a in ancestors))
        title_overlap[i] = len(terms & title) / len(terms) if terms else 0.0
        title_coverage[i] = len(terms & title) / len(title) if title else 0.0
        path_overlap[i] = len(terms & path) / len(terms) if terms else 0.0
        ancestor_best[i] = max((by_row[a] for a in ancestors if a in by_row), default=np.nan)
    f.update(title_overlap=title_overlap, title_coverage=title_coverage, path_overlap=path_overlap,
             ancestor_best=ancestor_best)
    sites, pages = forest.site[rows], forest.page[rows]
    f["site_share"] = np.array([np.mean(sites[:TOP] == s) for s in sites])
    f["page_share"] = np.array([np.mean(pages[:TOP] == p) for p in pages])
    site_order = list(dict.fromkeys(sites.tolist()))  # sites by their best candidate
    f["site_rank"] = np.array([site_order.index(s) + 1.0 for s in sites.tolist()])
    return rows, np.column_stack([f.get(name, np.full(n, np.nan)) for name in FEATURES])


# ---- training and scoring ---------------------------------------------------------------------------------------

def embedded(index: RitragIndex, texts: list[str]) -> np.ndarray:
    """The query vectors of `texts`, embedded in batches of EMBED_BATCH (one at
    a time, as GetToC does, is several times slower on a busy CPU)."""
    embedder = QueryEmbedder(index.loaded.manifest.settings.index.embedder)
    return np.vstack([embedder.embed(texts[i:i + EMBED_BATCH]) for i in range(0, len(texts), EMBED_BATCH)])


def pseudo_dataset(forest: Forest, queries: list[PseudoQuery], candidates: int, k: int
                   ) -> dict[str, np.ndarray]:
    """Features, labels, group sizes, each query's node and kind, of the
    pseudo-queries whose node is among their candidates (the others teach
    nothing)."""
    vectors = embedded(forest.index, [q.text for q in queries])
    xs, ys, groups, nodes, kinds = [], [], [], [], []
    started = time.time()
    for i, (q, vector) in enumerate(zip(queries, vectors), start=1):
        if i % 500 == 0:
            print(f"pseudo-queries: {i}/{len(queries)}, {i / (time.time() - started):.1f}/s", file=sys.stderr)
        retrieval = forest.index.retrieve(q.text, k, candidates, vector)
        rows, x = features(forest, q.text, retrieval)
        label = np.where(rows == q.node, 2, np.where(forest.page[rows] == forest.page[q.node], 1, 0))
        if not len(rows) or label.max() < 2:
            continue
        xs.append(x)
        ys.append(label)
        groups.append(len(rows))
        nodes.append(q.node)
        kinds.append(q.kind)
    return {"x": np.vstack(xs), "y": np.concatenate(ys), "groups": np.array(groups), "nodes": np.array(nodes),
            "kinds": np.array(kinds)}


def held_out(nodes: np.ndarray, seed: int) -> np.ndarray:
    """Per pseudo-query: whether its node is among a random VALID_SHARE of the nodes."""
    unique = np.unique(nodes)
    return np.isin(nodes, np.random.default_rng(seed).choice(unique, int(len(unique) * VALID_SHARE), replace=False))


def of_kinds(data: dict[str, np.ndarray], kinds: tuple[str, ...]) -> dict[str, np.ndarray]:
    """The pseudo-queries of `kinds` only."""
    chosen = np.isin(data["kinds"], kinds)
    rows = np.repeat(chosen, data["groups"])
    return {"x": data["x"][rows], "y": data["y"][rows], **{key: data[key][chosen] for key in ("groups", "nodes",
                                                                                                "kinds")}}


class Ranker:
    """A trained variant: its booster and how its output is combined with today's score."""

    def __init__(self, data: dict[str, np.ndarray], held: np.ndarray, variant: Variant, seed: int):
        """LambdaMART on the pseudo-queries not `held`, stopped early on the `held` ones."""
        x, y, groups = data["x"], data["y"], data["groups"]
        row_held = np.repeat(held, groups)
        self.residual = variant.residual
        model = lightgbm.LGBMRanker(**LGBM_PARAMS, random_state=seed)
        model.fit(x[~row_held], y[~row_held], group=groups[~held], init_score=self._base(x[~row_held]),
                  eval_X=(x[row_held],), eval_y=(y[row_held],), eval_group=[groups[held]],
                  eval_init_score=[self._base(x[row_held])], eval_at=[1, 10], feature_name=list(FEATURES),
                  callbacks=[lightgbm.early_stopping(EARLY_STOP, verbose=False)])
        self.booster, self.trees = model.booster_, model.best_iteration_
        self.valid = {k: round(v, 4) for k, v in model.best_score_["valid_0"].items()}

    def _base(self, x: np.ndarray) -> np.ndarray:
        return self.residual * x[:, FEATURES.index("score")]

    def scores(self, x: np.ndarray) -> np.ndarray:
        return self.booster.predict(x, num_iteration=self.trees) + self._base(x)


def pseudo_table(ranker: Ranker, data: dict[str, np.ndarray], held: np.ndarray) -> dict:
    """Today's order and the ranker's on the held-out pseudo-queries, per kind:
    MRR and hit@1 of the first node of the query's page (label >= 1)."""
    starts = np.concatenate([[0], np.cumsum(data["groups"])])
    ranks: dict[str, list[tuple[int | None, int | None]]] = {}
    for g in np.flatnonzero(held):
        x, y = data["x"][starts[g]:starts[g + 1]], data["y"][starts[g]:starts[g + 1]]
        learned = y[np.lexsort((np.arange(len(y)), -ranker.scores(x)))]
        pair = (first_rank((y >= 1).tolist()), first_rank((learned >= 1).tolist()))
        for scope in ("all", str(data["kinds"][g])):
            ranks.setdefault(scope, []).append(pair)
    return {scope: {"fusion": _metrics([a for a, _ in pairs]), "learned": _metrics([b for _, b in pairs])}
            for scope, pairs in ranks.items()}


def ordered(rows: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """`rows` by descending score, ties in their given order."""
    return rows[np.lexsort((np.arange(len(rows)), -scores))]


def _metrics(ranks: list[int | None]) -> dict:
    return {"questions": len(ranks), "hit@1": float(np.mean([r == 1 for r in ranks])) if ranks else None,
            "mrr": float(np.mean([1.0 / r if r else 0.0 for r in ranks])) if ranks else None}


def score_questions(forest: Forest, rankers: dict[str, Ranker], questions_path: str, candidates: int, k: int,
                    n: int) -> dict:
    """Today's order, every ranker's and plain RAG's on every question whose gold resolves."""
    index = forest.index
    resolver = GoldResolver(index, live_rows(index))
    questions = [q for q in load_questions(questions_path) if any(map(resolver.resolve, q.gold))]
    per_question = []
    for q, vector in zip(questions, embedded(index, [q.question for q in questions])):
        targets = list(dict.fromkeys(rows for rows in map(resolver.resolve, q.gold) if rows))
        retrieval = index.retrieve(q.question, k, candidates, vector)
        rows, x = features(forest, q.question, retrieval)
        fused = sorted(retrieval.fused.items(), key=lambda kv: (-kv[1], kv[0]))
        ranks = {"fusion (today)": first_rank(gains(rows[:n].tolist(), targets)),
                 "plain RAG chunks": first_rank(gains(index.loaded.chunk_node[[r for r, _ in fused]].tolist(),
                                                      targets)),
                 **{name: first_rank(gains(ordered(rows, ranker.scores(x))[:n].tolist(), targets))
                    for name, ranker in rankers.items()}}
        per_question.append({"id": q.id, "tags": list(q.tags), "ranks": ranks})
    table = {system: {scope: _metrics([p["ranks"][system] for p in per_question
                                       if scope == "overall" or scope in p["tags"]])
                      for scope in ("overall", *HALVES)}
             for system in per_question[0]["ranks"]} if per_question else {}
    return {"table": table, "questions": per_question}


def markdown(table: dict, pseudo: dict[str, dict]) -> str:
    """The systems' MRR and hit@1 per scope, and on their held-out pseudo-queries."""
    scopes = ("overall", *HALVES)
    head = ["system", *(f"{scope} {metric}" for scope in scopes for metric in ("MRR", "hit@1")),
            "held-out pseudo-queries MRR (today's -> learned)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for system, row in table.items():
        cells = [f"{row[scope][metric]:.3f}" for scope in scopes for metric in ("mrr", "hit@1")]
        if system in pseudo:
            cells.append(f"{pseudo[system]['fusion']['mrr']:.3f} -> {pseudo[system]['learned']['mrr']:.3f}")
        else:
            cells.append("")
        lines.append("| " + " | ".join([system, *cells]) + " |")
    questions = {scope: row[scope]["questions"] for scope in scopes for row in table.values()}
    return "\n".join(lines) + "\n\nquestions: " + ", ".join(f"{s} {c}" for s, c in questions.items())


def pseudo_data(forest: Forest, args: argparse.Namespace, keep_words: float) -> dict[str, np.ndarray]:
    """The pseudo-queries' features, labels and groups, saved in `--work` and reused."""
    path = os.path.join(args.work, f"pseudo-{args.per_site}-{args.candidates}-{args.seed}-keep{keep_words}.npz")
    if os.path.exists(path):
        with np.load(path, allow_pickle=False) as saved:
            return dict(saved)
    data = pseudo_dataset(forest, pseudo_queries(forest, args.per_site, args.seed, keep_words), args.candidates,
                          args.k)
    np.savez_compressed(path, **data)
    return data


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--index", required=True)
    ap.add_argument("--questions", required=True, help="read only after every variant is trained")
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", required=True, help="where the pseudo-queries' features are saved and reused")
    ap.add_argument("--per_site", type=int, default=300)
    ap.add_argument("--candidates", type=int, default=200, help="candidate nodes re-ranked (k')")
    ap.add_argument("--k", type=int, default=DEFAULT_K)
    ap.add_argument("--n", type=int, default=DEFAULT_N)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model_out", default=None, help="the first variant's model as LightGBM's model text")
    args = ap.parse_args(argv)
    os.makedirs(args.work, exist_ok=True)
    started = time.time()
    index = open_index(args.index)
    forest = Forest(index)
    datasets = {keep: pseudo_data(forest, args, keep) for keep in sorted({v.keep_words for v in VARIANTS.values()})}
    rankers, trained = {}, {}
    for name, variant in VARIANTS.items():
        data = of_kinds(datasets[variant.keep_words], variant.kinds)
        held = held_out(data["nodes"], args.seed)
        rankers[name] = Ranker(data, held, variant, args.seed)
        importance = rankers[name].booster.feature_importance("gain")
        trained[name] = {"variant": asdict(variant), "pseudo_queries": len(data["groups"]),
                         "trees": rankers[name].trees, "valid": rankers[name].valid,
                         "held_out_pseudo_queries": pseudo_table(rankers[name], data, held),
                         "importance_gain": {f: round(float(g), 1) for f, g in sorted(zip(FEATURES, importance),
                                                                                       key=lambda fg: -fg[1])}}
    if args.model_out:
        next(iter(rankers.values())).booster.save_model(args.model_out)
    scored = score_questions(forest, rankers, args.questions, args.candidates, args.k, args.n)
    result = {"index": args.index, "version": index.version, "candidates": args.candidates, "k": args.k,
              "n": args.n, "lightgbm": {"version": lightgbm.__version__, "params": LGBM_PARAMS},
              "variants": trained, **scored, "seconds": round(time.time() - started)}
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=1)
    print(markdown(scored["table"], {name: t["held_out_pseudo_queries"]["all"] for name, t in trained.items()}))
    return result


if __name__ == "__main__":
    main()
