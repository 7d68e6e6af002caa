"""The forest stage: parsed pages -> node rows, placed per site.

Only skeletons (`PageSkeleton`: URL, title, trail) are grouped by site and
placed by `ritrag.transforms.forest.build_site_forest`; each placement is then joined
by URL with the sources of the pages parsed there, and the page indexed is
read back from the spill file of its first parse (`SpillPagesFn`), or, without
a spill folder, read and parsed again (`reread_page`), to fill its node rows,
so no shuffle carries page text. Node rows are `ritrag.schema.NodeRow` records;
`placement_row` is their one constructor, shared with the incremental update.
"""
from __future__ import annotations

from typing import Iterable

import apache_beam as beam

from ritrag.schema import DeadLetter, NodePlacement, NodeRow, PageSkeleton, PageSource, ParsedPage, page_row
from ritrag.transforms import records  # noqa: F401  (the records' RowCoder)
from ritrag.transforms.counts import COUNTS, CountingDoFn, record_counts
from ritrag.transforms.forest import build_site_forest, expand_sections
from ritrag.transforms.pages import (COUNTERS, DEAD, PageParser, ParserArg, SpillPagesFn, chosen_source,
                                     duplicate_letter, placed_page)

PAGES_OUTPUT = "pages"  # the tagged output of pages-table rows
LINKS_OUTPUT = "links"  # the tagged output of (page URL, ParsedPage.links) of the pages indexed
# Nodes placed at ritrag.schema.MAX_TREE_DEPTH above where their chain would put
# them (pages by the forest, sections by their page), and sections kept in the
# text of a page placed at the cap.
DEPTH_CAPPED_COUNTER = "nodes_depth_capped"
SITES_PLACED_COUNTER = "sites_placed"


class PlaceSiteFn(CountingDoFn):
    """(site, its skeletons) -> its placements, counting the sites placed (an
    update places only those whose skeletons changed), the cycles broken and
    nodes depth-capped."""

    def __init__(self):
        super().__init__(COUNTERS)

    def process(self, site_and_pages: tuple[str, Iterable[PageSkeleton]]) -> Iterable[NodePlacement]:
        forest = build_site_forest(*site_and_pages)
        self.count(SITES_PLACED_COUNTER)
        self.count("cycles_broken", forest.broken_cycles)
        self.count(DEPTH_CAPPED_COUNTER, forest.depth_capped)
        yield from forest.placements


class PlaceSkeletons(beam.PTransform):
    """Page skeletons -> every node's placement, one forest per site (only
    skeletons are grouped: a site's URLs, titles and trails, never its text)."""

    def expand(self, skeletons):
        return record_counts(skeletons
                             | "KeyBySite" >> beam.Map(lambda s: (s.site, s))
                             | "GroupBySite" >> beam.GroupByKey()
                             | "PlaceSite" >> beam.ParDo(PlaceSiteFn()).with_outputs(COUNTS, main="placements")
                             ).placements


def placement_row(placement: NodePlacement, body: str = "", page: ParsedPage | None = None,
                  page_id: str | None = None) -> NodeRow:
    """The node row of a placed node; `page` and `page_id` for nodes holding page text."""
    return NodeRow(
        node_id=placement.node_id,
        parent_id=placement.parent_id,
        page_id=page_id,
        site=placement.site,
        kind=placement.kind,
        position=placement.position,
        depth=placement.depth,
        title=placement.title,
        url=placement.url,
        ancestor_ids=list(placement.ancestor_ids),
        ancestor_titles=list(placement.ancestor_titles),
        body=body,
        summary=page.description if page else "",
        keywords=list(page.keywords) if page else [],
        source_summary=page.description if page else "",
        source_keywords=list(page.keywords) if page else [],
        metadata_key="",
        content_hash=page.content_hash if page else "",
        trail_method=placement.trail_method,
        source_kind=placement.source_kind,
    )


