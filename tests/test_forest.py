from ritrag.ids import node_id_for
from ritrag.urls import normalize_url
from ritrag.schema import Crumb, PageSkeleton, Section
from ritrag.transforms.forest import build_site_forest, expand_sections

SITE = "http://docs.example/prod"


def page(path: str, title: str, *trail: tuple[str, str | None], method: str = "jsonld",
         canonical: str | None = None, nav: tuple[str, ...] = ()) -> PageSkeleton:
    url = f"{SITE}/{path}" if path else SITE
    crumbs = tuple(Crumb(t, None if u is None else f"{SITE}/{u}".rstrip("/")) for t, u in trail)
    return PageSkeleton(url, canonical or url, SITE, title, crumbs, method, nav)


def by_title(forest):
    return {p.title: p for p in forest.placements}


def test_ancestors_follow_the_breadcrumb_of_the_parent():
    forest = build_site_forest(SITE, [
        page("", "Home"),
        page("guide", "Guide", ("Home", "")),
        page("guide/install", "Install", ("Home", ""), ("Guide", "guide")),
        page("guide/install/linux", "Linux", ("Guide", "guide"), ("Install", "guide/install")),
    ])
    nodes = by_title(forest)
    assert nodes["Home"].parent_id is None and nodes["Home"].kind == "page"
    assert nodes["Linux"].ancestor_titles == ("Home", "Guide", "Install")
    assert nodes["Linux"].ancestor_ids == tuple(nodes[t].node_id for t in ("Home", "Guide", "Install"))
    assert nodes["Linux"].depth == 3
    assert nodes["Install"].parent_id == nodes["Guide"].node_id


def test_parent_only_trails_resolve_into_full_chains():
    forest = build_site_forest(SITE, [
        page("a", "A", method="up_link"),
        page("a/b", "B", ("A", "a"), method="up_link"),
        page("a/b/c", "C", ("B", "a/b"), method="up_link"),
    ])
    nodes = by_title(forest)
    assert nodes["C"].ancestor_titles == ("prod", "A", "B")
    assert nodes["prod"].kind == "site"


def test_trail_entries_outside_the_corpus_become_virtual_nodes():
    forest = build_site_forest(SITE, [
        page("x/y/p1", "P1", ("Manual", "x"), ("Chapter", "x/y")),
        page("x/y/p2", "P2", ("Manual", "x"), ("Chapter", "x/y")),
        page("x/q", "Q", ("Manual", "x"), ("Unlinked label", None)),
    ])
    nodes = by_title(forest)
    assert nodes["Manual"].kind == "virtual" and nodes["Chapter"].kind == "virtual"
    assert nodes["P1"].parent_id == nodes["P2"].parent_id == nodes["Chapter"].node_id
    assert nodes["Unlinked label"].url is None
    assert nodes["Q"].ancestor_titles == ("prod", "Manual", "Unlinked label")


def test_virtual_node_id_is_scoped_by_site_but_page_ids_are_not():
    forest = build_site_forest(SITE, [page("a", "A", ("Elsewhere", "../other/x"))])
    nodes = by_title(forest)
    assert nodes["A"].node_id == node_id_for(f"{SITE}/a")
    assert nodes["Elsewhere"].node_id != node_id_for(f"{SITE}/../other/x")


def test_cycles_are_broken_deterministically():
    pages = [page("a", "A", ("B", "b")), page("b", "B", ("C", "c")), page("c", "C", ("A", "a"))]
    first = build_site_forest(SITE, pages)
    second = build_site_forest(SITE, list(reversed(pages)))
    assert first.broken_cycles == 1
    assert first.placements == second.placements
    nodes = by_title(first)
    assert nodes["A"].parent_id == nodes["prod"].node_id  # smallest member re-attached
    assert all(len(p.ancestor_ids) == p.depth for p in first.placements)


def test_canonical_duplicates_merge_into_the_canonical_page():
    forest = build_site_forest(SITE, [
        page("a", "A"),
        page("a-copy", "A again", canonical=f"{SITE}/a"),
        page("b", "B", canonical=f"{SITE}/elsewhere"),  # canonical not in corpus: kept
    ])
    assert forest.merged == {f"{SITE}/a-copy": f"{SITE}/a"}
    assert {p.title for p in forest.placements} == {"prod", "A", "B"}


