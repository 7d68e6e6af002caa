"""Inputs whose cost must stay that of their size (issue 25, items 8, 9, 10 and
the Markdown part of 14): YAML alias bombs in front matter and mkdocs.yml, reply
chains and sections nested thousands deep, WARC payloads that inflate without
end or claim more than they hold, script and style inside Markdown.

Every bomb runs in a subprocess under an address-space limit (`bounded`), so a
regression costs that subprocess, not the machine, and its peak memory is asserted.
"""
from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

from ritrag.schema import MAX_TREE_DEPTH, Crumb, PageSkeleton, Section
from ritrag.transforms.forest import build_site_forest, expand_sections
from ritrag.transforms.pages import PageParser, parse_or_dead_letter, read_file
from ritrag.transforms.parse.sections import MAX_PAGE_SECTIONS

ADDRESS_SPACE = 2 << 30  # the interpreter with Beam imported maps about 0.45 GiB
BASE = "http://localhost/"


def bounded(code: str, max_rss_mb: int, timeout_s: float = 60) -> dict:
    """Run `code` (which prints one JSON line last) in a Python subprocess under
    ADDRESS_SPACE; its output, with "rss_growth_mb": peak RSS above the RSS
    after imports, asserted under `max_rss_mb`."""
    program = textwrap.dedent('''
        import json, resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (%d, %d))
        import ritrag.transforms.pages, ritrag.transforms.forest
        def rss_mb():
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        START = rss_mb()
    ''' % (ADDRESS_SPACE, ADDRESS_SPACE)) + textwrap.dedent(code) + textwrap.dedent('''
        RESULT["rss_growth_mb"] = rss_mb() - START
        print(json.dumps(RESULT))
    ''')
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["rss_growth_mb"] < max_rss_mb, result
    return result


def parse(path: Path, root: Path):
    parser = PageParser(str(root) + "/", BASE, 1, 1 << 24)
    return parse_or_dead_letter(parser, str(path), lambda: read_file(str(path)), "parse")


# --- item 8: YAML alias bombs -------------------------------------------------

def alias_bomb(key: str, levels: int = 8) -> str:
    """`levels` anchors each naming the one before 9 times (9**levels leaves),
    then `key` aliasing the last: a few hundred bytes."""
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return "\n".join(lines + [f"{key}: *a{levels}"]) + "\n"


def test_a_front_matter_alias_bomb_is_a_dead_letter_at_the_cost_of_its_size(tmp_path):
    bomb = tmp_path / "bomb.md"
    bomb.write_text(f"---\n{alias_bomb('title')}---\n# Heading\n\nBody text.\n")
    assert bomb.stat().st_size < 600
    result = bounded(f'''
        import time
        from pathlib import Path
        from ritrag.transforms.pages import PageParser, parse_or_dead_letter, read_file
        parser = PageParser("{tmp_path}/", "{BASE}", 1, 1 << 24)
        started = time.process_time()
        letter = parse_or_dead_letter(parser, "{bomb}", lambda: read_file("{bomb}"), "parse")
        RESULT = {{"reason": letter.reason, "detail": letter.detail, "s": time.process_time() - started}}
    ''', max_rss_mb=100)
    assert result["reason"] == "refused_yaml" and "aliases expand past" in result["detail"]
    assert result["s"] < 5


def test_an_mkdocs_nav_bomb_or_loop_places_documents_by_folders(tmp_path):
    (tmp_path / "docs" / "guide").mkdir(parents=True)
    (tmp_path / "docs" / "guide" / "a.md").write_text("# A\n\ntext\n")
    for name, nav in (("bomb", alias_bomb("nav").replace("lol", "'guide/a.md'")), ("loop", "nav: &x [*x]\n"),
                      ("deep", "nav: " + "[" * 5000 + "]" * 5000 + "\n")):
        (tmp_path / "mkdocs.yml").write_text(nav)
        result = bounded(f'''
            import time
            from ritrag.transforms.pages import PageParser, parse_or_dead_letter, read_file
            path = "{tmp_path}/docs/guide/a.md"
            parser = PageParser("{tmp_path}/", "{BASE}", 1, 1 << 24)
            started = time.process_time()
            pages = parse_or_dead_letter(parser, path, lambda: read_file(path), "parse")
            RESULT = {{"methods": [p.trail_method for p in pages], "s": time.process_time() - started}}
        ''', max_rss_mb=100)
        assert result["methods"] == ["folders"] and result["s"] < 5, name


