"""End-to-end: build an index with the Beam job, then ask it GetToC and Read."""
from __future__ import annotations

import json
import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ritrag.embedder import EmbedderSpec, load_tokenizer, model_token_limit
from ritrag.layout import DamagedIndexError, IndexLayout
from ritrag.reader import IndexReader
from ritrag.representation import ANCHOR_DOC_ORDINAL, NODE_DOC_ORDINAL
from ritrag.serving.api import RitragIndex
from ritrag.serving.retrieval import RetrievalParams
from ritrag.vectors import VectorStore
from support import BASE, assert_same_toc, build_index

pytestmark = pytest.mark.slow


def table(index_dir, kind):
    layout = IndexLayout(str(index_dir))
    manifest = layout.load_manifest()
    seg = manifest.segments[0]
    files = [os.path.join(layout.segment_dir(seg["id"]), n) for n in layout.segment_files(seg, kind)]
    return pa.concat_tables([pq.read_table(f) for f in files])


def walk(tree, parents=()):
    yield tree, parents
    for child in tree.get("children", []):
        yield from walk(child, parents + (tree,))


@pytest.fixture(scope="module")
def tiny(tiny_index):
    return RitragIndex(str(tiny_index))


def test_pages_are_placed_under_their_breadcrumbs(tiny_index):
    nodes = table(tiny_index, "nodes").to_pylist()
    by_url = {n["url"]: n for n in nodes}
    deploy = by_url[f"{BASE}/shop/v3/guide/deploy.html"]
    assert deploy["ancestor_titles"] == ["Shop Server", "Version 3", "Guides"]
    guides = [n for n in nodes if n["title"] == "Guides"][0]
    assert guides["kind"] == "virtual" and guides["body"] == ""
    configs = [n for n in nodes if n["title"] == "Configuring the server"]
    assert sorted(c["ancestor_titles"][-1] for c in configs) == ["Version 2", "Version 3"]
    for n in nodes:  # every ancestor chain is consistent with the parents
        if n["parent_id"]:
            parent = next(p for p in nodes if p["node_id"] == n["parent_id"])
            assert n["ancestor_ids"] == parent["ancestor_ids"] + [parent["node_id"]]


def test_every_input_page_is_accounted_for(tiny_index):
    manifest = IndexLayout(str(tiny_index)).load_manifest()
    pages = manifest.stats["pages"]
    assert pages["pages_read"] == 7
    assert pages["pages_indexed"] + pages["pages_dead_lettered"] + pages["pages_merged_duplicates"] == 7


def test_chunks_stay_inside_their_node_and_under_the_limit(sample_index):
    nodes = {n["node_id"]: n for n in table(sample_index, "nodes").to_pylist()}
    rows = table(sample_index, "chunks").to_pylist()
    # Anchor documents (ordinal -2: other pages' words for a node) are not embedded: no limit holds them.
    chunks = [c for c in rows if c["ordinal"] != ANCHOR_DOC_ORDINAL]
    assert len(chunks) < len(rows)
    tokenizer = load_tokenizer(EmbedderSpec())
    limit = model_token_limit(EmbedderSpec(), tokenizer)
    assert len(chunks) > 300
    squash = lambda s: "".join(s.split())
    for c in chunks:
        assert 0 < c["n_tokens"] <= limit  # tokens of what the model embeds (the representation's text)
        if c["ordinal"] == -1:  # the node's own document: its path, summary, keywords
            continue
        node = nodes[c["node_id"]]
        title, _, passage = c["text"].partition("\n")
        assert title == node["title"].strip()
        assert squash(passage) in squash(node["body"])  # text of this node only
    recount = tokenizer([c["text"] for c in chunks[:500]], add_special_tokens=False)["input_ids"]
    assert max(map(len, recount)) <= limit


def test_get_toc_hits_come_with_all_ancestors_and_no_body(tiny):
    toc = tiny.get_toc("which port does version 3 listen on", n=5)
    assert toc["hits"] == 5
    seen_hits = 0
    nodes = tiny.loaded.nodes
    for tree in toc["trees"]:
        for entry, parents in walk(tree):
            assert set(entry) <= {"id", "title", "summary", "keywords", "hit", "score", "children"}
            if entry["hit"]:
                seen_hits += 1
                row = tiny.loaded.node_row[entry["id"]]
                assert [p["id"] for p in parents] == nodes["ancestor_ids"][row]
    assert seen_hits == 5
    best = max((e for t in toc["trees"] for e, _ in walk(t) if e["hit"]), key=lambda e: e["score"])
    assert tiny.read([best["id"]])["nodes"][0]["path"][-1] == "Version 3"
    assert "9443" not in json.dumps(toc)  # no body text in the ToC


