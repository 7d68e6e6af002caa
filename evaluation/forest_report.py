"""`ritrag inspect`: how well the forest of a published index holds up, per site.

Reads the node skeleton (no bodies) and the dead letters of the live version and
reports, per site: the base URL its pages were given (the user's --base_url, or
the public base inferred from what the pages say about themselves, or why none
was), pages by the parser that read them (source kind) and by the trail
method that placed them, the depth
histogram, orphans (pages hung under the site root with no page markup to say
where they belong), virtual nodes, the largest fan-outs, how many nodes carry model metadata
(transforms/metadata/), and dead letters by reason, and its link graph (the
edges table, issue #30): edges kept from its
pages, the in-degree of its pages (distinct other pages linking to the page
or its sections: min, median, 90th percentile, max) and its pages that no
other page links to; and for the whole build, how often each trail rule was
tried, taken and passed over (a rule whose markup named nothing in the site)
and the links the build counted but did not keep (to nothing in the index,
navigation chrome), and how many documents without a ToC of their own had
one induced, and how (`toc_induced_<how>`: a PDF's layout, its pages, or a model's
verified headings, `llm`).
Rendered as plain text and as one self-contained HTML
file (inline SVG charts, no scripts, no external assets).
"""
from __future__ import annotations

import html
import os
from collections import Counter, defaultdict
from dataclasses import dataclass

import numpy as np
import pyarrow.compute as pc

from ritrag.flags import option
from ritrag.layout import DEAD_LETTERS_FILE
from ritrag.schema import EDGES_KIND, TOC_INDUCED_COUNTER_PREFIX
from ritrag.reader import IndexReader
from ritrag.storage import is_remote, open_parquet

SITE_ROOT_METHOD = "site_root"  # the method transforms.forest records for a site's root
REPORT_COLUMNS = ["node_id", "parent_id", "site", "kind", "depth", "title", "url", "trail_method", "source_kind",
                  "metadata_key"]
NO_MARKUP_METHODS = ("url", "none")
TOP_FANOUTS = 10
# The build's link counters (manifest stats) that say what became of the links
# not kept as edges; the edges kept are counted from the table itself.
LINK_COUNTER_PREFIXES = ("links_", "edges")


@dataclass(frozen=True)
class ReportFile:
    """Where `ritrag inspect` writes the HTML report: its flag."""

    html: str | None = option(None, "where to write the HTML report (default: INDEX/report-VERSION.html; "
                                    "./report-VERSION.html for an object-store index)")

    def path(self, index_dir: str, version: str) -> str:
        """--html, else the default the help states."""
        return self.html or os.path.join("." if is_remote(index_dir) else index_dir, f"report-{version}.html")