def test_front_matter_texts_are_bounded_scalars(tmp_path):
    from ritrag.transforms.sources.common import MAX_META_CHARS

    (tmp_path / "loop.md").write_text("---\ntitle: &t [*t]\n---\n# Heading\n\ntext\n")
    assert parse(tmp_path / "loop.md", tmp_path).reason == "refused_yaml"  # not a title "[[...]]"
    (tmp_path / "list.md").write_text(f"---\ntitle: [a, b]\ndescription: {'d' * 5000}\n"
                                      "tags: [x, {nested: map}, 3]\n---\n# Heading\n\ntext\n")
    [page] = parse(tmp_path / "list.md", tmp_path)
    assert page.title == "Heading" and len(page.description) == MAX_META_CHARS and page.keywords == ("x", "3")


# --- item 14: script and style in Markdown ----------------------------------------

def test_markdown_drops_script_and_style_content_like_the_html_parser(tmp_path):
    (tmp_path / "s.md").write_text(
        "# Page\n\nBefore <script>steal(document.cookie)</script> after.\n\n"
        "Styled <style>p { color: red }</style> text.\n\n"
        "Open <script>\n\nstill(script)\n\n</script> closed.\n\n"
        "<script>\nblock()\n</script>\n\nEnd.\n")
    [page] = parse(tmp_path / "s.md", tmp_path)
    assert "steal" not in page.body and "color" not in page.body and "still" not in page.body
    assert "block" not in page.body
    for kept in ("Before", "after.", "Styled", "text.", "Open", "closed.", "End."):
        assert kept in page.body


# --- item 9: trees of any depth ---------------------------------------------------

def reply_chain_topic(posts: int) -> bytes:
    """A Discourse topic whose every post replies to the one before it."""
    stream = [{"post_number": 1, "username": "op", "cooked": "<p>question</p>"}]
    stream += [{"post_number": n, "username": f"u{n}", "reply_to_post_number": n - 1, "cooked": f"<p>reply {n}</p>"}
               for n in range(2, posts + 1)]
    return json.dumps({"title": "Chain", "post_stream": {"posts": stream}}).encode()


def test_a_reply_chain_of_4000_posts_costs_its_length(tmp_path):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "chain.json").write_bytes(reply_chain_topic(4000))
    result = bounded(f'''
        import time
        from ritrag.schema import PageSkeleton
        from ritrag.transforms.forest import build_site_forest
        from ritrag.transforms.pages import PageParser, parse_or_dead_letter, read_file
        path = "{tmp_path}/t/chain.json"
        parser = PageParser("{tmp_path}/", "{BASE}", 1, 1 << 24)
        started = time.process_time()
        pages = parse_or_dead_letter(parser, path, lambda: read_file(path), "parse")
        forest = build_site_forest(pages[0].site, [PageSkeleton.of(p) for p in pages])
        depths = [p.depth for p in forest.placements]
        RESULT = {{"s": time.process_time() - started, "pages": len(pages), "max_depth": max(depths),
                  "max_trail": max(len(p.trail) for p in pages), "capped": forest.depth_capped,
                  "max_ancestors": max(len(p.ancestor_ids) for p in forest.placements)}}
    ''', max_rss_mb=300)
    assert result["pages"] == 4000 and result["s"] < 20
    assert result["max_depth"] == result["max_ancestors"] == MAX_TREE_DEPTH
    assert result["max_trail"] <= MAX_TREE_DEPTH + 2  # the folder, the topic, then at most MAX_TREE_DEPTH posts
    # The topic is at depth 1 (its folder is the site), post n at depth n until the cap: post 64 is the
    # last parent's own child, posts 65 .. 4000 are lifted to it.
    assert result["capped"] == 4000 - MAX_TREE_DEPTH


