"""ritrag.transforms.parse: one realistic page per markup family the trail cascade reads,
and the text, sections, metadata and failure modes of a page."""
from __future__ import annotations

import csv
import json
import time

import pytest

from ritrag.schema import MAX_ANCHOR_CHARS, MAX_PAGE_LINKS, Crumb, Link
from support import DEV_CORPUS
from ritrag.transforms.parse import UnparseablePage, parse_page

SITE = "https://docs.example.com/guide"
URL = f"{SITE}/install/linux.html"


def html(body: str, head: str = "", title: str = "Installing on Linux — Example Guide",
         lang: str = "en") -> str:
    return (f'<!DOCTYPE html><html lang="{lang}"><head><meta charset="utf-8">'
            f"<title>{title}</title>{head}</head><body>{body}</body></html>")


def parse(page: str | bytes, url: str = URL, site: str = SITE, **kwargs):
    data = page.encode("utf-8") if isinstance(page, str) else page
    return parse_page(data, url, site, **kwargs)


ARTICLE = """<main><h1>Installing on Linux</h1>
<p>Download the archive for your distribution.</p>
<h2 id="requirements">Requirements</h2><p>A 64-bit kernel.</p></main>"""


def jsonld(document: object) -> str:
    return f'<script type="application/ld+json">{json.dumps(document)}</script>'


INSTALL_TRAIL = (Crumb("Installation", f"{SITE}/install"),)


# ------------------------------------------------------------------ trails by markup family

def test_jsonld_breadcrumb_list_resolves_relative_items_and_drops_root_and_page():
    head = jsonld({
        "@context": "https://schema.org", "@type": "BreadcrumbList",
        "itemListElement": [
            # Out of order on purpose: positions decide.
            {"@type": "ListItem", "position": 3, "name": "Installing on Linux"},
            {"@type": "ListItem", "position": 1, "name": "Guide", "item": "/guide/"},
            {"@type": "ListItem", "position": 2, "name": "Installation &amp; setup", "item": "../install/"},
        ],
    })
    page = parse(html(ARTICLE, head))
    assert page.trail_method == "jsonld"
    assert page.trail == (Crumb("Installation & setup", f"{SITE}/install"),)


def test_jsonld_in_graph_with_item_objects():
    head = jsonld({"@context": "https://schema.org", "@graph": [
        {"@type": "WebSite", "@id": "https://docs.example.com/#site", "name": "Example"},
        {"@type": ["BreadcrumbList"], "itemListElement": [
            {"@type": "ListItem", "position": 1, "item": {"@id": f"{SITE}/", "name": "Guide"}},
            {"@type": "ListItem", "position": 2, "item": {"@id": f"{SITE}/install/", "name": "Installation"}},
            {"@type": "ListItem", "position": 3, "item": {"@id": URL, "name": "Installing on Linux"}},
        ]},
    ]})
    page = parse(html(ARTICLE, head))
    assert (page.trail_method, page.trail) == ("jsonld", INSTALL_TRAIL)


def test_jsonld_webpage_breadcrumb_and_malformed_scripts_are_skipped():
    head = ('<script type="application/ld+json">{not json</script>' + jsonld({
        "@context": "https://schema.org", "@type": "WebPage", "name": "Installing on Linux",
        "breadcrumb": {"@type": "BreadcrumbList", "itemListElement": [
            {"@type": "ListItem", "position": 1, "name": "Installation", "item": f"{SITE}/install/"}]},
    }))
    page = parse(html(ARTICLE, head))
    assert (page.trail_method, page.trail) == ("jsonld", INSTALL_TRAIL)


def test_microdata_breadcrumb_list():
    body = """<ol itemscope itemtype="https://schema.org/BreadcrumbList">
      <li itemprop="itemListElement" itemscope itemtype="https://schema.org/ListItem">
        <a itemprop="item" href="../"><span itemprop="name">Guide</span></a>
        <meta itemprop="position" content="1"></li> ›
      <li itemprop="itemListElement" itemscope itemtype="https://schema.org/ListItem">
        <a itemprop="item" href="./"><span itemprop="name">Installation</span></a>
        <meta itemprop="position" content="2"></li> ›
      <li itemprop="itemListElement" itemscope itemtype="https://schema.org/ListItem">
        <span itemprop="name">Installing on Linux</span><meta itemprop="position" content="3"></li>
    </ol>""" + ARTICLE
    page = parse(html(body))
    assert (page.trail_method, page.trail) == ("microdata", INSTALL_TRAIL)
    assert "Guide" not in page.body


def test_rdfa_breadcrumb_list():
    body = """<ol vocab="https://schema.org/" typeof="BreadcrumbList">
      <li property="itemListElement" typeof="ListItem">
        <a property="item" typeof="WebPage" href="/guide/"><span property="name">Guide</span></a>
        <meta property="position" content="1"></li>
      <li property="itemListElement" typeof="ListItem">
        <a property="item" typeof="WebPage" href="/guide/install/index.html">
          <span property="name">Installation</span></a><meta property="position" content="2"></li>
    </ol>""" + ARTICLE
    page = parse(html(body))
    assert (page.trail_method, page.trail) == ("rdfa", INSTALL_TRAIL)


def test_aria_breadcrumb_nav_with_bootstrap_list_and_current_item():
    body = """<header><nav aria-label="Breadcrumb"><ol class="breadcrumb">
      <li class="breadcrumb-item"><a href="/">Example</a></li>
      <li class="breadcrumb-item"><a href="/guide/">Guide</a></li>
      <li class="breadcrumb-item"><a href="/guide/install/">Installation</a></li>
      <li class="breadcrumb-item"><a href="/guide/install/linux/">Linux</a></li>
      <li class="breadcrumb-item active" aria-current="page">Installing on Linux</li>
    </ol></nav></header>""" + ARTICLE
    page = parse(html(body))
    assert page.trail_method == "breadcrumb"
    # "Example" is above the site, "Guide" is its root, the current item is the page.
    assert page.trail == (Crumb("Installation", f"{SITE}/install"), Crumb("Linux", f"{SITE}/install/linux"))