def forest_report(index_dir: str, version: str | None = None) -> dict:
    """Per-site statistics of the forest of one index version."""
    reader = IndexReader(index_dir, version)
    manifest = reader.manifest
    # Live rows only: after an update, a replaced node's old row is tombstoned in its segment.
    # Indexes built before the source_kind column report their pages' kind as "unknown".
    nodes = reader.table("nodes", REPORT_COLUMNS).to_pylist()

    by_id = {n["node_id"]: n for n in nodes}
    children = Counter(n["parent_id"] for n in nodes if n["parent_id"])
    sites: dict[str, dict] = defaultdict(lambda: {
        "pages": 0, "sections": 0, "virtual": 0, "methods": Counter(), "source_kinds": Counter(), "depths": Counter(),
        "orphans": 0, "orphan_examples": [], "fanouts": [], "model_metadata": 0})
    for n in nodes:
        site = sites[n["site"]]
        site["model_metadata"] += bool(n["metadata_key"])
        if n["kind"] == "virtual":
            site["virtual"] += 1
        elif n["kind"] == "section":
            site["sections"] += 1
        elif n["kind"] == "page":
            site["pages"] += 1
            site["methods"][n["trail_method"]] += 1
            site["source_kinds"][n.get("source_kind") or "unknown"] += 1
            site["depths"][n["depth"]] += 1
            parent = by_id.get(n["parent_id"]) if n["parent_id"] else None
            if parent is not None and parent["parent_id"] is None and n["trail_method"] in NO_MARKUP_METHODS:
                site["orphans"] += 1
                if len(site["orphan_examples"]) < 5:
                    site["orphan_examples"].append(n["url"])
        if children[n["node_id"]]:
            site["fanouts"].append((children[n["node_id"]], n["title"], n["node_id"]))
    for site in sites.values():
        site["fanouts"] = sorted(site["fanouts"], key=lambda f: (-f[0], f[2]))[:TOP_FANOUTS]
        placed = sum(v for k, v in site["methods"].items() if k != SITE_ROOT_METHOD)
        marked = sum(v for k, v in site["methods"].items() if k not in NO_MARKUP_METHODS + (SITE_ROOT_METHOD,))
        site["placed_by_markup"] = marked / placed if placed else 0.0

    # Each update dead-letters again every input it cannot index (an image is
    # listed and refused at every run): a source counts once, with the reasons
    # of the newest segment that records it.
    newest: dict[str, list[str]] = {}
    for f in reader.segment_files(DEAD_LETTERS_FILE):
        recorded: dict[str, list[str]] = defaultdict(list)
        for row in open_parquet(f).read(columns=["source", "reason"]).to_pylist():
            recorded[row["source"]].append(row["reason"])
        newest.update(recorded)
    dead = Counter()
    dead_by_site: dict[str, Counter] = defaultdict(Counter)
    for source, reasons in newest.items():
        dead.update(reasons)
        dead_by_site[_site_dir(source)].update(reasons)
    for name, stats in link_statistics(reader, nodes).items():
        sites[name]["links"] = stats
    settings = manifest.settings
    for input_site, decided in (settings.site_bases or {}).items():
        site = sites.get(decided["base"] or input_site)
        if site is not None:
            site["base"] = {**decided, "input": input_site}
    return {"index": index_dir, "version": manifest.version, "sites": dict(sorted(sites.items())),
            "base_url": settings.index.page_base_url, "bases_recorded": settings.site_bases is not None,
            "base_url_given": settings.index.base_url is not None,
            "trail_cascade": trail_cascade(manifest.stats),
            "link_counters": {name: value for name, value in sorted((manifest.stats.get("pages") or {}).items())
                              if name.startswith(LINK_COUNTER_PREFIXES)},
            "toc_induced": {name[len(TOC_INDUCED_COUNTER_PREFIX):]: value
                            for name, value in sorted((manifest.stats.get("pages") or {}).items())
                            # not 0s: a PDF the model's headings cut leaves its parse's how at 0
                            if name.startswith(TOC_INDUCED_COUNTER_PREFIX) and value},
            "model_metadata": {"nodes": sum(s["model_metadata"] for s in sites.values()),
                               "asked_of": settings.index.model_steps.to_manifest().get("metadata"),
                               "counters": {name: value for name, value in sorted(
                                   (manifest.stats.get("pages") or {}).items()) if name.startswith("metadata_")}},
            "dead_letters": dict(dead), "dead_letters_by_source_dir": {k: dict(v) for k, v in dead_by_site.items()}}


def link_statistics(reader: IndexReader, nodes: list[dict]) -> dict[str, dict]:
    """Per site: edges kept from its pages (one per linking page and target
    node), its pages' links to nothing in the index and link elements left out
    as navigation (menus, breadcrumbs, footers, pagers), the in-degree
    distribution of its pages (distinct other pages linking to the page or to
    one of its sections) and how many pages no other page links to. Nothing for
    an index written before it had an edges table."""
    if not reader.files(EDGES_KIND):
        return {}
    site_of = {n["node_id"]: n["site"] for n in nodes}
    page_of = {n["node_id"]: n["node_id"] if n["kind"] == "page" else n["parent_id"] for n in nodes
               if n["kind"] in ("page", "section")}  # a section's parent is its page (or an enclosing section)
    for node_id, parent in list(page_of.items()):
        while parent in page_of and page_of[parent] != parent:
            parent = page_of[parent]
        page_of[node_id] = parent
    edges = reader.table(EDGES_KIND, ["source_node_id", "target_node_id"])
    sources = edges["source_node_id"].to_pylist()
    pairs = {(s, t) for s, t in zip(sources, edges["target_node_id"].to_pylist()) if s != t and t in site_of}
    kept: Counter = Counter(site_of.get(source) for source, _ in pairs)
    resolved: Counter = Counter(site_of.get(source) for source in sources)
    page_site = {n["url"]: n["site"] for n in nodes if n["kind"] == "page"}
    pages = reader.table("pages", ["url", "links", "links_navigation"])
    links: Counter = Counter()
    navigation: Counter = Counter()
    for url, n_links, n_navigation in zip(pages["url"].to_pylist(), pc.list_value_length(pages["links"]).to_pylist(),
                                          pages["links_navigation"].to_pylist()):
        links[page_site.get(url)] += n_links
        navigation[page_site.get(url)] += n_navigation
    linking: dict[str, set] = defaultdict(set)
    for source, target in pairs:
        if page_of.get(target) not in (None, source):
            linking[page_of[target]].add(source)
    degrees: dict[str, list[int]] = defaultdict(list)
    for n in nodes:
        if n["kind"] == "page":
            degrees[n["site"]].append(len(linking.get(n["node_id"], ())))
    out = {}
    for site, values in degrees.items():
        values = np.array(values)
        out[site] = {"edges": kept.get(site, 0), "unresolved": links[site] - resolved[site],
                     "navigation": navigation[site], "no_in_links": int((values == 0).sum()),
                     "in_degree": {"min": int(values.min()), "median": float(np.median(values)),
                                   "p90": float(np.percentile(values, 90)), "max": int(values.max())}}
    return out