def test_children_keep_document_order(sample_index):
    index = RitragIndex(str(sample_index))
    toc = index.get_toc("server configuration directives", n=50)
    nodes = index.loaded.nodes
    for tree in toc["trees"]:
        for entry, _ in walk(tree):
            positions = [nodes["position"][index.loaded.node_row[c["id"]]] for c in entry.get("children", [])]
            assert positions == sorted(positions)


def test_read_returns_bodies_and_reports_unknown_ids(tiny):
    toc = tiny.get_toc("log rotation", n=3)
    hit = next(e for t in toc["trees"] for e, _ in walk(t) if e["hit"])
    result = tiny.read([hit["id"], "nosuchnode00"], max_chars=20)
    assert result["unknown_ids"] == ["nosuchnode00"]
    (node,) = result["nodes"]
    assert node["title"] and node["url"].startswith(BASE)
    assert len(node["text"]) == 20 and node["next_offset"] == 20
    rest = tiny.read([hit["id"]], max_chars=10_000, offset=20)["nodes"][0]
    assert node["text"] + rest["text"] == tiny.read([hit["id"]])["nodes"][0]["text"]
    assert "next_offset" not in rest


def test_two_builds_of_the_same_input_are_identical(tiny_site, tiny_index, tmp_path):
    build_index(tiny_site, tmp_path / "again")
    for kind in ("nodes", "chunks", "postings"):
        assert table(tiny_index, kind).equals(table(tmp_path / "again", kind)), kind
    first = IndexLayout(str(tiny_index)).load_manifest().segments[0]["files"]
    second = IndexLayout(str(tmp_path / "again")).load_manifest().segments[0]["files"]
    for name in first:
        if name.endswith(".parquet"):
            assert first[name]["sha256"] == second[name]["sha256"], name


@pytest.mark.parametrize("kind", ["nodes", "serving", "dense", "edges"])
def test_a_damaged_file_is_refused_with_its_name(tiny_index, tmp_path, kind):
    """Every file a load reads is checked (the chunk and postings tables are
    the jobs' to read: a server maps the serving files made of them)."""
    copy = tmp_path / "damaged"
    shutil.copytree(tiny_index, copy)
    layout = IndexLayout(str(copy))
    seg = layout.load_manifest().segments[0]
    victim = os.path.join(layout.segment_dir(seg["id"]), layout.segment_files(seg, kind)[0])
    with open(victim, "r+b") as fh:
        fh.seek(100)
        fh.write(b"\xff\xff\xff\xff")
    with pytest.raises(DamagedIndexError, match=os.path.basename(victim)):
        RitragIndex(str(copy))


def test_section_granularity_makes_heading_sections_nodes(tiny_site, tmp_path):
    build_index(tiny_site, tmp_path / "sections", "--granularity", "section")
    nodes = table(tmp_path / "sections", "nodes").to_pylist()
    config = [n for n in nodes if n["url"] == f"{BASE}/shop/v3/config.html"][0]
    sections = sorted((n for n in nodes if n["parent_id"] == config["node_id"]), key=lambda n: n["position"])
    assert [(s["kind"], s["title"]) for s in sections] == [("section", "Ports"), ("section", "TLS")]
    assert sections[0]["body"] == "Version 3 listens on port 9443 with QUIC enabled."
    assert sections[0]["ancestor_titles"] == ["Shop Server", "Version 3", "Configuring the server"]
    assert sections[1]["url"] == f"{BASE}/shop/v3/config.html#s1"
    assert "9443" not in config["body"]  # each piece of text belongs to exactly one node
    toc = RitragIndex(str(tmp_path / "sections")).get_toc("QUIC port", n=1)
    (hit,) = [e for t in toc["trees"] for e, _ in walk(t) if e["hit"]]
    assert hit["title"] == "Ports"