def test_breadcrumb_class_with_separators_and_no_list():
    body = """<div class="breadcrumbs">You are here: <a href="/guide/">Guide</a> &raquo;
      <a href="/guide/install/">Installation</a> &raquo; <span>Installing on Linux</span></div>""" + ARTICLE
    page = parse(html(body))
    assert (page.trail_method, page.trail) == ("breadcrumb", INSTALL_TRAIL)
    assert "You are here" not in page.body
    no_root = body.replace('<a href="/guide/">Guide</a> &raquo;', "")
    assert parse(html(no_root)).trail == INSTALL_TRAIL


def test_read_the_docs_breadcrumbs_with_home_icon_and_source_aside():
    body = """<div role="navigation" aria-label="Page navigation"><ul class="wy-breadcrumbs">
      <li><a href="../index.html" class="icon icon-home" aria-label="Home"></a></li>
      <li class="breadcrumb-item"><a href="index.html">Installation</a></li>
      <li class="breadcrumb-item active">Installing on Linux</li>
      <li class="wy-breadcrumbs-aside"><a href="../_sources/install/linux.rst.txt">View page source</a></li>
    </ul><hr/></div><div role="main" class="document">""" + ARTICLE + "</div>"
    page = parse(html(body))
    assert (page.trail_method, page.trail) == ("breadcrumb", INSTALL_TRAIL)


def test_docusaurus_breadcrumbs_keep_unlinked_categories():
    body = """<article><nav class="theme-doc-breadcrumbs" aria-label="Breadcrumbs">
      <ul class="breadcrumbs">
        <li class="breadcrumbs__item"><a aria-label="Home page" class="breadcrumbs__link" href="/guide/">
          <svg viewBox="0 0 24 24"><path d="M10 19v-5h4v5"></path></svg></a></li>
        <li class="breadcrumbs__item"><span class="breadcrumbs__link">Platforms</span></li>
        <li class="breadcrumbs__item">
          <a class="breadcrumbs__link" href="/guide/install/">Installation</a></li>
        <li class="breadcrumbs__item breadcrumbs__item--active">
          <span class="breadcrumbs__link">Installing on Linux</span></li>
      </ul></nav>""" + ARTICLE.replace("<main>", "<div>").replace("</main>", "</div>") + "</article>"
    page = parse(html(body))
    assert page.trail_method == "breadcrumb"
    assert page.trail == (Crumb("Platforms", None), Crumb("Installation", f"{SITE}/install"))


def test_mkdocs_material_path_is_a_trail_but_a_path_section_is_not():
    body = """<section id="search-path"><h2>Search path</h2><p>Set <a href="/x">PATH</a>.</p>
      <p><a href="/y">more</a></p></section>
      <nav class="md-path" aria-label="Navigation"><ol class="md-path__list">
        <li class="md-path__item"><a href="../" class="md-path__link">Guide</a></li>
        <li class="md-path__item"><a href="./" class="md-path__link">Installation</a></li>
      </ol></nav>""" + ARTICLE
    page = parse(html(body))
    assert (page.trail_method, page.trail) == ("breadcrumb", INSTALL_TRAIL)


PYTHON_STYLE_RELATED_BAR = """<div class="related" role="navigation" aria-label="related navigation">
  <h3>Navigation</h3><ul>
    <li class="right" style="margin-right: 10px"><a href="../genindex.html" accesskey="I">index</a></li>
    <li class="right"><a href="../nt.html" accesskey="N">next</a> |</li>
    <li><img src="../_static/py.svg" alt="python logo"/></li>
    <li><a href="https://www.example.org/">Example</a> &#187;</li>
    <li id="version"><a href="../index.html">Guide 3.1 Documentation</a> &#187;</li>
    <li class="nav-item nav-item-1"><a href="index.html" accesskey="U">Installation</a> &#187;</li>
    <li class="nav-item nav-item-this"><a href="">Installing on Linux</a></li>
  </ul></div>"""


def test_sphinx_related_bar():
    body = PYTHON_STYLE_RELATED_BAR + f"""<div class="document"><div class="body" role="main">
      <section id="installing-on-linux"><h1>Installing on Linux<a class="headerlink"
        href="#installing-on-linux" title="Permalink to this heading">¶</a></h1>
      <p>Download the archive.</p></section></div>
      <div class="sphinxsidebar" role="navigation"><h3>This page</h3><p>Sidebar text</p></div></div>
      {PYTHON_STYLE_RELATED_BAR}"""
    page = parse(html(body))
    assert (page.trail_method, page.trail) == ("related_bar", INSTALL_TRAIL)
    assert page.body == "Download the archive."


def test_a_related_links_box_is_not_a_trail():
    body = """<div class="related"><h3>Related articles</h3><ul>
      <li><a href="/guide/upgrade/">Upgrading</a></li><li><a href="/guide/remove/">Removing</a></li>
      </ul></div>""" + ARTICLE
    page = parse(html(body))
    assert page.trail_method == "url"
    assert "Upgrading" not in page.body


def test_sidebar_current_chain():
    body = """<nav class="bd-links" aria-label="Main navigation"><ul class="current nav">
      <li class="toctree-l1"><a href="../start.html">Getting started</a></li>
      <li class="toctree-l1 current active"><a class="reference internal" href="index.html">Installation</a>
        <ul class="current">
          <li class="toctree-l2"><a href="windows.html">Windows</a></li>
          <li class="toctree-l2 current active"><a class="current reference internal" href="#">
            Installing on Linux</a></li>
        </ul></li></ul></nav>""" + ARTICLE
    page = parse(html(body))
    assert (page.trail_method, page.trail) == ("toc_current", INSTALL_TRAIL)


