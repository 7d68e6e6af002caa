"""Deterministic synthetic documentation corpus, for scale tests and benchmarks.

`iter_pages(config)` streams (relative path, HTML bytes) pairs; `generate_corpus`
writes the same pages under `out_dir/<site>/<path>.html`. A page's URL is
`config.base_url + "/" + path`; every site has a home page `<site>/index.html`,
section pages are `<dir>/index.html` and leaf pages `<dir>/<slug>.html`.

Determinism: every random choice comes from a `random.Random` seeded with a string
made of `config.seed` and the page's path, so the same config gives byte-identical
files (no clock, no uuid, no hash randomization).

Streaming: a site's tree is never materialized. Each node knows how many pages its
subtree holds; a depth-first walk splits that number among the node's children on
arrival, so the walk keeps O(depth * fanout) nodes alive, whatever the page count.

Realism, because the parser and the index are what these pages exercise:
* boilerplate around the content (header nav, sidebar, "on this page" box, footer),
  which the parser must drop;
* a breadcrumb trail matching the page's real position, in the site's families
  (JSON-LD, ARIA list, schema.org microdata; some sites carry two that agree), and
  a small fraction of pages without one so that the URL fallback is exercised;
* prose from a fixed vocabulary with Zipf-like frequencies plus per-page topic
  words, so that BM25 statistics and embeddings are not uniform noise;
* common titles ("Installation", "Logging", ...) recurring across and within sites;
* uneven site sizes and uneven section sizes.
"""
from __future__ import annotations

import html
import json
import os
import random
import re
from dataclasses import dataclass
from string import Formatter
from typing import Callable, Iterator, Sequence
from urllib.parse import urlsplit

from ritrag.flags import option