def _links_line(links: dict) -> str:
    degree = links["in_degree"]
    return (f"links: {links['edges']} edges kept from its pages, {links['unresolved']} links to nothing in the "
            f"index, {links['navigation']} left out as navigation; in-degree min {degree['min']}, median "
            f"{degree['median']:g}, p90 {degree['p90']:g}, max {degree['max']}; {links['no_in_links']} pages "
            f"with no in-links")


def trail_cascade(stats: dict) -> dict[str, dict[str, int]]:
    """{method: {tried, taken, passed_over}} from the build's trail_* counters
    (a method is tried when the page has its markup; "url" is never passed over)."""
    cascade: dict[str, dict[str, int]] = defaultdict(lambda: {"tried": 0, "taken": 0, "passed_over": 0})
    for name, value in (stats.get("pages") or {}).items():
        for kind in ("taken", "passed_over"):
            if name.startswith(f"trail_{kind}_"):
                method = cascade[name[len(f"trail_{kind}_"):]]
                method[kind] += value
                method["tried"] += value
    return dict(sorted(cascade.items()))


def _base_line(site: dict, report: dict) -> str:
    decided = site.get("base")
    if not report.get("bases_recorded"):
        return f"base: {report.get('base_url')} (built before base URLs were inferred)"
    if decided is None and report.get("base_url_given") is False:
        # Nothing was inferred for this site: its input carries absolute URLs (WARC records, a crawl).
        return "base: the URLs its input records carry"
    if decided is None:
        return f"base: given ({report.get('base_url')})"
    if decided["status"] == "inferred":
        return (f"base: inferred {decided['base']} from {counted(decided['pages'], 'page')} naming their URL "
                f"(input {decided['input']})")
    if decided["status"] == "conflict":
        shared = decided["shared_with"]
        return (f"base: kept {decided['input']}: its pages name {next(iter(decided['candidates']))}, which "
                f"{', '.join(shared)} {'infers' if len(shared) == 1 else 'infer'} too")
    if decided["status"] == "several":
        named = ", ".join(f"{b} ({counted(n, 'page')})" for b, n in decided["candidates"].items())
        return f"base: kept {decided['input']}: its pages name several bases: {named}"
    return f"base: kept {decided['input']}: no page names a public URL ending with its own path"


def _site_dir(source: str) -> str:
    return os.path.basename(os.path.dirname(source)) or source


