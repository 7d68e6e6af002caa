"""Rendering of `ritrag.evaluation.eval` reports: a terminal table, JSON, and one
self-contained HTML file (inline SVG charts, no scripts, no external assets),
like `ritrag inspect`'s forest report.
"""
from __future__ import annotations

import html
import json
import math
import os
from typing import Any, Sequence

from ritrag.evaluation.eval import NODE_RANKINGS, SYSTEMS

COLORS = {"subforest": "#2f6fd0", "bm25": "#d08a2f", "dense": "#3a9a5b", "chunks": "#a04bb0", "tree": "#777777",
          "agent": "#c03a3a", "focused1x": "#5aa6e8", "focused2x": "#1f4f99"}
TABLE_COLUMNS = (("found", "found"), ("hit@1", "hit@1"), ("hit@5", "hit@5"), ("hit@10", "hit@10"), ("mrr", "MRR"),
                 ("ndcg@10", "nDCG@10"), ("evidence_recall", "ev.recall"), ("read_tokens", "read tok"),
                 ("evidence_per_1k_tokens", "ev./1k tok"),
                 ("toc_tokens_json", "ToC tok json"), ("toc_tokens_outline", "ToC tok outline"))
AGENT_COLUMNS = (("precision", "ev.P"), ("recall", "ev.R"), ("f1", "ev.F1"), ("calls", "calls"),
                 ("toc_calls", "GetToC"), ("prompt_tokens", "prompt tok"), ("completion_tokens", "compl. tok"),
                 ("latency_s", "s/question"), ("judge", "judge"), ("errors", "errors"))


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _chart_number(value: float) -> str:
    """A value on a chart: a count as a whole number ("16", not "16.000")."""
    return f"{int(value):,}" if float(value).is_integer() else _fmt(float(value))


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    line = lambda cells: "  ".join(str(c).rjust(w) if i else str(c).ljust(w)  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    return [line(header), *(line(r) for r in rows)]


def _setup_line(report: dict[str, Any]) -> str:
    c = report["config"]
    r = report.get("retrieval") or {}  # reports written before it was recorded have none
    retrieval = (f"; retrieval: {', '.join(f'{k} {v}' for k, v in r.items())}" if r else "")
    return (f"reader: GetToC + {c['max_calls'] - 1} Reads x {c['ids_per_read']} node(s), first {c['max_chars']:,} "
            f"chars of each; plain RAG: top {c['chunks']} chunks; k'={c['k']}, n={c['n']}; tokens: {report['tokenizer']}"
            f"{retrieval}")


def verdict_sentences(report: dict[str, Any], ties: bool = True) -> list[str]:
    """One line per scope (overall, each tag): the sub-forest's wins, losses
    and (with `ties`) ties against each baseline, with both values."""
    grouped: dict[tuple[str, int], dict[str, list[str]]] = {}
    for v in report["verdicts"]:
        if v["outcome"] == "ties" and not ties:
            continue
        outcomes = grouped.setdefault((v["scope"], v["questions"]), {"wins": [], "loses": [], "ties": []})
        outcomes[v["outcome"]].append(f"{v['baseline']} {v['metric']} ({_fmt(v['subforest'])} vs "
                                      f"{_fmt(v['baseline_value'])})")
    return [f"{scope} ({n} q): " + "; ".join(f"{outcome} vs " + ", ".join(items)
                                             for outcome, items in outcomes.items() if items)
            for (scope, n), outcomes in grouped.items()]


def cross_links_sentence(subforest: dict[str, Any], scored: int) -> str:
    """The sub-forest's cross-link measurements (ritrag.evaluation.eval, CROSS_LINK_METRICS) in one sentence."""
    s = subforest
    return (f"cross-links (see_also): {_fmt(s['see_also_nodes'])} per ToC; ToC tokens json "
            f"{_fmt(s['toc_tokens_json'])} -> {_fmt(s['toc_tokens_json_see_also'])}, outline "
            f"{_fmt(s['toc_tokens_outline'])} -> {_fmt(s['toc_tokens_outline_see_also'])}; gold found in the ToC "
            f"{_fmt(s['found'])}, in the ToC or its cross-links {_fmt(s['found_see_also'])}; of {scored} questions, "
            f"gold the ToC missed is among its cross-links for {round(s['one_hop'] * scored)}, one link from a hit "
            f"for {round(s['one_hop_linked'] * scored)}")


def render_text(report: dict[str, Any]) -> str:
    counts = report["counts"]
    lines = [f"ritrag eval: {report['index']} version {report['version']}: {counts['questions']} questions, "
             f"{counts['scored']} scored, {counts['unresolvable_questions']} with no resolvable gold "
             f"({counts['unresolvable_gold']} gold entries unresolvable); {report['seconds']} s",
             _setup_line(report), ""]
    overall = report["overall"]
    rows = [[name, *(_fmt(overall[name].get(key)) for key, _ in TABLE_COLUMNS)] for name in SYSTEMS if name in overall]
    lines += _table(["system", *(label for _, label in TABLE_COLUMNS)], rows)
    if "agent" in overall:
        lines += ["", "agent (" + (report["agent"] or {}).get("model", "") + ")"]
        lines += _table([label for _, label in AGENT_COLUMNS],
                        [[_fmt(overall["agent"].get(key)) for key, _ in AGENT_COLUMNS]])
    lat = report["latency_ms"]
    lines += ["", f"GetToC latency (query embedding + retrieval + sub-forest): p50 {_fmt(lat['p50'])} ms, "
                  f"p99 {_fmt(lat['p99'])} ms"]
    if "see_also_nodes" in overall.get("subforest", {}):
        lines += ["", cross_links_sentence(overall["subforest"], overall["scored"])]
    if report["by_tag"]:
        lines += ["", "by tag: MRR / evidence recall (tree: gold in tree)"]
        rows = []
        for tag, agg in report["by_tag"].items():
            cells = [tag, str(agg["scored"])]
            for name in (*NODE_RANKINGS, "chunks"):
                m = agg.get(name, {})
                cells.append(f"{_fmt(m.get('mrr'))} / {_fmt(m.get('evidence_recall'))}")
            cells.append(_fmt(agg.get("tree", {}).get("found")))
            rows.append(cells)
        lines += _table(["tag", "n", *NODE_RANKINGS, "chunks", "tree"], rows)
    if report["unresolvable"]:
        lines += ["", "unresolvable gold (not scored as misses):"]
        lines += [f"  {u['id']} (line {u['line']}{'' if u['scored'] else ', question not scored'}): "
                  + ", ".join(u["gold"]) for u in report["unresolvable"]]
    lines += ["", "where the sub-forest wins / loses (ties: see the HTML report):",
              *("  " + s for s in verdict_sentences(report, ties=False))]
    return "\n".join(lines)


def _change(value: float | None) -> str:
    """A signed change, in the digits `_fmt` gives its values."""
    if value is None:
        return ""
    return f"{value:+,.0f}" if abs(value) >= 100 else f"{value:+.3f}"


def render_comparison(comparison: dict[str, Any]) -> str:
    """`compare_runs`' table: per system and metric, base -> other (change)."""
    base, other = comparison["base"], comparison["other"]
    lines = [f"base {base['index']} {base['version']} ({base['embedder']}) vs other {other['index']} "
             f"{other['version']} ({other['embedder']})", ""]
    rows = [[name, metric, _fmt(v["base"]), _fmt(v["other"]),
             _change(v["change"])]
            for name, metrics in comparison["overall"].items() if name != "scored"
            for metric, v in metrics.items()]
    return "\n".join(lines + _table(["system", "metric", "base", "other", "change"], rows))


# ---- HTML ------------------------------------------------------------------------------------------------------

def _svg(width: int, height: int, title: str, body: str) -> str:
    return (f'<svg width="{width}" height="{height}" role="img" aria-label="{html.escape(title)}">'
            f'<text x="0" y="14" font-size="13" font-weight="bold">{html.escape(title)}</text>{body}</svg>')


def _legend(names: Sequence[str], x: int, y: int) -> str:
    return "".join(f'<rect x="{x + i * 90}" y="{y}" width="10" height="10" fill="{COLORS.get(n, "#999")}"/>'
                   f'<text x="{x + i * 90 + 14}" y="{y + 9}" font-size="11">{html.escape(n)}</text>'
                   for i, n in enumerate(names))


def grouped_bars(categories: Sequence[str], series: dict[str, Sequence[float | None]], title: str,
                 top: float | None = None, width: int = 640) -> str:
    """Vertical bars, one group per category, one bar per series (None: no bar)."""
    if not categories or not series:
        return ""
    values = [v for vs in series.values() for v in vs if v is not None]
    top = top or max(values + [1e-9])
    plot_h, left, base = 160, 36, 200
    group_w = (width - left - 10) / len(categories)
    bar_w = max(2.0, group_w * 0.8 / len(series))
    parts = [_legend(list(series), left, 24),
             f'<line x1="{left}" y1="{base}" x2="{width - 10}" y2="{base}" stroke="#444"/>',
             f'<text x="0" y="{base - plot_h + 4}" font-size="10">{_chart_number(top)}</text>',
             f'<text x="0" y="{base}" font-size="10">0</text>']
    for i, cat in enumerate(categories):
        gx = left + i * group_w + group_w * 0.1
        for j, (name, vs) in enumerate(series.items()):
            v = vs[i]
            if v is None:
                continue
            h = plot_h * v / top
            parts.append(f'<rect x="{gx + j * bar_w:.1f}" y="{base - h:.1f}" width="{bar_w - 1:.1f}" height="{h:.1f}" '
                         f'fill="{COLORS.get(name, "#999")}"><title>{html.escape(f"{name} {cat}: {_chart_number(v)}")}</title></rect>')
        label = cat if len(cat) <= 14 else cat[:13] + "…"
        parts.append(f'<text x="{left + (i + 0.5) * group_w:.1f}" y="{base + 14}" font-size="10" '
                     f'text-anchor="middle">{html.escape(label)}</text>')
    return _svg(width, base + 24, title, "".join(parts))


def scatter(points: Sequence[tuple[float, float, str]], title: str, x_label: str, y_label: str,
            width: int = 520, height: int = 300) -> str:
    """Points (x, y, series name) on a log x axis and a 0..1 y axis."""
    points = [(x, y, s) for x, y, s in points if x is not None and y is not None and x > 0]
    if not points:
        return ""
    lo, hi = math.log10(min(p[0] for p in points)), math.log10(max(p[0] for p in points))
    hi = hi if hi > lo else lo + 1
    left, top_y, plot_w, plot_h = 44, 40, width - 60, height - 80
    px = lambda x: left + plot_w * (math.log10(x) - lo) / (hi - lo)  # noqa: E731
    py = lambda y: top_y + plot_h * (1 - y)  # noqa: E731
    names = list(dict.fromkeys(s for _, _, s in points))
    parts = [_legend(names, left, 22),
             f'<rect x="{left}" y="{top_y}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#444"/>',
             f'<text x="{left}" y="{height - 8}" font-size="10">{_fmt(10 ** lo)}</text>',
             f'<text x="{left + plot_w}" y="{height - 8}" font-size="10" text-anchor="end">{_fmt(10 ** hi)}</text>',
             f'<text x="{left + plot_w / 2}" y="{height - 8}" font-size="11" text-anchor="middle">'
             f'{html.escape(x_label)} (log)</text>',
             f'<text x="4" y="{top_y + 8}" font-size="10">1</text><text x="4" y="{top_y + plot_h}" font-size="10">0</text>',
             f'<text x="4" y="{top_y + plot_h / 2}" font-size="11">{html.escape(y_label)}</text>']
    for x, y, s in points:
        parts.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{COLORS.get(s, "#999")}" '
                     f'fill-opacity="0.6"><title>{html.escape(f"{s}: {_fmt(x)} tokens, {_fmt(y)}")}</title></circle>')
    return _svg(width, height, title, "".join(parts))