def test_inspect_reports_methods_depths_and_fanouts(tiny_index, tmp_path):
    from ritrag.cli import main
    from ritrag.evaluation.forest_report import forest_report, render_html

    report = forest_report(str(tiny_index))
    (site,) = report["sites"].values()
    assert site["pages"] == 7 and site["virtual"] == 1
    assert site["methods"]["jsonld"] == 6 and site["placed_by_markup"] == 1.0
    assert site["depths"] == {0: 1, 1: 2, 2: 3, 3: 1}
    assert site["fanouts"][0][:2] == (3, "Version 3")
    assert "<svg" in render_html(report)
    assert main(["inspect", str(tiny_index), "--html", str(tmp_path / "r.html")]) == 0
    assert (tmp_path / "r.html").read_text().startswith("<!doctype html>")


def bm25_scores(index: RitragIndex, query: str) -> dict[int, float]:
    from ritrag.analyzer import analyze
    from ritrag.bm25 import top_k

    rows, scores = top_k(index.loaded.bm25.scores(analyze(query), "body"), 200)
    return {int(index.loaded.chunk_ids[r]): round(float(s), 5) for r, s in zip(rows, scores)}


def test_four_shards_answer_like_one(tiny_site, tiny_index, tmp_path):
    build_index(tiny_site, tmp_path / "sharded", "--num_shards", "4")
    one, four = RitragIndex(str(tiny_index)), RitragIndex(str(tmp_path / "sharded"))
    layout = IndexLayout(str(tmp_path / "sharded"))
    assert len(layout.segment_files(layout.load_manifest().segments[0], "postings")) == 4
    for query in ("which port does version 3 listen on", "log rotation", "TLS certificates vault"):
        assert bm25_scores(one, query) == bm25_scores(four, query)
        assert one.get_toc(query)["trees"] == four.get_toc(query)["trees"]


def test_reranked_ivf_answers_like_the_exact_index(tiny_site, tiny_index, tmp_path):
    build_index(tiny_site, tmp_path / "ivf", "--dense_factory", "IVF1,SQ8", "--dense_rerank", "4")
    exact, ivf = RitragIndex(str(tiny_index)), RitragIndex(str(tmp_path / "ivf"))
    assert ivf.loaded.vector_store is not None and exact.loaded.vector_store is None
    for query in ("which port does version 3 listen on", "log rotation", "TLS certificates vault"):
        assert ivf.get_toc(query)["trees"] == exact.get_toc(query)["trees"]


def embedded_rows(index_dir) -> dict[int, int]:
    """Chunk id -> chunks-table ordinal of every row the index holds a vector of."""
    chunks = table(index_dir, "chunks")
    ordinal = dict(zip(chunks["chunk_id"].to_pylist(), chunks["ordinal"].to_pylist()))
    store = VectorStore.open([f.path for f in IndexReader(str(index_dir)).files("vectors")])
    return {int(i): ordinal[int(i)] for shard in store.shards for i in shard.ids}


def test_node_documents_get_vectors_only_with_node_doc_vectors(tiny_site, tiny_index, tmp_path):
    """By default the dense index holds the chunks alone (the default node score
    never fuses node documents' dense ranking); --node_doc_vectors on embeds node
    documents too, and on an exact index the default node score answers alike."""
    build_index(tiny_site, tmp_path / "docvec", "--node_doc_vectors", "on")
    chunks = table(tiny_index, "chunks")
    ordinals = dict(zip(chunks["chunk_id"].to_pylist(), chunks["ordinal"].to_pylist()))
    assert NODE_DOC_ORDINAL in ordinals.values()  # node documents are rows (BM25) all the same
    assert embedded_rows(tiny_index) == {c: o for c, o in ordinals.items() if o >= 0}
    assert embedded_rows(tmp_path / "docvec") == {c: o for c, o in ordinals.items() if o >= NODE_DOC_ORDINAL}
    config = IndexLayout(str(tmp_path / "docvec")).load_manifest().config
    assert config["representation"]["node_doc_vectors"] is True
    default, docvec = RitragIndex(str(tiny_index)), RitragIndex(str(tmp_path / "docvec"))
    for query in ("which port does version 3 listen on", "log rotation", "TLS certificates vault"):
        assert docvec.get_toc(query)["trees"] == default.get_toc(query)["trees"]
        # "max+doc" without node-document vectors fuses their BM25 ranking alone
        assert default.get_toc(query, params=RetrievalParams(node_score="max+doc"))["hits"] > 0


