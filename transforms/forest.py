"""The breadcrumb forest: place every page of a site under its parent.

`build_site_forest` is pure and sees one site's skeletons (urls, titles,
trails), never bodies. Only a page's *parent* is taken from its trail; its
ancestors are those of the parent, so the result is always a tree even when
pages disagree about the trail above them, and parent-only signals ("Up"
links) resolve into full chains across pages for free.

Rules, all deterministic:
* The site root is the site's home page when the corpus has it, else a virtual
  node named after the site.
* Duplicates: of inputs with the same normalized URL, the one whose source
  sorts first is the page (`duplicate_winner`, the rule the node rows follow
  too); a page whose canonical URL names another page of the corpus merges into it.
* A trail entry that is not a page of the corpus becomes a virtual node (keyed
  by its URL, or by the titles above it when it has no link), parented by the
  entry before it in the trail that mentions it most often.
* A cycle is broken by attaching its smallest member to the site root.
* Depth is capped (`ritrag.schema.MAX_TREE_DEPTH`, the site root at 0): the
  nodes below a node at depth MAX_TREE_DEPTH - 1 are all placed as its children,
  at the cap, in document order (depth first), and counted (`depth_capped`); so
  ancestor lists stay bounded and a reply chain of any length costs its length.
* Siblings follow the parent's own in-page table of contents where it lists
  them, then URL order.
* A page's source kind is its parser's; a site or virtual node's is that of
  every page below it when they share one, else "" (`_source_kinds`).

`expand_sections` turns one placed page into its heading-section nodes, under
the same cap. Every walk is iterative: no depth exhausts the stack.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Callable, Iterable, TypeVar
from urllib.parse import urlsplit

from ritrag.ids import node_id_for
from ritrag.schema import MAX_TREE_DEPTH, Crumb, NodePlacement, PageSkeleton, Section
from ritrag.urls import path_segments

SITE_ROOT_METHOD = "site_root"
VIRTUAL_METHOD = "virtual"

T = TypeVar("T")


def duplicate_winner(inputs: Iterable[T], source: Callable[[T], str]) -> tuple[T | None, list[T]]:
    """(the input indexed of those parsed at one URL, the others, in order): the
    one whose source (a path, or `path#record`) sorts first. The one rule for the
    whole record: the forest places the winner's skeleton and the node rows hold
    the winner's text (`transforms.pages.chosen_source`), so that no node takes
    its title from one file and its body from another, whatever order the
    inputs arrive in."""
    ranked = sorted(inputs, key=source)
    return (ranked[0] if ranked else None), ranked[1:]


@dataclass(frozen=True)
class SiteForest:
    placements: list[NodePlacement]
    merged: dict[str, str]  # url of a page merged by its canonical link -> url kept
    broken_cycles: int
    depth_capped: int = 0  # nodes placed at MAX_TREE_DEPTH, above where their chain would put them


@dataclass
class _Slot:
    key: str
    kind: str
    title: str
    url: str | None
    trail_method: str
    nav_order: tuple[str, ...] = ()
    parent: str | None = None
    source_kind: str = ""  # a page's; a site or virtual node's is decided once the tree stands


def _site_title(site: str) -> str:
    segments = path_segments(site)
    return segments[-1] if segments else (urlsplit(site).netloc or site)


def _dedupe(site: str, pages: Iterable[PageSkeleton]) -> tuple[dict[str, PageSkeleton], dict[str, str]]:
    at_url: dict[str, list[PageSkeleton]] = defaultdict(list)
    for page in pages:
        at_url[page.url].append(page)
    # Inputs with one normalized URL keep the winner's skeleton here; the pipeline's
    # join by URL indexes the winner's text and dead-letters the others.
    by_url = {url: duplicate_winner(at_url[url], lambda p: p.source)[0] for url in sorted(at_url)}
    merged: dict[str, str] = {}
    for url in sorted(by_url):
        page = by_url[url]
        target = by_url.get(page.canonical_url)
        # Merge only into a page that calls itself canonical: chains and sites that
        # point every page at their home page must not collapse the forest.
        if target is not None and target.url != url and target.canonical_url == target.url:
            merged[url] = target.url
    for url in merged:
        by_url.pop(url, None)
    return by_url, merged


def build_site_forest(site: str, pages: Iterable[PageSkeleton]) -> SiteForest:
    """Place every page of `site` (skeletons only) into one tree."""
    by_url, merged = _dedupe(site, pages)
    slots: dict[str, _Slot] = {}
    root_page = by_url.get(site)
    root_key = site
    if root_page is not None:
        slots[root_key] = _Slot(root_key, "page", root_page.title, site, SITE_ROOT_METHOD,
                                root_page.nav_order, source_kind=root_page.source_kind)
    else:
        slots[root_key] = _Slot(root_key, "site", _site_title(site), site, SITE_ROOT_METHOD)

    virtual_parent_votes: dict[str, Counter] = defaultdict(Counter)
    virtual_titles: dict[str, Counter] = defaultdict(Counter)

    def crumb_key(crumb: Crumb, labels: tuple[str, ...]) -> str:
        if crumb.url:
            return crumb.url
        return site + "#" + "/".join(labels)

    for url, page in by_url.items():
        if url == site:
            continue
        slots[url] = _Slot(url, "page", page.title, url, page.trail_method, page.nav_order,
                           source_kind=page.source_kind)
        parent = root_key
        labels: tuple[str, ...] = ()
        for crumb in page.trail:
            if crumb.url in (url, site):
                continue
            labels = labels + (crumb.title,)
            key = crumb_key(crumb, labels)
            if key not in by_url:
                virtual_parent_votes[key][parent] += 1
                virtual_titles[key][crumb.title] += 1
            parent = key
        slots[url].parent = parent

    for key, votes in virtual_parent_votes.items():
        best_parent = min(votes.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        best_title = min(virtual_titles[key].items(), key=lambda kv: (-kv[1], kv[0]))[0]
        url = key if "#" not in key.removeprefix(site) else None
        slots[key] = _Slot(key, "virtual", best_title, url, VIRTUAL_METHOD, parent=best_parent)

    broken = _break_cycles(slots, root_key)
    placements, capped = _placements(site, slots, root_key)
    return SiteForest(placements, merged, broken, capped)


def _break_cycles(slots: dict[str, _Slot], root_key: str) -> int:
    """Re-parent to the root the smallest member of every cycle; count them."""
    state: dict[str, int] = {root_key: 2}  # 1: on the current walk, 2: reaches the root
    broken = 0
    for start in sorted(slots):
        walk = []
        key = start
        while state.get(key) is None:
            state[key] = 1
            walk.append(key)
            key = slots[key].parent or root_key
        if state[key] == 1:
            cycle = walk[walk.index(key):]
            slots[min(cycle)].parent = root_key
            broken += 1
        for k in walk:
            state[k] = 2
    return broken


def _sibling_order(parent: _Slot, children: list[_Slot]) -> list[_Slot]:
    nav_rank = {url: i for i, url in enumerate(parent.nav_order)}
    return sorted(
        children,
        key=lambda c: (0, nav_rank[c.url], "") if c.url in nav_rank else (1, 0, c.url or "", c.title, c.key),
    )


def _below_in_order(slot: _Slot, children: dict[str, list[_Slot]]) -> list[_Slot]:
    """Every node below `slot`, in document order: depth first, siblings in their order."""
    out, stack = [], _sibling_order(slot, children.get(slot.key, []))[::-1]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(_sibling_order(node, children.get(node.key, []))[::-1])
    return out


def _placements(site: str, slots: dict[str, _Slot], root_key: str) -> tuple[list[NodePlacement], int]:
    """Every node's placement, depth first; and how many were placed at the depth cap above their chain."""
    children: dict[str, list[_Slot]] = defaultdict(list)
    for key, slot in slots.items():
        if key != root_key:
            children[slot.parent or root_key].append(slot)
    # Page ids depend on the URL alone; non-page ids are scoped by site, since a
    # trail may name a URL that is a page of another site.
    ids = {key: node_id_for(key if slot.kind == "page" else f"{slot.kind}:{site}:{key}")
           for key, slot in slots.items()}
    if len(set(ids.values())) != len(ids):
        raise ValueError(f"node id collision inside site {site}")
    source_kinds = _source_kinds(slots, children, root_key)

    out = []
    capped = 0
    stack = [(slots[root_key], 0, 0, (), ())]
    while stack:
        slot, position, depth, anc_ids, anc_titles = stack.pop()
        node_id = ids[slot.key]
        out.append(NodePlacement(
            node_id=node_id,
            parent_id=anc_ids[-1] if anc_ids else None,  # where it is placed (the cap may lift it)
            site=site, kind=slot.kind, position=position, depth=depth,
            title=slot.title, url=slot.url,
            ancestor_ids=anc_ids, ancestor_titles=anc_titles,
            trail_method=slot.trail_method, source_kind=source_kinds[slot.key],
        ))
        if depth < MAX_TREE_DEPTH - 1:
            ordered = _sibling_order(slot, children.get(slot.key, []))
        elif depth == MAX_TREE_DEPTH - 1:  # the last parent: its whole subtree hangs from it, flattened
            ordered = _below_in_order(slot, children)
            capped += len(ordered) - len(children.get(slot.key, ()))
        else:  # at the cap: what was below is placed already, by the parent
            ordered = []
        for pos in range(len(ordered) - 1, -1, -1):
            stack.append((ordered[pos], pos, depth + 1, anc_ids + (node_id,), anc_titles + (slot.title,)))
    return out, capped