@beam.typehints.with_output_types(NodeRow)
class NodeRowsFn(CountingDoFn):
    """The rows of one URL: its placement joined with the sources of the pages
    parsed at that URL. The page indexed is read back from its spill file, or
    read and parsed again by `parser` (`placed_page`), so no shuffle carries page
    text: its node rows go to the main output, its pages-table row to
    PAGES_OUTPUT, its links to LINKS_OUTPUT (those of the page indexed, never of
    a duplicate merged into it). A page that cannot be read again becomes a dead
    letter (DEAD), and so does each duplicate (`duplicate_letter`: counted merged)."""

    def __init__(self, granularity: str):
        super().__init__(COUNTERS)
        self._granularity = granularity

    def process(self, joined: tuple[str, dict], parser: PageParser):
        _, group = joined
        placements = list(group["placement"])
        sources = list(group["page"])
        if not placements:
            self.count("pages_merged_duplicates", len(sources))
            return
        placement = placements[0]
        chosen, losers = chosen_source(sources)
        if chosen is None:  # a trail entry that is not a page of the corpus
            yield placement_row(placement)
            return
        self.count("pages_merged_duplicates", len(losers))
        for loser in losers:
            yield beam.pvalue.TaggedOutput(DEAD, duplicate_letter(loser, chosen))
        page = placed_page(parser, chosen)
        if isinstance(page, DeadLetter):
            self.count("pages_dead_lettered")
            yield beam.pvalue.TaggedOutput(DEAD, page)
            yield placement_row(placement)  # keeps the children it already placed
            return
        self.count("pages_indexed")
        yield beam.pvalue.TaggedOutput(PAGES_OUTPUT, page_row(page))
        if page.links:
            yield beam.pvalue.TaggedOutput(LINKS_OUTPUT, (page.url, page.links))
        rows, capped = page_node_rows(placement, page, self._granularity)
        self.count(DEPTH_CAPPED_COUNTER, capped)
        yield from rows


def page_node_rows(placement: NodePlacement, page: ParsedPage, granularity: str) -> tuple[list[NodeRow], int]:
    """(node rows holding one placed page's text: the page, and its sections when
    the granularity is "section"; how many of those sections were depth-capped)."""
    if granularity == "page":
        return [placement_row(placement, page.body, page, placement.node_id)], 0
    nodes, capped = expand_sections(placement, page.sections)
    return [placement_row(node, text, page, placement.node_id) for node, text in nodes], capped


class BuildForestNodes(beam.PTransform):
    """Parsed pages -> node rows ("nodes"), placed per site from skeletons and
    joined with their text by URL; the pages-table rows and the links of the
    pages indexed (PAGES_OUTPUT, LINKS_OUTPUT); dead letters of pages that could not be read again (DEAD).
    Only skeletons and page sources are shuffled, never page text: with
    `spill_dir`, a scratch location of the job's, each page is written there as
    parsed and read back once placed (a stage that writes files, because a
    shuffle of page text would hold the corpus in memory); without, it is read
    and parsed again."""

    def __init__(self, parser: ParserArg, granularity: str, spill_dir: str | None = None):
        super().__init__()
        self._parser = parser
        self._granularity = granularity
        self._spill_dir = spill_dir

    def expand(self, pages):
        placements = (
            pages
            | "Skeleton" >> beam.Map(PageSkeleton.of)
            | "Place" >> PlaceSkeletons()
            | "KeyPlacementByLocation" >> beam.Map(lambda n: (n.url if n.kind == "page" else n.node_id, n))
        )
        if self._spill_dir:
            sources = pages | "SpillPages" >> beam.ParDo(SpillPagesFn(self._spill_dir))
        else:
            sources = pages | "KeySourceByUrl" >> beam.Map(lambda p: (p.url, PageSource.of(p)))
        return record_counts(
            {"placement": placements, "page": sources}
            | "JoinPlacementAndSource" >> beam.CoGroupByKey()
            | "NodeRows" >> beam.ParDo(NodeRowsFn(self._granularity), self._parser
                                       ).with_outputs(PAGES_OUTPUT, LINKS_OUTPUT, DEAD, COUNTS, main="nodes")
        )