@dataclass(frozen=True)
class SynthConfig:
    # The flags of `ritrag synth`.
    pages: int = option(help="pages to write")
    sites: int = option(4, "sites (forest roots)")
    depth: int = option(4, "levels of each site's tree")  # max depth below a site's home page
    fanout: int = option(8, "children per inner page")  # children per section page (approximate)
    words: int = option(400, "words of body text per page")  # mean body words per page
    seed: int = option(0, "random seed (same seed, same files)")
    base_url: str = option("https://synth.example", "the sites' public URL")  # sites live under base_url/<site-name>/

    def __post_init__(self) -> None:
        for name in ("pages", "sites", "depth", "fanout", "words"):
            if getattr(self, name) < 1:
                raise ValueError(f"SynthConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.base_url.endswith("/"):
            raise ValueError("SynthConfig.base_url must not end with '/'")


@dataclass(frozen=True)
class SynthOutput:
    """Where `generate_corpus` writes: `ritrag synth`'s --out."""

    out: str | None = option(None, "directory to write them to")


def generate_corpus(out_dir: str, config: SynthConfig) -> dict:
    """Write the corpus under `out_dir` (existing files of the same name are
    overwritten) and return {"pages", "bytes", "sites"}."""
    pages = written = 0
    for path, data in iter_pages(config):
        target = os.path.join(out_dir, *path.split("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as f:
            f.write(data)
        pages += 1
        written += len(data)
    return {"pages": pages, "bytes": written, "sites": min(config.sites, config.pages)}


def iter_pages(config: SynthConfig) -> Iterator[tuple[str, bytes]]:
    """(relative path, HTML bytes) of every page, site by site, depth first."""
    for site in _sites(config):
        home = _Node(f"{site.dir}/{_SECTION_FILE}", f"{site.name} Documentation", site.pages)
        top_sections = _children(config, site, home, config.depth)
        yield from _walk(config, site, top_sections, home, (), (home,), config.depth)


# --------------------------------------------------------------------------- vocabulary
# The vocabulary is fixed (independent of config.seed) so that corpora generated with
# different seeds share term statistics, as documentation sites do.

_NOUNS = tuple(dict.fromkeys("""
    server client cluster node pod container image volume disk network request response
    header payload token key secret certificate credential user role permission policy
    group account project workspace namespace service endpoint route gateway proxy
    balancer cache index query schema table column row record field document collection
    database transaction lock replica shard partition segment log metric trace span event
    alert dashboard monitor probe job task worker queue topic message stream batch pipeline
    stage step trigger hook plugin extension module package library dependency version
    release build artifact registry repository branch commit tag environment variable
    setting option parameter argument flag value limit quota timeout retry backoff
    threshold interval window buffer file directory path bucket object blob snapshot
    backup migration upgrade rollback deployment instance region zone host port socket
    connection session cookie domain address protocol handler callback listener function
    method class interface type struct array list map string integer boolean pointer
    reference error exception warning status code state context scope template layout
    component widget view page form input output format encoding locale language
    timestamp date duration schedule period counter gauge histogram sample rate
    throughput latency capacity memory thread process runtime compiler interpreter parser
    tokenizer serializer encoder decoder checksum hash signature algorithm cipher entry
    item element resource asset manifest configuration profile preset rule filter
    selector matcher pattern expression operator statement clause condition constraint
    annotation label attribute property owner member tenant organization team
    subscription plan usage report summary result score rank weight vector embedding model
    dataset feature prediction checkpoint inference prompt agent tool command shell script
    terminal console editor workflow scheduler controller daemon sidecar mesh ingress
    firewall subnet tunnel bridge adapter driver connector provider consumer producer
    publisher subscriber broker channel signal mutex semaphore heap stack frame block
    chunk offset cursor iterator generator sequence range slice tuple lease heartbeat
    quorum leader follower election ledger journal audit retention lifecycle archive tier
    storage bandwidth traffic origin edge webhook
""".split()))

_VERBS = tuple(dict.fromkeys("""
    configure deploy install enable disable create delete update return read write store
    cache index query parse validate render build run start stop restart schedule retry
    send receive publish encrypt decrypt compress load save register resolve fetch merge
    split sort filter map reduce log monitor trace measure limit allocate release lock
    unlock sync replicate migrate upgrade export import convert generate handle process
    emit collect aggregate expose mount bind connect authenticate authorize verify sign
    rotate expire refresh invalidate compile link package bundle test debug profile
    optimize scale balance route forward proxy throttle queue batch stream flush commit
    persist restore archive prune purge watch notify trigger invoke call override extend
    wrap inject serialize encode decode hash match search rank score select define
    declare specify reset apply accept reject ignore skip throw catch raise poll spawn
    attach detach share cancel
""".split()))

_ADJECTIVES = tuple(dict.fromkeys("""
    default custom optional required internal external remote local global dynamic static
    persistent temporary primary secondary public private secure encrypted compressed
    distributed concurrent parallel asynchronous synchronous incremental partial full
    empty invalid valid stale fresh active idle pending failed healthy unhealthy available
    unavailable writable immutable mutable nested flat hierarchical sparse dense large
    small maximum minimum initial final current previous new legacy deprecated
    experimental stable native managed unmanaged shared dedicated isolated transient
    durable consistent ordered unordered sorted unique duplicate recursive lazy eager
    verbose quiet strict lenient automatic manual scheduled periodic upstream downstream
    regional multiple single additional specific generic abstract concrete hidden visible
    raw structured binary textual numeric absolute relative
""".split()))

# Titles real documentation sites share, so that the same title recurs across sites
# (and, for the deeper ones, within a site) as it does on the web.
_TOP_SECTION_TITLES = (
    "Getting Started", "Installation", "Configuration", "Concepts", "Guides", "Tutorials",
    "How-To Guides", "API Reference", "CLI Reference", "Deployment", "Security", "Logging",
    "Monitoring", "Troubleshooting", "Integrations", "Plugins", "Administration",
    "Release Notes", "FAQ", "Architecture", "Networking", "Storage", "Authentication",
    "Performance", "Migration", "Development", "Examples", "SDKs", "Best Practices",
    "Glossary",
)
_COMMON_TITLES = (
    "Overview", "Installation", "Configuration", "Logging", "Troubleshooting", "Examples",
    "Quickstart", "Authentication", "Limits and Quotas", "Environment Variables",
    "Permissions", "Best Practices", "FAQ", "Changelog", "Migration Guide", "Monitoring",
    "Security", "Performance Tuning", "Error Codes", "Glossary",
)
_COMMON_TITLE_FRACTION = 0.1
_NO_TRAIL_FRACTION = 0.05
_SMALL_TITLE_WORDS = frozenset({"a", "and", "for", "in", "of", "the", "to", "with"})

_ONSETS = ("b", "c", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z",
           "br", "cr", "dr", "fl", "gr", "kr", "pl", "pr", "st", "tr", "qu", "sh", "th")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "io", "ou")
_CODAS = ("", "", "", "n", "r", "s", "l", "x", "m", "t", "nd", "rk")


def _component_names(count: int) -> tuple[str, ...]:
    """Invented product and component names: the rare, site-specific terms that make
    BM25 useful on real documentation."""
    rng = random.Random("ritrag-synth-components")
    taken = set(_NOUNS) | set(_VERBS) | set(_ADJECTIVES)
    names: dict[str, None] = {}
    while len(names) < count:
        syllables = rng.choice((2, 2, 3))
        word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables))
        word += rng.choice(_CODAS)
        if word not in taken:
            names[word.capitalize()] = None
    return tuple(names)