def _source_kinds(slots: dict[str, _Slot], children: dict[str, list[_Slot]], root_key: str) -> dict[str, str]:
    """Every node's source kind: a page's own; a site or virtual node's the one
    kind of all pages below it, "" when there are none or several (iterative:
    reply chains make deep trees)."""
    order, stack = [], [root_key]
    while stack:
        key = stack.pop()
        order.append(key)
        stack.extend(child.key for child in children.get(key, ()))
    below: dict[str, str | None] = {}  # None: no page below; "": several kinds
    out = {}
    for key in reversed(order):  # children before their parent
        slot = slots[key]
        found = {below[c.key] for c in children.get(key, ())} - {None}
        if slot.kind == "page":
            found.add(slot.source_kind)
            out[key] = slot.source_kind
        below[key] = (next(iter(found)) if len(found) == 1 else "") if found else None
        if slot.kind != "page":
            out[key] = below[key] or ""
    return out


def section_key(page_url: str, section: Section, ordinal: int) -> str:
    """Location key of a section node: the page URL plus the section's anchor
    (or its ordinal where the heading has no id)."""
    return f"{page_url}#{section.anchor or f'section-{ordinal}'}"


def expand_sections(page: NodePlacement, sections: tuple[Section, ...]
                    ) -> tuple[list[tuple[NodePlacement, str]], int]:
    """Section nodes of one placed page, with each node's own text; and how many
    sections were placed above where their headings put them (the depth cap).

    The page node keeps the text before the first heading; each heading section
    becomes a child of the nearest enclosing heading section (or of the page),
    so skipped heading levels lose no text. Nothing is placed deeper than
    MAX_TREE_DEPTH: a section that would be is a child of the node at depth
    MAX_TREE_DEPTH - 1 on its chain, in document order; a page at the cap itself
    has no room for sections, so it keeps their text as granularity "page" keeps
    it (they are counted as capped).
    """
    if page.depth >= MAX_TREE_DEPTH:
        return [(page, "\n\n".join(s.text for s in sections if s.text))], sum(1 for s in sections if s.level != 0)
    out: list[tuple[NodePlacement, str]] = []
    intro = sections[0].text if sections and sections[0].level == 0 else ""
    out.append((page, intro))
    # (level, node) of the enclosing headings; up to the cap, entry i is at depth page.depth + 1 + i
    open_sections: list[tuple[int, NodePlacement]] = []
    next_position: dict[str, int] = defaultdict(int)
    capped = 0
    for ordinal, section in enumerate(sections):
        if section.level == 0:
            continue
        while open_sections and open_sections[-1][0] >= section.level:
            open_sections.pop()
        parent = open_sections[-1][1] if open_sections else page
        if parent.depth >= MAX_TREE_DEPTH:  # under the node at depth MAX_TREE_DEPTH - 1 on its chain
            parent = open_sections[MAX_TREE_DEPTH - 2 - page.depth][1] if page.depth <= MAX_TREE_DEPTH - 2 else page
            capped += 1
        position = next_position[parent.node_id]
        next_position[parent.node_id] += 1
        node = NodePlacement(
            node_id=node_id_for(section_key(page.url or page.node_id, section, ordinal)),
            parent_id=parent.node_id, site=page.site, kind="section",
            position=position, depth=parent.depth + 1,
            title=section.title, url=f"{page.url}#{section.anchor}" if section.anchor and page.url else page.url,
            ancestor_ids=parent.ancestor_ids + (parent.node_id,),
            ancestor_titles=parent.ancestor_titles + (parent.title,),
            trail_method=page.trail_method, source_kind=page.source_kind,
        )
        out.append((node, section.text))
        open_sections.append((section.level, node))
    return out, capped