def test_docbook_navheader_up_link_gives_the_parent_only():
    body = """<div class="navheader"><table width="100%" summary="Navigation header">
      <tr><th colspan="3" align="center">Installing on Linux</th></tr>
      <tr><td><a accesskey="p" href="windows.html">Prev</a></td>
        <td><a accesskey="u" href="index.html" title="Chapter 2. Installation">Up</a></td>
        <td><a accesskey="h" href="../index.html" title="Example Guide">Home</a></td></tr></table><hr/></div>
      <div class="sect1" id="linux"><div class="titlepage"><h2 class="title"><a id="id-1.2"></a>
        Installing on Linux</h2></div><p>Download the archive.</p></div>
      <div class="navfooter"><hr/><a accesskey="u" href="index.html">Up</a> Footer text</div>"""
    page = parse(html(body, title="Installing on Linux"))
    assert page.trail_method == "up_link"
    assert page.trail == (Crumb("Chapter 2. Installation", f"{SITE}/install"),)
    assert page.body == "Download the archive."
    assert [s.title for s in page.sections] == ["Installing on Linux"]


def test_link_rel_up_and_a_parent_that_is_the_home_page():
    head = '<link rel="home" href="../start.en.html"><link rel="up" href="index.html" title="Installation">'
    page = parse(html(ARTICLE, head))
    assert (page.trail_method, page.trail) == ("up_link", INSTALL_TRAIL)
    top = parse(html(ARTICLE, '<link rel="home" href="start.en.html"><link rel="up" href="start.en.html">'),
                url=f"{SITE}/ch07.en.html")
    assert (top.trail_method, top.trail) == ("up_link", ())


def test_url_fallback_crumbs_are_the_directories_between_site_and_page():
    page = parse(html(ARTICLE), url=f"{SITE}/install/linux%20x86/setup.html")
    assert page.trail_method == "url"
    assert page.trail == (Crumb("install", f"{SITE}/install"),
                          Crumb("linux x86", f"{SITE}/install/linux%20x86"))
    assert parse(html(ARTICLE), url=f"{SITE}/index.html").trail == ()
    assert parse(html(ARTICLE), url="https://elsewhere.example/a/b.html").trail == ()


def test_structured_data_beats_visible_trail_and_visible_trail_beats_theme_bars():
    visible = ('<nav aria-label="breadcrumb"><a href="/guide/install/">Installation</a> / '
               '<a href="/guide/x/">X</a></nav>')
    head = jsonld({"@type": "BreadcrumbList", "itemListElement": [
        {"@type": "ListItem", "position": 1, "name": "Installation", "item": f"{SITE}/install/"}]})
    assert parse(html(visible + ARTICLE, head)).trail_method == "jsonld"
    both = parse(html(PYTHON_STYLE_RELATED_BAR + visible + ARTICLE))
    assert both.trail_method == "breadcrumb"
    assert both.trail[-1] == Crumb("X", f"{SITE}/x")


def test_markup_naming_only_the_page_falls_through_to_the_next_rule():
    only_self = ('<nav aria-label="breadcrumb"><ol><li><a href="linux.html">'
                 "Installing on Linux</a></li></ol></nav>")
    page = parse(html(only_self + ARTICLE, '<link rel="up" href="index.html" title="Installation">'))
    assert (page.trail_method, page.trail) == ("up_link", INSTALL_TRAIL)


def test_api_reference_header_lines_above_the_title_are_the_trail():
    """Module and package lines above the class name (an API reference's header)."""
    body = ('<header role="banner"><nav><ul><li><a href="../../index.html">Overview</a></li></ul></nav></header>'
            '<main role="main"><div class="header">'
            '<div class="sub-title"><span class="module-label">Module</span>&nbsp;'
            '<a href="../../module-summary.html">example.base</a></div>'
            '<div class="sub-title"><span class="package-label">Package</span>&nbsp;'
            '<a href="package-summary.html">example.lang</a></div>'
            '<h1 title="Class Text" class="title">Class Text</h1></div>'
            '<section class="class-description"><p>An immutable run of characters.</p></section></main>')
    page = parse(html(body), url=f"{SITE}/example.base/example/lang/Text.html")
    assert page.trail_method == "title_context"
    assert page.trail == (Crumb("example.base", f"{SITE}/example.base/module-summary.html"),
                          Crumb("example.lang", f"{SITE}/example.base/example/lang/package-summary.html"))
    assert page.title == "Class Text"


def test_lines_above_the_title_without_a_label_or_with_several_links_are_no_trail():
    pager = '<div><a href="prev.html">« Previous</a></div><h1>Installing on Linux</h1><p>Text.</p>'
    assert parse(html(pager)).trail_method == "url"
    tags = '<p>Tags: <a href="a.html">a</a> <a href="b.html">b</a></p><h1>Installing on Linux</h1><p>x</p>'
    assert parse(html(tags)).trail_method == "url"


def test_off_site_crumbs_pass_over_to_the_next_rule():
    """A mirror's JSON-LD names the original host; the relative visible trail places the page."""
    head = jsonld({"@type": "BreadcrumbList", "itemListElement": [
        {"@type": "ListItem", "position": 1, "name": "Guide", "item": "https://original.example/guide/"},
        {"@type": "ListItem", "position": 2, "name": "Installation", "item": "https://original.example/guide/install/"},
    ]})
    visible = '<nav aria-label="breadcrumb"><a href="index.html">Installation</a></nav>'
    page = parse(html(visible + ARTICLE, head))
    assert (page.trail_method, page.trail, page.trail_passed_over) == ("breadcrumb", INSTALL_TRAIL, ("jsonld",))
    # Nothing else places it: the URL does, and the rule is still recorded as passed over.
    alone = parse(html(ARTICLE, head))
    assert (alone.trail_method, alone.trail_passed_over) == ("url", ("jsonld",))


def test_a_trail_naming_only_the_root_yields_to_later_rules_but_beats_the_url():
    head = jsonld({"@type": "BreadcrumbList", "itemListElement": [
        {"@type": "ListItem", "position": 1, "name": "Guide", "item": f"{SITE}/"}]})
    up = '<link rel="up" href="index.html" title="Installation">'
    page = parse(html(ARTICLE, head + up))
    assert (page.trail_method, page.trail, page.trail_passed_over) == ("up_link", INSTALL_TRAIL, ("jsonld",))
    root_only = parse(html(ARTICLE, head))
    assert (root_only.trail_method, root_only.trail, root_only.trail_passed_over) == ("jsonld", (), ())