_COMPONENTS = _component_names(3000)


def _plural(noun: str) -> str:
    if noun.endswith(("s", "x", "z", "ch", "sh")):
        return noun + "es"
    if noun.endswith("y") and noun[-2:-1] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"


_NOUN_PLURALS = {noun: _plural(noun) for noun in _NOUNS}
_VERB_THIRD_PERSON = {verb: _plural(verb) for verb in _VERBS}  # same spelling rules


@dataclass(frozen=True, eq=False)  # identity hash: cheap as a dict key per draw
class _WordClass:
    words: tuple[str, ...]
    cum_weights: tuple[float, ...]


def _zipf_class(words: Sequence[str], exponent: float = 1.0, shift: float = 2.7) -> _WordClass:
    """Zipf-Mandelbrot frequencies by list position: natural-language-like term
    statistics (a few very common words, a long tail of rare ones)."""
    total = 0.0
    cum_weights = []
    for rank in range(len(words)):
        total += 1.0 / (rank + shift) ** exponent
        cum_weights.append(total)
    return _WordClass(tuple(words), tuple(cum_weights))


_NOUN_CLASS = _zipf_class(_NOUNS)
_VERB_CLASS = _zipf_class(_VERBS)
_ADJECTIVE_CLASS = _zipf_class(_ADJECTIVES)
_COMPONENT_CLASS = _zipf_class(_COMPONENTS)
_NUMBERS = (2, 3, 5, 8, 10, 16, 30, 32, 60, 64, 100, 128, 256, 500, 1000, 1024, 4096)


class _WordSource:
    """The words of one page. Draws are batched because `random.choices` spreads its
    per-call cost over k draws, which is most of the generator's speed."""

    _BATCH = 32

    def __init__(self, rng: random.Random, topic_nouns: Sequence[str], component: str):
        self.rng = rng
        self.topic_nouns = tuple(topic_nouns)
        self.component = component
        self._drawn: dict[_WordClass, list[str]] = {}

    def take(self, word_class: _WordClass) -> str:
        drawn = self._drawn.get(word_class)
        if not drawn:
            drawn = self.rng.choices(word_class.words, cum_weights=word_class.cum_weights,
                                     k=self._BATCH)
            self._drawn[word_class] = drawn
        return drawn.pop()

    def topic(self) -> str:
        return self.rng.choice(self.topic_nouns)


def _identifier(words: _WordSource) -> str:
    return f"{words.take(_ADJECTIVE_CLASS)}_{words.take(_NOUN_CLASS)}"


# Slots of the sentence, heading and title templates. T is one of the page's topic
# nouns and P the page's own component: repeating them is what makes a page about
# something.
_FILLERS: dict[str, Callable[[_WordSource], str]] = {
    "N": lambda w: w.take(_NOUN_CLASS),
    "Ns": lambda w: _NOUN_PLURALS[w.take(_NOUN_CLASS)],
    "V": lambda w: _VERB_THIRD_PERSON[w.take(_VERB_CLASS)],
    "Vb": lambda w: w.take(_VERB_CLASS),
    "A": lambda w: w.take(_ADJECTIVE_CLASS),
    "C": lambda w: w.take(_COMPONENT_CLASS),
    "T": lambda w: w.topic(),
    "Ts": lambda w: _NOUN_PLURALS[w.topic()],
    "P": lambda w: w.component,
    "K": lambda w: f"<code>{_identifier(w)}</code>",
    "D": lambda w: str(w.rng.choice(_NUMBERS)),
}


@dataclass(frozen=True)
class _Template:
    parts: tuple[tuple[str, Callable[[_WordSource], str] | None], ...]
    word_count: int

    def fill(self, words: _WordSource) -> str:
        out = []
        for literal, filler in self.parts:
            out.append(literal)
            if filler is not None:
                out.append(filler(words))
        text = "".join(out)
        return text[:1].upper() + text[1:]


def _templates(*texts: str) -> tuple[_Template, ...]:
    parsed = []
    for text in texts:
        parts = tuple((literal, _FILLERS[field] if field else None)
                      for literal, field, _, _ in Formatter().parse(text))
        parsed.append(_Template(parts, len(text.split())))
    return tuple(parsed)