def test_multi_process_local_runner_builds_the_same_index(tiny_site, tiny_index, tmp_path):
    build_index(tiny_site, tmp_path / "mp", "--direct_running_mode", "multi_processing",
                "--direct_num_workers", "2", "--embed_cpu_threads", "1")
    for kind in ("nodes", "chunks", "postings"):
        assert table(tiny_index, kind).equals(table(tmp_path / "mp", kind)), kind
    query = "which port does version 3 listen on"
    assert_same_toc(RitragIndex(str(tmp_path / "mp")).get_toc(query)["trees"],
                    RitragIndex(str(tiny_index)).get_toc(query)["trees"])


def test_a_page_changed_between_the_two_reads_is_dead_lettered_not_lost(tiny_site, tmp_path):
    import apache_beam as beam

    from ritrag.transforms.nodes import PAGES_OUTPUT, NodeRowsFn
    from ritrag.transforms.pages import DEAD, PageParser, read_file
    from ritrag.schema import NodePlacement, PageSource

    path = str(tmp_path / "page.html")
    shutil.copy(next(str(p) for p in sorted(tiny_site.rglob("*.html"))), path)
    parser = PageParser(str(tmp_path) + "/", BASE, 0, 1 << 20)
    [page] = parser.parse(path, read_file(path))
    placement = NodePlacement("n1", None, page.site, "page", 0, 0, page.title, page.url, (), (), "url")
    fn = NodeRowsFn("page")

    def outputs():
        tagged = {}
        for out in fn.process((page.url, {"placement": [placement], "page": [PageSource.of(page)]}), parser):
            tag = out.tag if isinstance(out, beam.pvalue.TaggedOutput) else "nodes"
            tagged.setdefault(tag, []).append(out.value if tag != "nodes" else out)
        return tagged

    unchanged = outputs()
    assert [r.body for r in unchanged["nodes"]] == [page.body] and len(unchanged[PAGES_OUTPUT]) == 1
    with open(path, "ab") as fh:
        fh.write(b"<p>edited while the build ran</p>")
    changed = outputs()
    assert [d.reason for d in changed[DEAD]] == ["changed_during_build"]
    assert PAGES_OUTPUT not in changed and [r.body for r in changed["nodes"]] == [""]


def test_progress_lines_give_count_rate_eta_and_memory():
    from ritrag.transforms.progress import progress_line, resident_bytes

    line = progress_line("parse (pages)", 250, 10.0, 1000, 3 * 2 ** 29)
    assert line == "parse (pages): 250 in 10 s (25.0/s), 25.0% of 1,000, ETA 0m30s, worker RSS 1.50 GiB"
    assert progress_line("embed (chunks)", 5, 0.0, None) == "embed (chunks): 5 in 0 s (0.0/s)"
    assert resident_bytes() is None or resident_bytes() > 2 ** 20


def test_progress_lines_rate_and_eta_follow_the_last_interval():
    from ritrag.transforms.progress import ProgressMeter

    meter = ProgressMeter("forest (nodes)", 1000)
    assert meter.line(5.0) is None  # nothing seen yet: nothing to say
    meter.add(100.0, 10)  # a slow start: 10 in the first 200 s
    first = meter.line(300.0)
    assert first.startswith("forest (nodes): 10 in 200 s (0.05/s), 1.0% of 1,000, ETA 5h30m")
    meter.add(310.0, 590)  # then 590 in the next 30 s
    second = meter.line(330.0)
    assert second.startswith("forest (nodes): 600 in 230 s, 19.7/s over the last 30 s (2.6/s overall), "
                             "60.0% of 1,000, ETA 0m20s")
    assert meter.line(360.0).startswith("forest (nodes): 600 in 260 s, 0.0/s over the last 30 s")


def dead_letters(index_dir) -> dict[str, str]:
    """Dead letters of the live version's last segment: file name -> reason."""
    layout = IndexLayout(str(index_dir))
    seg = layout.load_manifest().segments[-1]
    rows = pq.read_table(os.path.join(layout.segment_dir(seg["id"]), "dead_letters.parquet")).to_pylist()
    return {os.path.basename(r["source"]): r["reason"] for r in rows}