def nav_list(*items: str) -> str:
    return '<header><nav role="navigation"><ul class="bar">' + "".join(items) + "</ul></nav></header>"


API_USE_URL = f"{SITE}/example.base/example/lang/class-use/Text.html"


def test_hierarchical_navigation_bar_before_the_highlighted_item_is_the_trail():
    """An API reference's top bar: Overview, Module, Package, Class, then the page's
    own cell, highlighted but unlinked, then pages beside it (Tree, Index, Help)."""
    bar = nav_list('<li><a href="../../../../index.html">Overview</a></li>',
                   '<li><a href="../../../module-summary.html">Module</a></li>',
                   '<li><a href="../package-summary.html">Package</a></li>',
                   '<li><a href="../Text.html" title="class in example.lang">Class</a></li>',
                   '<li class="cell-highlight">Use</li>',
                   '<li><a href="../package-tree.html">Tree</a></li>',
                   '<li><a href="../../../../index-files/index-1.html">Index</a></li>',
                   '<li><a href="../../../../help-doc.html#use">Help</a></li>')
    body = bar + "<main><h1>Uses of Class example.lang.Text</h1><p>No usage of Text.</p></main>"
    page = parse(html(body), url=API_USE_URL)
    package = f"{SITE}/example.base/example/lang"
    assert page.trail_method == "nav_bar"
    assert page.trail == (Crumb("Module", f"{SITE}/example.base/module-summary.html"),
                          Crumb("Package", f"{package}/package-summary.html"),
                          Crumb("Class", f"{package}/Text.html"))
    # Unlinked (disabled) entries before the page's cell name no place and are skipped.
    tree = nav_list('<li><a href="../../../index.html">Overview</a></li>',
                    '<li><a href="../../module-summary.html">Module</a></li>',
                    '<li><a href="package-summary.html">Package</a></li>',
                    '<li>Class</li>', '<li>Use</li>', '<li class="cell-highlight">Tree</li>',
                    '<li><a href="../../../help-doc.html">Help</a></li>')
    page = parse(html(tree + ARTICLE), url=f"{package}/package-tree.html")
    assert (page.trail_method, [c.title for c in page.trail]) == ("nav_bar", ["Module", "Package"])
    # It ranks below every breadcrumb and up-link rule.
    up = parse(html(body, '<link rel="up" href="../Text.html" title="Text">'), url=API_USE_URL)
    assert (up.trail_method, up.trail) == ("up_link", (Crumb("Text", f"{package}/Text.html"),))


def test_a_site_menu_with_a_current_section_is_not_a_trail():
    # Sections that are siblings in the site's top directory: one level only.
    flat = nav_list('<li><a href="../index.html">Home</a></li>', '<li><a href="../start.html">Start</a></li>',
                    '<li class="active"><a href="index.html">Installation</a></li>',
                    '<li><a href="../blog/">Blog</a></li>')
    assert parse(html(flat + ARTICLE)).trail_method == "url"
    # A section beside the page's directory, not above it, before the current one.
    beside = nav_list('<li><a href="../index.html">Home</a></li>',
                      '<li><a href="../index.html">Installation</a></li>',
                      '<li><a href="../../api/reference.html">API</a></li>',
                      '<li><a aria-current="page" href="setup.html">Setup</a></li>')
    assert parse(html(beside + ARTICLE), url=f"{SITE}/install/linux/setup.html").trail_method == "url"
    # No item marked as the page (two unlinked items styled alike): no trail.
    unmarked = nav_list('<li><a href="../index.html">Home</a></li>',
                        '<li><a href="index.html">Installation</a></li>',
                        '<li class="off">Linux</li>', '<li class="off">Windows</li>')
    assert parse(html(unmarked + ARTICLE)).trail_method == "url"


def test_a_navigation_bar_whose_links_are_not_above_the_page_is_not_a_trail():
    aside = nav_list('<li><a href="../../other/a.html">Other</a></li>',
                     '<li><a href="../../other/deeper/b.html">Deeper</a></li>',
                     '<li class="cell-highlight">Here</li>')
    assert parse(html(aside + ARTICLE), url=f"{SITE}/x/y/page.html").trail_method == "url"
    # Holding directories, but innermost first: not a path from the top.
    reversed_order = nav_list('<li><a href="index.html">Y</a></li>', '<li><a href="../index.html">X</a></li>',
                              '<li class="cell-highlight">Here</li>')
    assert parse(html(reversed_order + ARTICLE), url=f"{SITE}/x/y/page.html").trail_method == "url"


# ------------------------------------------------------------------ title

def test_title_prefers_the_first_h1_of_the_main_content():
    body = ('<header><h1>Example Guide</h1></header>'
            '<div id="content"><h1>Installing on Linux</h1><p>x</p></div>')
    assert parse(html(body)).title == "Installing on Linux"


def test_title_falls_back_to_og_title_then_title_without_site_suffix_then_url():
    og = '<meta property="og:title" content="Linux install">'
    assert parse(html("<p>x</p>", og)).title == "Linux install"
    assert parse(html("<p>x</p>")).title == "Installing on Linux"
    suffixed = html("<p>x</p>", title="htpasswd - Manage users - Apache Server")
    assert parse(suffixed).title == "htpasswd - Manage users"
    assert parse(html("<p>Some text.</p>", title="")).title == "linux"


def test_a_heading_repeating_the_title_opens_no_section():
    body = ('<div class="refentry"><h2>CREATE TABLE</h2><p>define a new table</p>'
            "<h2>Synopsis</h2><p>...</p></div>")
    page = parse(html(body, title="CREATE TABLE"))
    assert page.title == "CREATE TABLE"
    assert [(s.title, s.text) for s in page.sections] == [("CREATE TABLE", "define a new table"),
                                                           ("Synopsis", "...")]


# ------------------------------------------------------------------ sections and text