_SENTENCES = _templates(
    "The {N} {V} the {A} {N} before the {T} is {A}.",
    "When the {T} is {A}, {C} {V} every {N} in the {N}.",
    "You can {Vb} the {T} with the {K} option.",
    "By default, each {T} {V} up to {D} {Ns} per {N}.",
    "To {Vb} {A} {Ts}, {Vb} the {N} first and then {Vb} the {N}.",
    "This {N} {V} how {Ts} and {Ns} interact with {P}.",
    "Each {T} has its own {A} {N} and {N}.",
    "If the {N} {V} the {T}, {P} {V} the {A} {N}.",
    "Use {K} to {Vb} {A} {Ns}.",
    "{P} {V} {Ns} in the background and {V} the {N} when the {N} becomes {A}.",
    "Note that the {N} must be {A} before {P} can {Vb} the {T}.",
    "The {K} setting controls how often the {T} {V} its {Ns}.",
    "Set {K} to {D} if your {Ns} are {A}.",
    "{Ts} are {A} by default, so you rarely need to {Vb} them.",
    "In most deployments the {T} runs next to the {C} {N}.",
    "For {A} {Ns}, {P} {V} the {N} and {V} the {A} {N}.",
    "The {C} {N} {V} {Ns} from the {T} every {D} seconds.",
    "Older releases used to {Vb} the {N} directly; newer ones {Vb} the {T} instead.",
    "See the {C} documentation for details on {A} {Ns}.",
    "Any {T} that is {A} cannot {Vb} {Ns}.",
    "{P} keeps one {N} per {T}, which makes {A} {Ns} cheap to {Vb}.",
    "The {N} returned by {K} is {A} and can be reused across {Ns}.",
    "Call {K} whenever the {T} changes, or the {N} may become {A}.",
    "Every {N} is identified by its {N} and its {T}.",
    "Avoid {A} {Ns} in production: they {Vb} the {T} on every {N}.",
)
_DESCRIPTIONS = _templates(
    "How {P} {V} {A} {Ts}.",
    "Learn how to {Vb} the {T} and {Vb} {A} {Ns}.",
    "Reference for the {T} and its {A} {Ns}.",
    "{Ts}, {Ns} and {A} {Ns} explained.",
)
_HEADINGS = _templates(
    "Overview", "Prerequisites", "Limitations", "Next steps", "Example",
    "Configuring the {T}", "{A} {Ts}", "How the {T} works", "{T} options",
    "Working with {Ns}", "Troubleshooting {A} {Ts}", "Using {C} with {Ts}",
    "The {N} {N}", "{Vb} the {T}",
)
_PAGE_TITLES = _templates(
    "{A} {Ns}", "{N} {N}", "Configuring {Ns}", "Managing the {C} {N}", "Using {C}",
    "Deploying {A} {Ns}", "Monitoring {Ns}", "Securing the {N}", "Scaling {Ns}",
    "{N} Reference", "{C} {N} API", "{N} Options", "Working with {Ns}", "{C}",
    "{A} {N} Overview", "Writing {A} {Ns}",
)

_CODE_SAMPLES = (
    ("python", """import {package}

client = {package}.Client("{endpoint}")
result = client.{verb}_{noun}("{component}", {identifier}={number})
for item in result.{nouns}:
    print(item.{identifier2})"""),
    ("bash", """$ pip install {package}
$ {package} {verb} {noun} --{flag} {number}
$ {package} {noun} list --output json"""),
    ("yaml", """{noun}:
  {identifier}: {number}
  {identifier2}: {adjective}
  {nouns}:
    - name: {component}
      {verb}: true"""),
    ("json", """{{
  "{noun}": {{
    "{identifier}": {number},
    "{identifier2}": "{adjective}"
  }}
}}"""),
)


# --------------------------------------------------------------------------- site trees

@dataclass(frozen=True)
class _Site:
    dir: str  # e.g. "site-03": the first path segment
    name: str
    package: str  # the product's identifier in code samples and repository URLs
    pages: int
    fanout: int  # config.fanout, raised when the site's pages do not fit in config.depth
    breadcrumb_formats: tuple[str, ...]
    home_label: str  # the first crumb: "Home", "Docs" or the site name, as sites differ


_SECTION_FILE = "index.html"  # a section's own page, in the section's directory