def test_siblings_follow_the_parent_navigation_then_url_order():
    forest = build_site_forest(SITE, [
        page("", "Home", nav=(f"{SITE}/zeta", f"{SITE}/alpha")),
        page("alpha", "Alpha", ("Home", "")),
        page("beta", "Beta", ("Home", "")),
        page("zeta", "Zeta", ("Home", "")),
    ])
    nodes = by_title(forest)
    order = sorted(["Alpha", "Beta", "Zeta"], key=lambda t: nodes[t].position)
    assert order == ["Zeta", "Alpha", "Beta"]


def test_forest_is_independent_of_input_order():
    pages = [page("", "Home"), page("a", "A", ("Home", "")), page("a/b", "B", ("A", "a")),
             page("c", "C", ("Virtual", "v"))]
    assert build_site_forest(SITE, pages).placements == build_site_forest(SITE, pages[::-1]).placements


def test_sections_nest_by_heading_level_and_skipped_levels_keep_text():
    placed = by_title(build_site_forest(SITE, [page("p", "Page")]))["Page"]
    sections = (
        Section("Page", 0, "", "intro"),
        Section("Install", 2, "install", "install text"),
        Section("Deep", 4, "deep", "deep text"),  # h2 -> h4 jump
        Section("Usage", 2, "usage", "usage text"),
    )
    nodes, capped = expand_sections(placed, sections)
    (page_node, intro), (install, t1), (deep, t2), (usage, t3) = nodes
    assert capped == 0
    assert intro == "intro" and page_node == placed
    assert deep.parent_id == install.node_id and deep.depth == placed.depth + 2
    assert usage.parent_id == placed.node_id and (install.position, usage.position) == (0, 1)
    assert deep.ancestor_titles == placed.ancestor_titles + ("Page", "Install")
    assert [t1, t2, t3] == ["install text", "deep text", "usage text"]
    assert deep.url == f"{SITE}/p#deep"


def test_index_files_stand_for_their_directory_but_default_html_is_a_page():
    assert normalize_url("https://Docs.Example.com:443/a/b/index.html#x") == "https://docs.example.com/a/b"
    assert normalize_url("https://docs.example.com/a/b/") == "https://docs.example.com/a/b"
    # Two real pages side by side (auth/index.html and auth/default.html) must stay two.
    assert normalize_url("https://docs.example.com/auth/default.html") != normalize_url("https://docs.example.com/auth/index.html")


def test_node_rows_from_the_spill_are_those_of_the_second_parse(tmp_path):
    # The build keeps each parsed page in a spill file for its node rows; the
    # update reads and parses it again. Both must give the same rows.
    import json

    import apache_beam as beam

    from support import SAMPLE
    from ritrag.transforms.nodes import PAGES_OUTPUT, BuildForestNodes
    from ritrag.transforms.pages import PageParser, ParsePages, ReadInput, input_root_and_pattern
    from ritrag.transforms.tables import spill_location

    root, pattern = input_root_and_pattern(str(SAMPLE))
    parser = PageParser(root, "https://docs.example.com/", 1, 1 << 20)

    def node_and_page_rows(spill_dir):
        out = tmp_path / f"rows-{spill_dir is not None}.json"
        with beam.Pipeline() as p:
            forest = ((p | ReadInput(pattern, parser) | ParsePages(parser))["pages"]
                      | BuildForestNodes(parser, "section", spill_dir=spill_dir))
            ((forest["nodes"], forest[PAGES_OUTPUT])
             | beam.Flatten() | beam.Map(lambda row: json.dumps(row, sort_keys=True))
             | beam.combiners.ToList() | beam.Map(lambda rows: out.write_text("\n".join(sorted(rows)))))
        return out.read_text().splitlines()

    spilled = node_and_page_rows(spill_location(str(tmp_path / "segment"), "pages"))
    assert list((tmp_path / "segment" / ".spill" / "pages").iterdir())  # the pages went through the spill
    assert len(spilled) > 300
    assert spilled == node_and_page_rows(None)