def test_sections_own_only_their_text_and_skipped_levels_lose_nothing():
    body = """<main><h1>Installing on Linux</h1><p>Intro.</p>
      <h2 id="packages">Packages</h2><p>Use the package manager.</p>
        <h4 id="apt">Debian and Ubuntu</h4><p>Run apt install example.</p>
        <h3 id="rpm">Fedora</h3><p>Run dnf install example.</p>
      <h2>From source</h2><p>Build it yourself.</p></main>"""
    sections = parse(html(body)).sections
    assert [(s.title, s.level, s.anchor, s.path, s.text) for s in sections] == [
        ("Installing on Linux", 0, "", (), "Intro."),
        ("Packages", 2, "packages", ("Packages",), "Use the package manager."),
        ("Debian and Ubuntu", 4, "apt", ("Packages", "Debian and Ubuntu"), "Run apt install example."),
        ("Fedora", 3, "rpm", ("Packages", "Fedora"), "Run dnf install example."),
        ("From source", 2, "", ("From source",), "Build it yourself."),
    ]


def test_text_after_a_closed_subsection_belongs_to_the_enclosing_section():
    body = """<div role="main"><section id="installing-on-linux"><h1>Installing on Linux</h1>
      <section id="packages"><h2>Packages<a class="headerlink" href="#packages">¶</a></h2>
        <p>Use the package manager.</p>
        <section id="apt"><h3>Debian</h3><p>Run apt.</p></section>
        <p>Either way, verify the signature.</p></section>
      <p>Then start the service.</p></section></div>"""
    sections = {s.title: s for s in parse(html(body)).sections}
    assert sections["Installing on Linux"].text == "Then start the service."
    assert sections["Packages"].text == "Use the package manager.\n\nEither way, verify the signature."
    assert sections["Debian"].text == "Run apt."
    assert sections["Debian"].anchor == "apt"
    assert sections["Debian"].path == ("Packages", "Debian")


def test_block_structure_is_kept_and_spaces_collapse():
    body = """<main><h1>Installing on Linux</h1>
      <p>First   paragraph
         over two lines.</p><p>Second paragraph.</p>
      <ul><li>one</li><li>two <b>bold</b></li></ul>
      <table><tr><th>Name</th><th>Value</th></tr><tr><td><p>port</p></td><td>8080</td></tr></table>
      <div class="highlight"><pre>def main():
    return   1
</pre></div><p>Line<br>break</p></main>"""
    assert parse(html(body)).body == (
        "First paragraph over two lines.\n\nSecond paragraph.\n\none\ntwo bold\n\n"
        "| Name | Value\n| port | 8080\n\ndef main():\n    return   1\n\nLine\nbreak"
    )


def test_boilerplate_is_not_body_text():
    body = """<a class="skip-link" href="#main">Skip to content</a>
      <div id="cookie-banner">We use cookies</div><div id="gdprCookieConsent">Accept all?</div>
      <header class="site-header"><div class="logo">Example Docs</div>
        <form role="search"><input></form></header>
      <nav class="sidebar"><ul><li><a href="/">Home nav</a></li></ul></nav>
      <main><nav aria-label="breadcrumb"><a href="/guide/">Guide</a> / <a href="./">Installation</a></nav>
        <h1>Installing on Linux</h1><p>Real text.</p><script>var tracking = 1;</script>
        <style>p {color: red}</style><noscript>Enable JavaScript</noscript>
        <div class="prev-next-area"><a href="windows.html">previous</a></div>
        <footer>Was this page helpful?</footer></main>
      <aside class="toc-sidebar">On this page</aside><footer>Copyright Example</footer>"""
    page = parse(html(body))
    assert page.body == "Real text."
    assert page.trail == INSTALL_TRAIL


def test_chrome_is_pruned_when_no_main_region_is_marked_up():
    body = """<div id="hd"><h1><a href="../index.html">Example 3.2 documentation</a></h1>
      <div class="nav"><a href="index.html" title="Installation" accesskey="U">up</a></div></div>
      <div id="bd"><div class="section" id="s-installing"><h1>Installing on Linux</h1><p>Real text.</p>
      <div class="sidebar-box">unrelated</div></div>
      <div class="yui-b" id="sidebar"><h3>Contents</h3><ul><li>x</li></ul></div></div>
      <div id="ft">Last update</div><div class="cookie-law-info-bar">We use cookies</div>"""
    page = parse(html(body))
    assert (page.title, page.body) == ("Installing on Linux", "Real text.")
    assert page.sections[0].title == "Installing on Linux"
    assert (page.trail_method, page.trail) == ("up_link", INSTALL_TRAIL)


def test_skip_links_are_dropped_without_a_main_region():
    body = """<a href="#content" class="visually-hidden-focusable">Skip to main content</a>
      <a class="skiplink" href="#nav">Navigation</a>
      <div><h1>Installing on Linux</h1><p>See <a href="#req">requirements</a>.</p></div>"""
    assert parse(html(body)).body == "See requirements."


def test_inside_a_marked_main_region_article_headers_and_asides_stay():
    body = """<article><header><h1>Installing on Linux</h1><p class="byline">By the docs team</p></header>
      <p>Body.</p><aside class="footnote" id="f1"><p>A footnote.</p></aside></article>"""
    assert parse(html(body)).body == "By the docs team\n\nBody.\n\nA footnote."


def test_heading_anchors_come_from_the_heading_its_section_or_a_named_anchor():
    body = """<main><h1>Installing on Linux</h1>
      <h2 id="own">Own id</h2>
      <section id="sec"><h2>Section id<a class="headerlink" href="#sec">¶</a></h2></section>
      <div class="sect2"><div class="titlepage"><h2><a name="named"></a>Named anchor</h2></div></div>
      </main>"""
    sections = parse(html(body)).sections[1:]
    assert [(s.title, s.anchor) for s in sections] == [
        ("Own id", "own"), ("Section id", "sec"), ("Named anchor", "named")]