def counted(n: int, noun: str) -> str:
    """'1 page', '2 pages': the reports' counts read as English."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def render_text(report: dict) -> str:
    lines = [f"index {report['index']} version {report['version']}"]
    for name, s in report["sites"].items():
        lines.append(f"\n== {name}: {counted(s['pages'], 'page')}, {counted(s['sections'], 'section')}, "
                     f"{s['virtual']} virtual, {s['placed_by_markup']:.1%} placed by page markup, "
                     f"{counted(s['orphans'], 'orphan')}")
        lines.append("  " + _base_line(s, report))
        lines.append("  source kinds: " + ", ".join(f"{k} {v}" for k, v in s["source_kinds"].most_common()))
        lines.append("  trail methods: " + ", ".join(f"{k} {v}" for k, v in s["methods"].most_common()))
        lines.append("  depth: " + ", ".join(f"{d}:{c}" for d, c in sorted(s["depths"].items())))
        lines.append(f"  model metadata: {counted(s['model_metadata'], 'node')}")
        lines.append("  largest fan-outs: " + "; ".join(f"{t!r} {c}" for c, t, _ in s["fanouts"][:5]))
        if "links" in s:
            lines.append("  " + _links_line(s["links"]))
        for url in s["orphan_examples"]:
            lines.append(f"  orphan: {url}")
    if report.get("trail_cascade"):
        lines.append("\ntrail cascade (pages): " + "; ".join(
            f"{m} tried {c['tried']}, taken {c['taken']}, passed over {c['passed_over']}"
            for m, c in report["trail_cascade"].items()))
    if report.get("toc_induced"):
        lines.append("\nToCs induced (documents without one of their own, by how): " + ", ".join(
            f"{how} {n}" for how, n in report["toc_induced"].items()))
    if report.get("link_counters"):
        lines.append("\nlinks (build counters): " + ", ".join(f"{k} {v}" for k, v in report["link_counters"].items()))
    metadata = report["model_metadata"]
    asked = metadata["asked_of"]
    lines.append(f"\nmodel metadata: {counted(metadata['nodes'], 'node')}"
                 + (f" ({asked['model']}, {asked['prompt_version']})" if asked else "")
                 + "".join(f", {k} {v}" for k, v in metadata["counters"].items()))
    lines.append("\ndead letters: " + (", ".join(f"{k} {v}" for k, v in sorted(report["dead_letters"].items()))
                                       or "none"))
    return "\n".join(lines)


def _bar_chart(counts: dict, title: str, width: int = 360) -> str:
    items = sorted(counts.items(), key=lambda kv: str(kv[0]))
    if not items:
        return ""
    top = max(v for _, v in items)
    row_h, label_w = 18, 110
    bars = []
    for i, (label, value) in enumerate(items):
        w = 0 if not top else int((width - label_w - 50) * value / top)
        y = i * row_h + 20
        bars.append(f'<text x="0" y="{y + 12}" font-size="11">{html.escape(str(label))}</text>'
                    f'<rect x="{label_w}" y="{y}" width="{w}" height="{row_h - 4}" fill="#4a7bd0"/>'
                    f'<text x="{label_w + w + 4}" y="{y + 12}" font-size="11">{value}</text>')
    height = len(items) * row_h + 24
    return (f'<svg width="{width}" height="{height}" role="img" aria-label="{html.escape(title)}">'
            f'<text x="0" y="12" font-size="12" font-weight="bold">{html.escape(title)}</text>'
            + "".join(bars) + "</svg>")


def render_html(report: dict) -> str:
    parts = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>ritrag forest report "
             f"{html.escape(report['version'])}</title><style>body{{font-family:sans-serif;margin:2em}}"
             f"section{{border-top:1px solid #ccc;padding:1em 0}}.charts{{display:flex;gap:2em;flex-wrap:wrap}}"
             f"td,th{{padding:2px 8px;text-align:left}}</style></head><body>",
             f"<h1>Forest report</h1><p>{html.escape(report['index'])}, version {html.escape(report['version'])}</p>"]
    for name, s in report["sites"].items():
        parts.append(f"<section><h2>{html.escape(name)}</h2><p>{counted(s['pages'], 'page')}, "
                     f"{counted(s['sections'], 'section')}, {counted(s['virtual'], 'virtual node')}, "
                     f"<b>{s['placed_by_markup']:.1%}</b> placed by page markup, {counted(s['orphans'], 'orphan')}</p><p>{html.escape(_base_line(s, report))}</p>"
                     + (f"<p>{html.escape(_links_line(s['links']))}</p>" if "links" in s else "")
                     + "<div class='charts'>"
                     + _bar_chart(dict(s["source_kinds"]), "pages by source kind")
                     + _bar_chart(dict(s["methods"]), "pages by trail method")
                     + _bar_chart(dict(s["depths"]), "pages by depth") + "</div>")
        parts.append("<table><tr><th>children</th><th>node</th></tr>" + "".join(
            f"<tr><td>{c}</td><td>{html.escape(t)} <code>{nid}</code></td></tr>" for c, t, nid in s["fanouts"])
            + "</table>")
        if s["orphan_examples"]:
            parts.append("<p>orphans, e.g.: " + ", ".join(html.escape(u or "") for u in s["orphan_examples"]) + "</p>")
        parts.append("</section>")
    if report.get("toc_induced"):
        parts.append("<section><h2>ToCs induced</h2>" + _bar_chart(
            report["toc_induced"], "documents without a ToC of their own, by how theirs was induced", width=480)
            + "</section>")
    if report.get("link_counters"):
        parts.append("<section><h2>Links</h2>" + _bar_chart(report["link_counters"], "links by what became of them",
                                                            width=480) + "</section>")
    parts.append("<section><h2>Dead letters</h2>" + (_bar_chart(report["dead_letters"], "dead letters by reason")
                                                     or "<p>none</p>") + "</section></body></html>")
    return "".join(parts)