def _html_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    return ("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows) + "</table>")


def _context_tokens(name: str, s: dict[str, Any]) -> float | None:
    """Tokens the model is handed by a system on one question: map plus reading."""
    if name == "tree":
        return s.get("toc_tokens_json")
    return (s.get("read_tokens") or 0) + (s.get("toc_tokens_json") or 0)


def render_html(report: dict[str, Any]) -> str:
    counts, overall = report["counts"], report["overall"]
    systems = [n for n in SYSTEMS if n in overall]
    ranked = [n for n in (*NODE_RANKINGS, "chunks") if n in overall]
    parts = ["<!doctype html><html lang='en'><head><meta charset='utf-8'>"
             f"<title>ritrag eval {html.escape(report['version'])}</title><style>"
             "body{font-family:sans-serif;margin:2em}section{border-top:1px solid #ccc;padding:1em 0}"
             ".charts{display:flex;gap:2em;flex-wrap:wrap}td,th{padding:2px 8px;text-align:right}"
             "td:first-child,th:first-child{text-align:left}table{border-collapse:collapse}"
             "tr:nth-child(even){background:#f4f4f4}</style></head><body>",
             f"<h1>Evaluation</h1><p>{html.escape(report['index'])}, version {html.escape(report['version'])}: "
             f"{counts['questions']} questions, {counts['scored']} scored, {counts['unresolvable_questions']} with no "
             f"resolvable gold, {counts['unresolvable_gold']} gold entries unresolvable; {report['seconds']} s.</p>",
             f"<p>{html.escape(_setup_line(report))}</p>",
             "<ul>" + "".join(f"<li><b>{html.escape(n)}</b>: {html.escape(SYSTEMS[n])}</li>" for n in systems) + "</ul>",
             _html_table(["system", *(label for _, label in TABLE_COLUMNS)],
                         [[n, *(_fmt(overall[n].get(key)) for key, _ in TABLE_COLUMNS)] for n in systems])]
    if "agent" in overall:
        parts.append("<h2>Agent</h2>" + _html_table([label for _, label in AGENT_COLUMNS],
                                                     [[_fmt(overall["agent"].get(k)) for k, _ in AGENT_COLUMNS]]))
    lat = report["latency_ms"]
    parts.append(f"<p>GetToC latency (query embedding + retrieval + sub-forest): p50 {_fmt(lat['p50'])} ms, "
                 f"p99 {_fmt(lat['p99'])} ms.</p>")
    if "see_also_nodes" in overall.get("subforest", {}):
        parts.append(f"<p>{html.escape(cross_links_sentence(overall['subforest'], overall['scored']))}.</p>")
    parts.append("<section><h2>Where the sub-forest wins and loses</h2><ul>"
                 + "".join(f"<li>{html.escape(s)}</li>" for s in verdict_sentences(report)) + "</ul></section>")

    buckets = list(overall[ranked[0]]["rank_histogram"]) if ranked else []
    charts = [grouped_bars(buckets, {n: [overall[n]["rank_histogram"][b] for b in buckets] for n in ranked},
                           "questions by rank of the first gold item")]
    tags = list(report["by_tag"])
    for metric, label in (("evidence_recall", "evidence recall by tag"), ("mrr", "MRR by tag")):
        charts.append(grouped_bars(tags, {n: [report["by_tag"][t].get(n, {}).get(metric) for t in tags]
                                          for n in ranked}, label, top=1.0))
    charts.append(grouped_bars(tags, {n: [report["by_tag"][t].get(n, {}).get("found") for t in tags] for n in systems},
                               "gold found (in ToC / top n / top chunks / tree) by tag", top=1.0))
    points = [(_context_tokens(n, q["systems"][n]), q["systems"][n].get("evidence_recall"), n)
              for q in report["questions"] if q["scored"] for n in ranked]
    charts.append(scatter(points, "tokens handed to the model vs evidence recall, per question",
                          "tokens (ToC + text read)", "evidence recall"))
    parts.append("<section><h2>Charts</h2><div class='charts'>" + "".join(charts) + "</div></section>")

    if tags:
        parts.append("<section><h2>By tag</h2>" + _html_table(
            ["tag", "n", *(f"{n} MRR / ev.recall" for n in ranked), "tree found"],
            [[t, str(a["scored"]), *(f"{_fmt(a.get(n, {}).get('mrr'))} / {_fmt(a.get(n, {}).get('evidence_recall'))}"
                                     for n in ranked), _fmt(a.get("tree", {}).get("found"))]
             for t, a in report["by_tag"].items()]) + "</section>")
    if report["unresolvable"]:
        parts.append("<section><h2>Unresolvable gold</h2><p>Not scored as misses.</p>" + _html_table(
            ["id", "line", "gold", "question scored"],
            [[u["id"], str(u["line"]), ", ".join(u["gold"]), "yes" if u["scored"] else "no"]
             for u in report["unresolvable"]]) + "</section>")
    parts.append("<section><h2>Questions</h2>" + _html_table(
        ["id", "tags", *(f"{n} rank" for n in ranked), "subforest ev.", "chunks ev.", "ToC tok", "ms", "question"],
        [[q["id"], " ".join(q["tags"]), *(_fmt(q["systems"][n].get("rank")) if q["scored"] else "-" for n in ranked),
          _fmt(q["systems"]["subforest"].get("evidence_recall")), _fmt(q["systems"]["chunks"].get("evidence_recall")),
          _fmt(q["systems"]["subforest"]["toc_tokens_json"]), _fmt(q["latency_ms"]), q["question"]]
         for q in report["questions"]]) + "</section></body></html>")
    return "".join(parts)


def write_report(report: dict[str, Any], out_dir: str) -> dict[str, str]:
    """Write eval.json and eval.html into `out_dir`; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {"json": os.path.join(out_dir, "eval.json"), "html": os.path.join(out_dir, "eval.html")}
    with open(paths["json"], "w", encoding="utf-8") as fh:
        json.dump(report, fh, ensure_ascii=False, indent=1)
    with open(paths["html"], "w", encoding="utf-8") as fh:
        fh.write(render_html(report))
    return paths