def test_permalink_glyphs_are_neither_title_nor_text():
    body = """<main><h1>Installing on Linux<a class="headerlink" href="#x">¶</a></h1>
      <dl><dt id="example.run">example.run(x)<a class="headerlink" href="#example.run">¶</a></dt>
      <dd><p>Runs it.</p></dd></dl><h2>Notes #</h2></main>"""
    page = parse(html(body))
    assert page.title == "Installing on Linux"
    assert page.sections[0].text == "example.run(x)\n\nRuns it."
    assert page.sections[1].title == "Notes"


# ------------------------------------------------------------------ metadata

def test_metadata_canonical_language_and_nav_order():
    head = """<meta name="description" content="How to  install.">
      <meta name="keywords" content="install, linux,,setup"><meta name="keywords" content="setup, apt">
      <link rel="canonical" href="/guide/install/linux/">"""
    body = """<main><h1>Installing on Linux</h1><div class="toctree-wrapper compound"><ul>
      <li><a href="apt.html">apt</a><ul><li><a href="apt.html#keys">keys</a></li></ul></li>
      <li><a href="rpm.html">rpm</a></li><li><a href="#local">this page</a></li>
      <li><a href="https://elsewhere.example/x.html">elsewhere</a></li></ul></div></main>"""
    page = parse(html(body, head, lang="en-GB"))
    assert page.url == URL
    assert page.canonical_url == f"{SITE}/install/linux"
    assert page.site == SITE
    assert page.description == "How to install."
    assert page.keywords == ("install", "linux", "setup", "apt")
    assert page.language == "en-GB"
    assert page.nav_order == (f"{SITE}/install/apt.html", f"{SITE}/install/rpm.html")


def test_base_href_resolves_links():
    head = '<base href="https://docs.example.com/guide/install/deep/">'
    body = '<ol class="breadcrumb"><li><a href="../">Installation</a></li><li>Here</li></ol>' + ARTICLE
    assert parse(html(body, head)).trail == INSTALL_TRAIL


def test_content_hash_follows_what_is_stored():
    first = parse(html(ARTICLE))
    assert parse(html(ARTICLE)).content_hash == first.content_hash
    assert parse(html(ARTICLE.replace("64-bit", "32-bit"))).content_hash != first.content_hash
    moved = parse(html(ARTICLE, '<link rel="up" href="../other/">'))
    assert moved.content_hash != first.content_hash


def test_unicode_spaces_are_normalized_in_bodies_and_titles():
    body = ("<main><h1>Install\u00a0on\u2009Linux</h1><p>Run&nbsp;&nbsp;the\u202fscript\u3000now.</p>"
            "<pre>a\u00a0=\u00a01</pre></main>")
    page = parse(html(body))
    assert page.title == "Install on Linux"
    assert page.body == "Run the script now.\n\na = 1"


def test_block_boundaries_are_kept_around_wrapper_divs():
    body = ('<div id="content"><h1>Guide</h1><div class="wrapper"><p>First paragraph.</p></div>'
            "Text after the wrapper.<div>Intro line<div>Nested block</div>tail</div></div>")
    page = parse(html(body))
    assert page.body.split("\n\n") == ["First paragraph.", "Text after the wrapper.", "Intro line",
                                        "Nested block", "tail"]


def test_a_contents_list_of_the_page_own_sections_is_not_text_but_one_of_other_pages_is():
    """A long page's contents at its top (links to its own anchors) repeats its headings;
    a chapter's contents linking its pages is the page's text and its children's order."""
    own = ('<div class="toc"><p><b>Table of Contents</b></p><dl class="toc">'
           '<dt><a href="#setup">1. Setup</a></dt><dt><a href="linux.html#usage">2. Usage</a></dt></dl></div>')
    body = (f'<div id="content"><h1>Installing on Linux</h1>{own}<h2 id="setup">1. Setup</h2><p>Unpack it.</p>'
            '<h2 id="usage">2. Usage</h2><p>Run it.</p></div>')
    page = parse(html(body))
    assert "Table of Contents" not in page.body and page.sections[0].text == ""
    others = ('<div id="content"><h1>Installation</h1><div class="toctree-wrapper"><ul>'
              '<li><a href="linux.html">On Linux</a></li><li><a href="windows.html">On Windows</a></li></ul></div></div>')
    index = parse(html(others), url=f"{SITE}/install/index.html")
    assert index.body == "On Linux\nOn Windows"
    assert index.nav_order == (f"{SITE}/install/linux.html", f"{SITE}/install/windows.html")


def test_a_language_picker_is_not_text_but_a_paragraph_naming_a_translation_is():
    picker = ('<div class="languages"><p><span>Available Languages: </span><a href="../en/linux.html">en</a> | '
              '<a href="../fr/linux.html" hreflang="fr" rel="alternate">fr</a> | '
              '<a href="../ja/linux.html" hreflang="ja" rel="alternate">ja</a></p></div>')
    prose = ('<p>This guide was written in French first; <a href="../fr/linux.html" hreflang="fr">the original'
             '</a> has the installer screenshots.</p>')
    page = parse(html(f"<main><h1>Installing on Linux</h1>{picker}<p>Download it.</p>{prose}{picker}</main>"))
    assert page.body == ("Download it.\n\nThis guide was written in French first; the original has the "
                         "installer screenshots.")


def test_section_sign_links_ending_a_paragraph_are_dropped():
    body = '<main><h1>Notes</h1><p>Fix a crash (Jane Doe) <a href="#n1">§</a> <a href="#n2">§</a></p></main>'
    assert parse(html(body)).body == "Fix a crash (Jane Doe)"


def test_an_empty_or_tiny_main_region_is_not_trusted():
    body = ('<header><a href="/">Home</a></header><main id="app"></main>'
            '<div id="content"><h1>Installing on Linux</h1><p>Download the archive for your distribution '
            "and unpack it.</p></div>")
    page = parse(html(body))
    assert page.title == "Installing on Linux"
    assert page.body == "Download the archive for your distribution and unpack it."
    tiny = parse(html('<main><p>Loading…</p></main><article><h1>Real</h1><p>' + "Real text. " * 10 + "</p></article>"))
    assert tiny.title == "Real" and tiny.body.startswith("Real text.")