def test_a_paper_nested_5000_deep_costs_its_length(tmp_path):
    sections = [{"heading": f"S{level}", "level": level, "text": f"text {level}"} for level in range(1, 5001)]
    (tmp_path / "deep.json").write_text(json.dumps({"title": "Deep", "abstract": "A.", "sections": sections}))
    result = bounded(f'''
        from ritrag.transforms.forest import build_site_forest, expand_sections
        from ritrag.transforms.pages import PageParser, parse_or_dead_letter, read_file
        from ritrag.schema import PageSkeleton
        path = "{tmp_path}/deep.json"
        [page] = parse_or_dead_letter(PageParser("{tmp_path}/", "{BASE}", 1, 1 << 24), path,
                                      lambda: read_file(path), "parse")
        placed = [p for p in build_site_forest(page.site, [PageSkeleton.of(page)]).placements if p.url == page.url][0]
        nodes, capped = expand_sections(placed, page.sections)
        RESULT = {{"nodes": len(nodes), "capped": capped, "max_depth": max(n.depth for n, _ in nodes),
                  "max_path": max(len(s.path) for s in page.sections), "texts": sum(bool(t) for _, t in nodes),
                  "past_cap": page.sections_past_cap, "last_text": nodes[-1][1]}}
    ''', max_rss_mb=150)
    # The page keeps MAX_PAGE_SECTIONS sections; the deeper ones join the last kept, their text with them.
    assert result["nodes"] == result["texts"] == MAX_PAGE_SECTIONS and result["past_cap"] == 5001 - MAX_PAGE_SECTIONS
    assert result["last_text"].endswith("S5000\n\ntext 5000")  # no text lost
    assert result["max_depth"] == MAX_TREE_DEPTH and result["max_path"] == MAX_TREE_DEPTH
    # the page is its site's root: level n at depth n until the cap
    assert result["capped"] == MAX_PAGE_SECTIONS - 1 - MAX_TREE_DEPTH


def test_the_forest_hangs_what_is_deeper_than_the_cap_from_the_last_parent_in_document_order():
    site = "http://d.example/s"
    pages = [PageSkeleton(f"{site}/p{i:03d}", f"{site}/p{i:03d}", site, f"P{i}",
                          (Crumb(f"P{i - 1}", f"{site}/p{i - 1:03d}"),) if i else (), "up")
             for i in range(100)]  # p0 under the root, each next under the one before: parent-only trails
    pages.append(PageSkeleton(f"{site}/p070a", f"{site}/p070a", site, "side", (Crumb("P70", f"{site}/p070"),), "up"))
    forest = build_site_forest(site, pages)
    by_title = {p.title: p for p in forest.placements}
    last_parent = by_title[f"P{MAX_TREE_DEPTH - 2}"]  # p0 is at depth 1
    assert last_parent.depth == MAX_TREE_DEPTH - 1
    below = sorted((p for p in forest.placements if p.parent_id == last_parent.node_id), key=lambda p: p.position)
    # depth first, siblings in URL order: P63 .. P70, then P70's children: "side" (p070a), then P71 and below
    assert [p.title for p in below] == [f"P{i}" for i in range(MAX_TREE_DEPTH - 1, 71)] + ["side"] + [
        f"P{i}" for i in range(71, 100)]
    assert {p.depth for p in below} == {MAX_TREE_DEPTH}
    assert forest.depth_capped == len(below) - 1 and max(len(p.ancestor_ids) for p in forest.placements) == MAX_TREE_DEPTH