@dataclass(frozen=True)
class _Node:
    path: str  # relative file path, e.g. "site-03/guides/logging.html"
    title: str
    size: int  # pages in the subtree rooted here, this one included

    @property
    def is_section(self) -> bool:
        return self.size > 1

    @property
    def is_home(self) -> bool:
        return self.path.count("/") == 1 and self.path.endswith("/" + _SECTION_FILE)

    @property
    def link_path(self) -> str:
        """Path as links spell it: sections as their directory, like real sites."""
        return self.path[: -len(_SECTION_FILE)] if self.is_section else self.path


_BREADCRUMB_FORMATS = (("jsonld",), ("aria",), ("microdata",), ("jsonld", "aria"))
_HOME_LABELS = ("Home", "Docs", None)  # None: the site name


def _apportion(amount: int, weights: Sequence[float]) -> list[int]:
    """Split `amount` into integers proportional to `weights` (largest remainder)."""
    total = sum(weights)
    shares = [amount * weight / total for weight in weights]
    parts = [int(share) for share in shares]
    by_remainder = sorted(range(len(shares)), key=lambda i: parts[i] - shares[i])
    for i in by_remainder[: amount - sum(parts)]:
        parts[i] += 1
    return parts


def _capacity(fanout: int, levels: int) -> int:
    """Pages a tree of `levels` levels below its root holds at `fanout` children each."""
    return sum(fanout**level for level in range(levels + 1))


def _fitting_fanout(pages: int, depth: int, fanout: int) -> int:
    """Smallest fanout >= `fanout` whose tree of `depth` levels holds `pages`."""
    low, high = fanout, max(fanout, pages)
    while low < high:
        middle = (low + high) // 2
        if _capacity(middle, depth) >= pages:
            high = middle
        else:
            low = middle + 1
    return low


def _sites(config: SynthConfig) -> list[_Site]:
    count = min(config.sites, config.pages)
    # Real corpora mix big and small sites; 1/sqrt(rank) keeps the biggest under ~3x
    # the smallest for the default four sites.
    sizes = [1 + extra for extra in
             _apportion(config.pages - count, [(i + 1) ** -0.5 for i in range(count)])]
    rng = random.Random(f"{config.seed}|sites")
    picks = rng.sample(range(len(_COMPONENTS)), min(count, len(_COMPONENTS)))
    names = [_COMPONENTS[i] for i in picks]
    names += [f"{_COMPONENTS[i % len(_COMPONENTS)]} {i}" for i in range(len(names), count)]
    width = max(2, len(str(count - 1)))
    sites = []
    for i, (name, size) in enumerate(zip(names, sizes)):
        home_label = _HOME_LABELS[i % len(_HOME_LABELS)] or name
        sites.append(_Site(f"site-{i:0{width}d}", name, name.lower().replace(" ", ""), size,
                           _fitting_fanout(size, config.depth, config.fanout),
                           _BREADCRUMB_FORMATS[i % len(_BREADCRUMB_FORMATS)], home_label))
    return sites