# ------------------------------------------------------------------ decoding and failures

@pytest.mark.parametrize("data, title, text", [
    # A UTF-8 byte-order mark, and a meta charset that contradicts it: the mark wins.
    (b"\xef\xbb\xbf" + html("<h1>Caf\u00e9</h1><p>cr\u00e8me</p>").replace("utf-8", "iso-8859-1").encode(),
     "Caf\u00e9", "cr\u00e8me"),
    # An HTTP-style declaration in <meta http-equiv>, windows-1252 bytes.
    (('<html><head><meta http-equiv="Content-Type" content="text/html; charset=windows-1252">'
      "<title>T</title></head><body><h1>\u201cQuoted\u201d</h1><p>5 \u20ac</p></body></html>").encode("cp1252"),
     "\u201cQuoted\u201d", "5 \u20ac"),
    # A wrong declaration (says Shift_JIS, is UTF-8 that does not decode as such).
    (html("<h1>Gr\u00fc\u00dfe</h1><p>\u00fcber</p>").replace("utf-8", "shift_jis").encode("utf-8"),
     "Gr\u00fc\u00dfe", "\u00fcber"),
    # UTF-8 with windows-1252 smart quotes pasted in.
    (html("<h1>Na\u00efve</h1><p>QUOTE</p>").encode("utf-8").replace(b"QUOTE", "\u201chi\u201d".encode("cp1252")),
     "Na\u00efve", "\u201chi\u201d"),
])
def test_decoding_by_mark_declaration_and_mixed_bytes(data, title, text):
    page = parse(data)
    assert (page.title, page.body) == (title, text)


def test_cp1252_bytes_declared_utf8_decode_without_mojibake():
    data = html("<main><h1>Café</h1><p>naïve “quotes” – 5 €</p></main>").encode("cp1252")
    page = parse(data)
    assert page.title == "Café"
    assert page.body == "naïve “quotes” – 5 €"


def test_declared_legacy_charset_and_byte_order_mark():
    latin = ('<html><head><meta http-equiv="Content-Type" content="text/html; charset=iso-8859-1">'
             "</head><body><h1>Größe</h1><p>Maße</p></body></html>").encode("latin-1")
    assert parse(latin).title == "Größe"
    utf16 = "\ufeff" + html("<h1>Überblick</h1><p>Text</p>")
    assert parse(utf16.encode("utf-16-le")).title == "Überblick"