def test_sections_past_the_cap_hang_from_the_last_parent_and_a_page_at_the_cap_keeps_their_text():
    site = "http://d.example/s"
    pages = [PageSkeleton(f"{site}/p{i:03d}", f"{site}/p{i:03d}", site, f"P{i}",
                          (Crumb(f"P{i - 1}", f"{site}/p{i - 1:03d}"),) if i else (), "up") for i in range(70)]
    placed = {p.title: p for p in build_site_forest(site, pages).placements}
    sections = (Section("P", 0, "", "intro"), *(Section(f"H{level}", level, f"h{level}", f"t{level}")
                                                for level in range(1, 7)))
    near = placed[f"P{MAX_TREE_DEPTH - 4}"]  # depth MAX - 3: room for two levels of sections
    nodes, capped = expand_sections(near, sections)
    assert [n.depth - near.depth for n, _ in nodes] == [0, 1, 2, 3, 3, 3, 3] and capped == 3
    assert [n.position for n, _ in nodes[3:]] == [0, 1, 2, 3]  # under H2, in document order
    at_cap = placed["P69"]
    assert at_cap.depth == MAX_TREE_DEPTH
    nodes, capped = expand_sections(at_cap, sections)
    assert nodes == [(at_cap, "intro\n\nt1\n\nt2\n\nt3\n\nt4\n\nt5\n\nt6")] and capped == 6


# --- item 10: WARC payloads ---------------------------------------------------------

def warc_record(url: str, http_headers: list[tuple[str, str]], payload: bytes) -> bytes:
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    out = io.BytesIO()
    writer = WARCWriter(out, gzip=True)
    writer.write_record(writer.create_warc_record(
        url, "response", payload=io.BytesIO(payload),
        http_headers=StatusAndHeaders("200 OK", http_headers, protocol="HTTP/1.1")))
    return out.getvalue()


def gzip_of_zeros(size: int) -> bytes:
    squeeze = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = b"\0" * (1 << 20)
    return b"".join(squeeze.compress(block) for _ in range(size >> 20)) + squeeze.flush()


def test_a_warc_payload_inflating_to_300_mib_is_too_large_without_being_inflated(tmp_path):
    bomb = warc_record("http://h/bomb.html", [("Content-Type", "text/html"), ("Content-Encoding", "gzip")],
                       gzip_of_zeros(300 << 20))
    page = warc_record("http://h/ok.html", [("Content-Type", "text/html")], b"<html><p>fine</p></html>")
    (tmp_path / "bomb.warc.gz").write_bytes(bomb + page)
    assert len(bomb) < 400_000
    result = bounded(f'''
        from ritrag.transforms.sources.warc import read_warc_pages, read_record
        out = list(read_warc_pages("{tmp_path}/bomb.warc.gz", 1 << 20))
        again = read_record(out[0].source, 1 << 20)
        RESULT = {{"out": [(type(o).__name__, getattr(o, "reason", getattr(o, "url", ""))) for o in out],
                  "again": again.reason}}
    ''', max_rss_mb=200)
    assert result["out"] == [["DeadLetter", "too_large"], ["WarcPage", "http://h/ok.html"]]
    assert result["again"] == "too_large"


def test_a_warc_record_claiming_more_bytes_than_it_holds_is_dead_lettered(tmp_path):
    from ritrag.transforms.sources.warc import read_warc_pages

    block = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n\r\n<html><p>short</p></html>"
    record = (b"WARC/1.1\r\nWARC-Type: response\r\nWARC-Target-URI: http://h/a.html\r\n"
              b"WARC-Record-ID: <urn:uuid:12345678-1234-5678-1234-567812345678>\r\n"
              b"WARC-Date: 2024-01-01T00:00:00Z\r\nContent-Type: application/http; msgtype=response\r\n"
              b"Content-Length: 1000000000000000\r\n\r\n" + block)
    for name, data in (("plain.warc", record), ("packed.warc.gz", gzip.compress(record))):
        (tmp_path / name).write_bytes(data)
        [letter] = read_warc_pages(str(tmp_path / name), 1 << 20)
        assert (letter.reason, letter.source.endswith("#0")) == ("bad_warc", True), name
        assert "truncated" in letter.detail, name