def _subtree_sizes(pages: int, capacity: int, fanout: int, rng: random.Random) -> list[int]:
    """Split `pages` among a node's children, none above `capacity`. Lognormal weights
    make sections uneven (some a single page, some large) as in real documentation."""
    fewest = -(-pages // capacity)
    count = min(pages, max(fewest, rng.randint(max(1, fanout // 2), fanout + fanout // 2)))
    weights = [rng.lognormvariate(0.0, 1.0) for _ in range(count)]
    sizes = [1 + extra for extra in _apportion(pages - count, weights)]
    overflow = 0
    for i, size in enumerate(sizes):
        if size > capacity:
            overflow += size - capacity
            sizes[i] = capacity
    for i, size in enumerate(sizes):  # count * capacity >= pages, so the overflow fits
        moved = min(capacity - size, overflow)
        sizes[i] += moved
        overflow -= moved
    return sizes


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def _unique_slug(text: str, taken: set[str]) -> str:
    """Slug of `text` not in `taken` (then added to it): file names and anchors."""
    slug = base = _slug(text) or "page"
    suffix = 1
    while slug in taken:
        suffix += 1
        slug = f"{base}-{suffix}"
    taken.add(slug)
    return slug


def _title_case(text: str) -> str:
    words = text.split()
    return " ".join([words[0][:1].upper() + words[0][1:]] + [
        word if word in _SMALL_TITLE_WORDS else word[:1].upper() + word[1:] for word in words[1:]])


def _sibling_titles(count: int, top_level: bool, rng: random.Random) -> list[str]:
    """Distinct titles for `count` siblings: top-level sections use the names real
    sites give theirs; deeper pages mostly vocabulary titles, some common ones."""
    titles: list[str] = []
    if top_level:
        titles = rng.sample(_TOP_SECTION_TITLES, min(count, len(_TOP_SECTION_TITLES)))
    words = _WordSource(rng, topic_nouns=(), component="")  # title templates use neither
    taken = set(titles)
    while len(titles) < count:
        if rng.random() < _COMMON_TITLE_FRACTION:
            title = rng.choice(_COMMON_TITLES)
        else:
            title = _title_case(rng.choice(_PAGE_TITLES).fill(words))
        if title in taken:
            title = f"{title} {len(titles) + 1}"
        taken.add(title)
        titles.append(title)
    return titles


def _children(config: SynthConfig, site: _Site, node: _Node, levels_below: int) -> list[_Node]:
    if not node.is_section:
        return []
    rng = random.Random(f"{config.seed}|children|{node.path}")
    capacity = _capacity(site.fanout, levels_below - 1)
    sizes = _subtree_sizes(node.size - 1, capacity, site.fanout, rng)
    titles = _sibling_titles(len(sizes), node.is_home, rng)
    directory = node.path[: -len(_SECTION_FILE)]
    slugs_taken = {_SECTION_FILE.removesuffix(".html")}
    children = []
    for title, size in zip(titles, sizes):
        slug = _unique_slug(title, slugs_taken)
        path = f"{directory}{slug}/{_SECTION_FILE}" if size > 1 else f"{directory}{slug}.html"
        children.append(_Node(path, title, size))
    return children


@dataclass(frozen=True)
class _Place:
    """Everything a page's markup needs from the tree: O(depth * fanout) nodes."""

    site: _Site
    node: _Node
    ancestors: tuple[_Node, ...]  # home first, parent last
    siblings: Sequence[_Node]  # the node among its parent's children (home: itself)
    children: Sequence[_Node]
    top_sections: Sequence[_Node]


def _walk(config: SynthConfig, site: _Site, top_sections: Sequence[_Node], node: _Node,
          ancestors: tuple[_Node, ...], siblings: Sequence[_Node],
          levels_below: int) -> Iterator[tuple[str, bytes]]:
    children = top_sections if node.is_home else _children(config, site, node, levels_below)
    place = _Place(site, node, ancestors, siblings, children, top_sections)
    yield node.path, _render_page(config, place).encode("utf-8")
    for child in children:
        yield from _walk(config, site, top_sections, child, ancestors + (node,), children,
                         levels_below - 1)


# --------------------------------------------------------------------------- page markup

_NOUN_OF_PLURAL = {plural: noun for noun, plural in _NOUN_PLURALS.items()}
_COMPONENT_SET = frozenset(_COMPONENTS)


def _page_words(title: str, site: _Site, rng: random.Random) -> _WordSource:
    """Word source whose topic is the title's nouns plus two of the page's own, and
    whose component is the one the title names, else the site's product: the body
    is about what the title says, and the product name is frequent on its own site."""
    title_words = title.split()
    topic = [_NOUN_OF_PLURAL.get(word.lower(), word.lower()) for word in title_words]
    topic = [noun for noun in topic if noun in _NOUN_PLURALS]
    topic += rng.choices(_NOUN_CLASS.words, cum_weights=_NOUN_CLASS.cum_weights, k=2)
    components = [word for word in title_words if word in _COMPONENT_SET]
    return _WordSource(rng, topic, components[0] if components else site.name)


def _target_words(mean_words: int, rng: random.Random) -> int:
    # Lognormal with mean 1: most pages near the mean, a few long ones.
    return max(1, round(mean_words * rng.lognormvariate(-0.125, 0.5)))


def _paragraph(words: _WordSource, sentences: int, css_class: str = "") -> tuple[str, int]:
    templates = [words.rng.choice(_SENTENCES) for _ in range(sentences)]
    text = " ".join(template.fill(words) for template in templates)
    opening = f'<p class="{css_class}">' if css_class else "<p>"
    return f"{opening}{text}</p>", sum(template.word_count for template in templates)


def _bullet_list(words: _WordSource) -> tuple[str, int]:
    templates = [words.rng.choice(_SENTENCES) for _ in range(words.rng.randint(3, 5))]
    items = "".join(f"<li>{template.fill(words)}</li>" for template in templates)
    return f"<ul>{items}</ul>", sum(template.word_count for template in templates)


def _code_block(package: str, words: _WordSource) -> str:
    language, template = words.rng.choice(_CODE_SAMPLES)
    noun = words.topic()
    code = template.format(
        package=package, endpoint=f"https://api.{package}.example/v1", noun=noun,
        nouns=_NOUN_PLURALS[noun], verb=words.take(_VERB_CLASS),
        component=words.take(_COMPONENT_CLASS).lower(), identifier=_identifier(words),
        identifier2=_identifier(words), flag=_identifier(words).replace("_", "-"),
        number=words.rng.choice(_NUMBERS), adjective=words.take(_ADJECTIVE_CLASS))
    return f'<pre><code class="language-{language}">{html.escape(code, quote=False)}</code></pre>'


def _fresh_heading(words: _WordSource, used: set[str]) -> str:
    """A heading not yet used on the page (a few tries: repeats are rare, not banned)."""
    heading = words.rng.choice(_HEADINGS).fill(words)
    for _ in range(3):
        if heading not in used:
            break
        heading = words.rng.choice(_HEADINGS).fill(words)
    used.add(heading)
    return heading


def _child_listing(place: _Place, rng: random.Random) -> str:
    """The in-content table of contents of a section page (Sphinx toctree style)."""
    directory = place.node.path[: -len(_SECTION_FILE)]
    items = []
    for child in place.children:
        summary = rng.choice(_DESCRIPTIONS).fill(_page_words(child.title, place.site, rng))
        href = child.link_path[len(directory):]
        items.append(f'<li class="toctree-l1"><a class="reference internal" href="{href}">'
                     f"{html.escape(child.title)}</a>: {summary}</li>")
    return ('<div class="toctree-wrapper"><h2 id="in-this-section">In this section</h2>'
            f"<ul>{''.join(items)}</ul></div>")


def _article(place: _Place, words: _WordSource,
             target_words: int) -> tuple[str, list[tuple[str, str]]]:
    """The page's own content, and its (anchor, h2 text) outline."""
    rng = words.rng
    parts = [f"<h1>{html.escape(place.node.title)}</h1>"]
    lead, written = _paragraph(words, rng.randint(2, 3), "lead")
    parts.append(lead)
    anchors: set[str] = set()
    headings: set[str] = set()
    if place.children:
        parts.append(_child_listing(place, rng))
        anchors.add("in-this-section")
    outline: list[tuple[str, str]] = []
    code_blocks_left = 2 if rng.random() < 0.3 else 1
    while written < target_words or not outline:
        heading = _fresh_heading(words, headings)
        anchor = _unique_slug(heading, anchors)
        parts.append(f'<h2 id="{anchor}">{heading}</h2>')
        outline.append((anchor, heading))
        written += len(heading.split())
        for _ in range(rng.randint(1, 3)):
            kind = rng.random()
            if kind < 0.25:
                subheading = _fresh_heading(words, headings)
                parts.append(f'<h3 id="{_unique_slug(subheading, anchors)}">{subheading}</h3>')
                written += len(subheading.split())
            if kind > 0.85:
                block, count = _bullet_list(words)
            else:
                block, count = _paragraph(words, rng.randint(2, 5))
            parts.append(block)
            written += count
        if code_blocks_left and (rng.random() < 0.5 or written >= target_words):
            parts.append(_code_block(place.site.package, words))
            code_blocks_left -= 1
    return f"<article>{''.join(parts)}</article>", outline


def _crumb_label(place: _Place, node: _Node) -> str:
    return place.site.home_label if node.is_home else node.title


def _jsonld_trail(config: SynthConfig, place: _Place, trail: Sequence[_Node]) -> str:
    items = [{"@type": "ListItem", "position": position, "name": _crumb_label(place, node),
              "item": f"{config.base_url}/{node.link_path}"}
             for position, node in enumerate(trail, 1)]
    data = {"@context": "https://schema.org", "@type": "BreadcrumbList", "itemListElement": items}
    return ('<script type="application/ld+json">'
            f"{json.dumps(data, ensure_ascii=False, separators=(',', ':'))}</script>")


def _aria_trail(root: str, place: _Place, trail: Sequence[_Node]) -> str:
    items = [f'<li class="breadcrumb-item"><a href="{root}/{node.link_path}">'
             f"{html.escape(_crumb_label(place, node))}</a></li>" for node in trail[:-1]]
    items.append('<li class="breadcrumb-item active" aria-current="page">'
                 f"{html.escape(_crumb_label(place, trail[-1]))}</li>")
    return f'<nav aria-label="breadcrumb"><ol class="breadcrumb">{"".join(items)}</ol></nav>'


def _microdata_trail(root: str, place: _Place, trail: Sequence[_Node]) -> str:
    items = []
    for position, node in enumerate(trail, 1):
        name = f'<span itemprop="name">{html.escape(_crumb_label(place, node))}</span>'
        if position < len(trail):
            name = f'<a itemprop="item" href="{root}/{node.link_path}">{name}</a>'
        items.append('<li itemprop="itemListElement" itemscope '
                     'itemtype="https://schema.org/ListItem">'
                     f'{name}<meta itemprop="position" content="{position}"></li>')
    return ('<ol class="breadcrumbs" itemscope itemtype="https://schema.org/BreadcrumbList">'
            f'{"".join(items)}</ol>')


_CURRENT_CLASS = ' class="current"'


def _link_list(root: str, nodes: Sequence[_Node], current: _Node | None = None) -> str:
    items = "".join(
        f'<li{_CURRENT_CLASS if node is current else ""}>'
        f'<a href="{root}/{node.link_path}">{html.escape(node.title)}</a></li>' for node in nodes)
    return f"<ul>{items}</ul>"


def _header(root: str, place: _Place) -> str:
    site = place.site
    return ('<header class="site-header">'
            f'<a class="logo" href="{root}/{site.dir}/">{html.escape(site.name)}</a>'
            f'<nav class="top-nav" aria-label="Main">{_link_list(root, place.top_sections)}</nav>'
            f'<form class="search" role="search" action="{root}/{site.dir}/search.html">'
            f'<input type="search" name="q" placeholder="Search the {html.escape(site.name)} docs">'
            "</form></header>")


def _sidebar(root: str, place: _Place) -> str:
    return (f'<aside class="sidebar"><nav aria-label="Section navigation">'
            f"{_link_list(root, place.siblings, place.node)}</nav></aside>")


def _page_outline(outline: Sequence[tuple[str, str]]) -> str:
    items = "".join(f'<li><a href="#{anchor}">{heading}</a></li>' for anchor, heading in outline)
    return ('<aside class="page-toc"><div class="toc-title">On this page</div>'
            f"<ul>{items}</ul></aside>")


def _footer(root: str, place: _Place) -> str:
    site = place.site
    repository = f"https://github.com/{site.package}/{site.package}"
    return ('<footer class="site-footer"><div class="feedback">Was this page helpful? '
            '<button type="button">Yes</button> <button type="button">No</button></div>'
            f'<p><a href="{root}/{site.dir}/">{html.escape(site.name)}</a> · '
            f'<a href="{repository}">GitHub</a> · '
            f'<a href="{repository}/edit/main/docs/{place.node.path}">Edit this page</a></p>'
            f"<p>© 2024 The {html.escape(site.name)} Authors. "
            "Documentation licensed under CC BY 4.0.</p></footer>")


def _render_page(config: SynthConfig, place: _Place) -> str:
    node, site = place.node, place.site
    rng = random.Random(f"{config.seed}|page|{node.path}")
    words = _page_words(node.title, site, rng)
    description = rng.choice(_DESCRIPTIONS).fill(words)
    article, outline = _article(place, words, _target_words(config.words, rng))
    has_trail = node.is_home or rng.random() >= _NO_TRAIL_FRACTION
    trail = place.ancestors + (node,) if has_trail else ()
    formats = site.breadcrumb_formats if trail else ()
    root = urlsplit(config.base_url).path
    title = node.title if node.is_home else f"{node.title} — {site.name}"
    head = ['<meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{html.escape(title)}</title>",
            f'<meta name="description" content="{html.escape(description)}">',
            f'<link rel="canonical" href="{config.base_url}/{node.path}">',
            f'<link rel="stylesheet" href="{root}/{site.dir}/_static/theme.css">']
    if "jsonld" in formats:
        head.append(_jsonld_trail(config, place, trail))
    visible_trail = (_aria_trail(root, place, trail) if "aria" in formats else
                     _microdata_trail(root, place, trail) if "microdata" in formats else "")
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en">', "<head>", *head, "</head>", "<body>",
        '<a class="skip-link" href="#content">Skip to content</a>',
        _header(root, place), '<div class="layout">', _sidebar(root, place),
        f'<main id="content">{visible_trail}{article}</main>', _page_outline(outline), "</div>",
        _footer(root, place), f'<script src="{root}/{site.dir}/_static/theme.js"></script>',
        "</body>", "</html>", ""])