@pytest.mark.parametrize("data, reason", [
    (b"", "empty"),
    (b"  \n\t  ", "empty"),
    (bytes(range(256)) * 64, "binary"),
    (b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj", "binary"),
    (b"<!-- nothing but a comment -->", "no_content"),
    (b"<html><body><div> </div></body></html>", "no_content"),
])
def test_unparseable_inputs(data, reason):
    with pytest.raises(UnparseablePage) as caught:
        parse(data)
    assert caught.value.reason == reason


def test_stray_control_and_private_use_characters_are_survived():
    body = ("<main><h1>Keys</h1><p>Press Ctrl\x1aZ\x0b to stop.</p>"
            "<h2>\ue002h9\ue003Icons \ue000</h2><p>x</p></main>")
    page = parse(html(body))
    assert page.sections[0].text == "Press CtrlZ to stop."
    assert [s.text for s in page.sections[1:]] == ["x"]


def test_over_the_limit_is_refused_before_parsing():
    with pytest.raises(UnparseablePage) as caught:
        parse(html(ARTICLE), max_bytes=100)
    assert caught.value.reason == "too_large"


def test_a_title_without_text_is_still_a_page():
    page = parse("<html><head><title>Section index</title></head><body></body></html>")
    assert (page.title, page.body, len(page.sections)) == ("Section index", "", 1)


def parse_in_bounded_time(data: bytes, seconds: float = 20):
    """The page parsed, failing if that took longer than `seconds` (far above what
    these inputs take; a blow-up takes minutes)."""
    started = time.perf_counter()
    page = parse(data)
    assert time.perf_counter() - started < seconds
    return page


def test_ten_megabyte_page_parses_in_reasonable_time():
    paragraph = "<p>" + "Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 8 + "</p>\n"
    sections = "".join(f'<section id="s{i}"><h2>Part {i}</h2>{paragraph * 40}</section>' for i in range(600))
    data = html(f"<main><h1>Big</h1>{sections}</main>").encode()
    assert len(data) > 10 * 1024 * 1024
    page = parse_in_bounded_time(data)
    assert len(page.sections) == 601
    assert page.sections[-1].text.count("Lorem") == 8 * 40


# ------------------------------------------------------------------ the real corpus, where present

CORPUS = DEV_CORPUS
# product -> rule expected to place its pages (from the markup each product shows)
EXPECTED_METHODS = {
    "python": "related_bar", "sphinx": "related_bar", "flask": "related_bar",
    "linux": "breadcrumb", "apache-httpd": "breadcrumb", "pandas": "toc_current",
    "postgresql": "up_link", "django": "up_link", "debian-reference": "up_link", "openjdk": "title_context",
}


@pytest.mark.skipif(not (CORPUS / "manifest.tsv").exists(), reason="corpus not present")
def test_real_corpus_pages_are_placed_by_their_markup():
    with open(CORPUS / "manifest.tsv", newline="") as manifest:
        rows = list(csv.DictReader(manifest, delimiter="\t"))
    for product, method in EXPECTED_METHODS.items():
        # Skip top-level pages where there are others: their markup may name nothing but the page itself.
        paths = [r["relative_path"] for r in rows if r["product"] == product and r["relative_path"] != "index.html"]
        paths = [p for p in paths if "/" in p] or paths
        methods = []
        for relative in paths[:: max(1, len(paths) // 4)][:4]:
            data = (CORPUS / product / relative).read_bytes()
            page = parse_page(data, f"http://localhost/{product}/{relative}", f"http://localhost/{product}")
            methods.append(page.trail_method)
            assert page.title and page.body, (product, relative)
            assert all(c.url is None or c.url.startswith(f"http://localhost/{product}/") for c in page.trail)
        # Index pages (all classes, all packages) may lack the markup the rest has.
        assert methods.count(method) >= 3, (product, methods)


@pytest.mark.parametrize("depth", [3_000, 100_000])
def test_text_nested_deeper_than_the_parser_goes_is_refused_not_cut(depth):
    html = (b"<html><head><title>Deep</title></head><body><p>before</p>" + b"<div>" * depth + b"deep text"
            + b"</div>" * depth + b"<p>after</p></body></html>")
    with pytest.raises(UnparseablePage) as refused:
        parse_page(html, "https://example.com/deep.html", "https://example.com/")
    assert refused.value.reason == "too_deep"


def test_nesting_the_parser_handles_keeps_all_text():
    depth = 2_000
    html = (b"<html><head><title>Deep</title></head><body><p>before</p>" + b"<div>" * depth + b"deep text"
            + b"</div>" * depth + b"<p>after</p></body></html>")
    page = parse_page(html, "https://example.com/deep.html", "https://example.com/")
    assert page.body.split() == ["before", "deep", "text", "after"]


# ------------------------------------------------------------------ the links of the page's text

LINKED_PAGE = f"""
<nav class="site-menu"><a href="{SITE}/">Home</a> <a href="{SITE}/reference/api.html">API (menu)</a></nav>
<div class="sidebar"><a href="{SITE}/faq.html">FAQ (sidebar)</a></div>
<main>
  <ol class="breadcrumb"><li><a href="{SITE}/">Guide</a></li><li><a href="../install/">Installation</a></li>
    <li>Linux</li></ol>
  <h1 id="top">Installing on Linux</h1>
  <p>Build it with <a href="../build.html#make%20flags">the  make
     flags</a>, then read <a href="../reference/api.html">the API</a>, <a href="#top">the top</a>,
     <a href="linux.html#requirements">requirements</a>, <a href="mailto:dev@example.com">mail us</a>,
     <a href="javascript:void(0)">toggle</a>, <a href="https://other.example.org/x">elsewhere</a>,
     <a href="../build.html#make%20flags">make flags again</a>,
     <a href="../logo.html"><img src="logo.png" alt="The logo"></a> and <a href="../install">up</a>.</p>
  <div class="toctree-wrapper"><ul><li><a href="linux/debian.html">Debian</a></li></ul></div>
  <div class="related"><a href="{SITE}/windows.html">Windows (related bar)</a></div>
  <div class="prev-next"><a href="../macos.html">Previous: macOS</a></div>
  <p><a rel="next" href="../bsd.html">BSD</a> <a accesskey="p" href="../solaris.html">Solaris</a></p>
  <footer><a href="{SITE}/legal.html">Legal</a></footer>
</main>"""


def test_links_are_those_of_the_text_not_of_its_navigation():
    page = parse(html(LINKED_PAGE))
    assert page.trail == INSTALL_TRAIL
    assert [(link.url, link.fragment, link.anchor_text, link.position) for link in page.links] == [
        (f"{SITE}/build.html", "make flags", "the make flags", 0),
        (f"{SITE}/reference/api.html", "", "the API", 1),  # also in the menu: kept for the text's link
        ("https://other.example.org/x", "", "elsewhere", 2),
        (f"{SITE}/logo.html", "", "The logo", 3),  # an image link: its alt text
    ]
    # Menu, sidebar, breadcrumb trail, table of contents, related bar, pager, footer, rel/accesskey
    # pager links, the page itself (any fragment), its trail's pages, non-web schemes: no link.
    assert page.links_past_cap == 0
    # Counted as navigation: menu 2, sidebar 1, breadcrumb 2, table of contents 1, related bar 1,
    # pager bar 1, rel/accesskey pagers 2, footer 1; the text's own links (kept or not) are not.
    assert page.links_navigation == 11


def test_links_inside_a_marked_main_regions_own_menu_are_navigation():
    page = parse(html('<main><div class="menu"><a href="a.html">A</a><a href="b.html">B</a></div>'
                      '<h1>Installing on Linux</h1><p>Long enough text that links to <a href="c.html">C</a>.</p>'
                      '</main>'))
    assert [link.anchor_text for link in page.links] == ["C"]


def test_structured_breadcrumbs_inside_the_text_are_no_links():
    crumbs = "".join(f'<li itemprop="itemListElement" itemscope itemtype="https://schema.org/ListItem">'
                     f'<a itemprop="item" href="{href}"><span itemprop="name">{name}</span></a></li>'
                     for href, name in ((f"{SITE}/", "Guide"), (f"{SITE}/install", "Installation"), (URL, "Linux")))
    page = parse(html(f'<main><ol itemscope itemtype="https://schema.org/BreadcrumbList">{crumbs}</ol>'
                      f'<h1>Installing on Linux</h1><p>See the <a href="../faq.html">FAQ</a> first.</p></main>'))
    assert page.trail_method == "microdata"
    assert [link.url for link in page.links] == [f"{SITE}/faq.html"]


def test_a_page_of_200k_links_parses_in_bounded_time_and_keeps_the_cap():
    links = "".join(f'<a href="p{i}.html">page {i}</a> ' for i in range(200_000))
    data = html(f"<main><h1>Links</h1><p>{links}</p></main>").encode()
    assert len(data) > 5 * 1024 * 1024
    page = parse_in_bounded_time(data)
    assert len(page.links) == MAX_PAGE_LINKS
    assert page.links[-1] == Link(f"{SITE}/install/p999.html", "", "page 999", 999)
    assert page.links_past_cap == 200_000 - MAX_PAGE_LINKS
    assert page.links_navigation == 0


def test_a_long_anchor_text_is_cut():
    page = parse(html(f'<main><h1>Installing on Linux</h1><p><a href="a.html">{"word " * 1000}</a></p></main>'))
    assert len(page.links[0].anchor_text) == MAX_ANCHOR_CHARS