def hostile_input(tiny_site, tmp_path):
    """The tiny site plus a link to a file outside it, a link to a folder
    outside it, a FIFO (which blocks whoever opens it for reading), and links
    to nothing, inside and outside it (which Beam's listing drops)."""
    site = tmp_path / "site"
    shutil.copytree(tiny_site, site)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.html").write_text("<html><title>Secret</title><p>zanzibarpassword</p></html>")
    os.symlink(outside / "secret.html", site / "shop" / "leak.html")
    os.symlink(outside, site / "shop" / "linked")
    os.mkfifo(site / "shop" / "pipe.html")
    os.symlink(site / "shop" / "moved.html", site / "shop" / "dangling.html")
    os.symlink(outside / "gone.html", site / "shop" / "gone.html")
    return site


@pytest.mark.timeout(300)
def test_links_outside_the_input_and_special_files_are_dead_letters_not_read(tiny_site, tmp_path):
    site = hostile_input(tiny_site, tmp_path)
    build_index(site, tmp_path / "idx", "--embedding_model", "hashing:384")
    letters = dead_letters(tmp_path / "idx")
    assert letters == {"leak.html": "outside_input", "pipe.html": "not_regular_file", "dangling.html": "unreadable",
                       "gone.html": "outside_input"}
    assert not any("zanzibarpassword" in body for body in table(tmp_path / "idx", "nodes")["body"].to_pylist())
    # explicitly allowed, the link is followed (the FIFO and the links to nothing stay refused)
    build_index(site, tmp_path / "allowed", "--embedding_model", "hashing:384", "--follow_links_outside_input")
    assert dead_letters(tmp_path / "allowed") == {"pipe.html": "not_regular_file", "dangling.html": "unreadable",
                                                  "gone.html": "unreadable"}
    toc = RitragIndex(str(tmp_path / "allowed")).get_toc("zanzibarpassword")
    assert any(n["title"] == "Secret" for t in toc["trees"] for n, _ in walk(t))


def test_a_second_job_on_an_index_fails_fast_naming_the_holder(tiny_site, tmp_path):
    from ritrag.lease import IndexLease, IndexLockedError

    out = tmp_path / "idx"
    layout = IndexLayout(str(out))
    with IndexLease(layout, "update") as lease:
        lease.claim_segment("seg-v000001")
        os.makedirs(layout.segment_dir("seg-v000001"))
        (out / "segments" / "seg-v000001" / "in-progress").write_text("the live job's file")
        with pytest.raises(IndexLockedError, match=f"held by update \\(pid {os.getpid()} .*seg-v000001"):
            build_index(tiny_site, out, "--embedding_model", "hashing:384")
        with pytest.raises(IndexLockedError):
            IndexLease(layout, "rollback").acquire()
        # the live job's segment was not taken for debris
        assert (out / "segments" / "seg-v000001" / "in-progress").exists()
    assert not (out / "LEASE").exists()
    os.unlink(out / "segments" / "seg-v000001" / "in-progress")  # now debris of a job that did not publish
    assert build_index(tiny_site, out, "--embedding_model", "hashing:384") == "v000001"
    assert not (out / "LEASE").exists()


def test_a_stale_lease_is_taken_over_and_a_foreign_one_only_with_break_lock(tiny_site, tmp_path):
    import socket
    import subprocess

    from ritrag.lease import IndexLockedError

    out = tmp_path / "idx"
    out.mkdir()
    gone = subprocess.Popen(["true"])
    gone.wait()
    lease = {"owner": "build", "pid": gone.pid, "host": socket.gethostname(), "started": 0, "token": "x",
             "segment": "seg-v000001"}
    (out / "LEASE").write_text(json.dumps(lease))
    assert build_index(tiny_site, out, "--embedding_model", "hashing:384") == "v000001"
    (out / "LEASE").write_text(json.dumps({**lease, "host": "another-host"}))
    with pytest.raises(IndexLockedError, match="another-host"):
        build_index(tiny_site, out, "--embedding_model", "hashing:384")
    assert build_index(tiny_site, out, "--embedding_model", "hashing:384", "--break_lock") == "v000002"
