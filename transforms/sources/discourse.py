"""A Discourse topic's JSON (`/t/<id>.json`: `title`, `post_stream.posts`) ->
one page per post.

* The topic is the file's page (its URL the file's, `.json` dropped): titled by
  the topic, its text the opening post's.
* Every other post is a page of its own at `<topic URL>/<post number>` (as
  Discourse links posts), record `post-<number>` of the file, titled
  "#<number> <author>"; its trail is the topic's, then the topic, then the chain
  of posts it replies to (`reply_to_post_number`), outermost first, so each
  reply sits under the post it answers and direct replies under the topic
  (trail method "reply_to"). A chain longer than MAX_TREE_DEPTH posts keeps its
  outermost ones and the post replied to (the forest takes only a page's parent
  from its trail, resolves parents into chains and caps their depth:
  `ritrag.schema.MAX_TREE_DEPTH`), so a thread of replies to replies costs its
  length, not its length squared. A reply whose chain reaches a post the file does not hold (deleted, or beyond
  the posts the JSON carries) sits under the topic, trail method
  "reply_to_missing" (counted by the build's trail_taken_* counters). A chain
  that loops is cut where the walk up from its smallest post closes the loop:
  the post reached last sits under the topic.
* Post numbers are unique in Discourse, but not always in an export: every
  post is kept. The first post of a number (in the stream's order) is the one
  its number names (page, record, replies and quotes to it); the k-th after it
  is `<number>-<k>` (k from 2) in its URL and record, a reply to no one's.
* An accepted answer says so in its description; the topic's tags are its keywords.
* Links: a post that quotes another post of the topic (Discourse's quote markup,
  `<aside class="quote" data-post="N">`) links to that post's page, its anchor
  text the quoted author; the web links of its text are kept as every document's
  (`common.document_links`). A quote of another topic (its data-topic differs)
  names a page this file does not hold: none.
* Text: the post's rendered HTML (`cooked`) reduced to plain text, a block per
  paragraph; `raw` (Markdown source) when a post has no `cooked`.
"""
from __future__ import annotations

import json

import lxml.html
from lxml import etree

from ritrag.schema import MAX_TREE_DEPTH, Crumb, Link, ParsedPage, Section
from ritrag.transforms.sources.common import (SourceFile, UnparseablePage, document_links, document_page, html_text,
                                              meta_text, url_segment_title)
from ritrag.transforms.sources.nav import document_trail


def load_json_object(data: bytes, what: str) -> dict:
    """The JSON object of an input file; UnparseablePage("invalid_json") otherwise
    (nesting deeper than the interpreter's stack included)."""
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise UnparseablePage("invalid_json", str(exc) or type(exc).__name__) from exc
    if not isinstance(value, dict):
        raise UnparseablePage("invalid_json", f"{what} is a JSON object, not a {type(value).__name__}")
    return without_lone_surrogates(value)


def without_lone_surrogates(value):
    """`value` with every lone surrogate in its strings ("\\ud800" is valid JSON
    but no UTF-8 text) replaced by U+FFFD, so that hashing and writing the
    page's text never fail. Iterative: the nesting is as deep as the file's."""
    def clean(text: str) -> str:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace") if not text.isascii() else text

    root = [value]
    stack = [(root, 0)]
    while stack:
        container, key = stack.pop()
        item = container[key]
        if isinstance(item, str):
            container[key] = clean(item)
        elif isinstance(item, list):
            stack.extend((item, i) for i in range(len(item)))
        elif isinstance(item, dict):
            for k in list(item):
                if isinstance(k, str) and not k.isascii() and clean(k) != k:
                    item[clean(k)] = item.pop(k)
                    k = clean(k)
                stack.append((item, k))
    return root[0]


Chain = tuple[tuple[int, ...], bool]  # the posts above one, outermost first; whether it reaches a missing post


def _chain_below(out: dict[int, Chain], target: int) -> Chain:
    """The chain of a post replying to `target`, whose own chain is `out[target]`."""
    above, missing = out[target]
    chain = above + (target,) if len(above) < MAX_TREE_DEPTH else above[:MAX_TREE_DEPTH - 1] + (target,)
    return ((), True) if missing else (chain, False)


def reply_chains(by_number: dict[int, dict], opening: int) -> dict[int, Chain]:
    """Every post but the opening one: (the posts it replies to, outermost first,
    at most MAX_TREE_DEPTH of them: the outermost and the post replied to;
    whether its chain reaches a post the file lacks, the chain then empty). Each
    chain is walked once: a post's builds on its parent's."""
    out: dict[int, Chain] = {}
    for start in sorted(by_number.keys() - {opening}):
        walk: list[int] = []  # posts whose chains wait for the chain of the post above them
        on_walk: set[int] = set()
        number = start
        while number not in out:
            on_walk.add(number)
            target = by_number[number].get("reply_to_post_number")
            if not isinstance(target, int) or target == opening or target in on_walk:
                out[number] = ((), False)  # the top of its chain, or where a loop is cut
            elif target not in by_number:
                out[number] = ((), True)
            else:
                walk.append(number)
                number = target
        for number in reversed(walk):
            out[number] = _chain_below(out, by_number[number]["reply_to_post_number"])
    return out


def numbered_posts(posts: object) -> tuple[dict[int, dict], list[tuple[str, int, dict]]]:
    """(the first post of each number, in the stream's order; (key, number,
    post) of every other post sharing a number, the k-th of a number keyed
    `<number>-<k>`). A post without an integer number is no post."""
    by_number: dict[int, dict] = {}
    extra: list[tuple[str, int, dict]] = []
    seen: dict[int, int] = {}
    for post in posts if isinstance(posts, list) else ():
        number = post.get("post_number") if isinstance(post, dict) else None
        if not isinstance(number, int) or isinstance(number, bool):
            continue
        seen[number] = seen.get(number, 0) + 1
        if seen[number] == 1:
            by_number[number] = post
        else:
            extra.append((f"{number}-{seen[number]}", number, post))
    return by_number, extra


def _extra_chain(post: dict, by_number: dict[int, dict], opening: int, chains: dict[int, Chain]) -> Chain:
    """The chain of a post sharing its number with an earlier one: as any
    post's, from the post it replies to (no post replies to it)."""
    target = post.get("reply_to_post_number")
    if not isinstance(target, int) or target == opening:
        return (), False
    return _chain_below(chains, target) if target in by_number else ((), True)


def _post_text(post: dict) -> str:
    cooked = post.get("cooked")
    return html_text(cooked) if isinstance(cooked, str) and cooked else str(post.get("raw") or "").strip()


def _post_links(file: SourceFile, post: dict, topic_id: object, opening: int, url: str
                ) -> tuple[tuple[Link, ...], int]:
    """The links of one post (module doc), in the order its text has them."""
    cooked = post.get("cooked")
    if not isinstance(cooked, str) or not cooked.strip():
        return (), 0
    try:
        fragment = lxml.html.fragment_fromstring(cooked, create_parent="div")
    except (etree.ParserError, ValueError):
        return (), 0

    def hrefs():
        for el in fragment.iter("aside", "a"):
            if el.tag == "a":
                yield el.get("href") or "", el.text_content()
            elif "quote" in (el.get("class") or "").split() and el.get("data-topic") in (None, str(topic_id)):
                number = el.get("data-post", "")
                if number.isdigit():
                    quoted = f"{file.url}/{number}" if int(number) != opening else file.url
                    yield quoted, el.get("data-username") or ""

    return document_links(file, hrefs(), url)


def _post_title(post: dict) -> str:
    author = meta_text(post.get("username") or post.get("name"))
    return f"#{post['post_number']} {author}".strip()


def _post_page(file: SourceFile, topic: dict, opening: int, post: dict, key: str, trail: tuple[Crumb, ...],
               missing: bool) -> tuple[str, ParsedPage]:
    """(record key, page) of one post other than the opening one, its page at `<topic URL>/<key>`."""
    url = f"{file.url}/{key}"
    post_title = _post_title(post)
    return f"post-{key}", document_page(
        file, url=url, title=post_title, trail=trail,
        trail_method="reply_to_missing" if missing else "reply_to",
        description="accepted answer" if post.get("accepted_answer") else "",
        sections=(Section(post_title, 0, "", _post_text(post)),),
        links=_post_links(file, post, topic.get("id"), opening, url))


def parse_discourse(file: SourceFile) -> list[tuple[str | None, ParsedPage]]:
    topic = load_json_object(file.data, "a Discourse topic")
    stream = topic.get("post_stream")
    by_number, extra = numbered_posts(stream.get("posts") if isinstance(stream, dict) else None)
    if not by_number:
        raise UnparseablePage("no_content", "a Discourse topic without posts (post_stream.posts)")
    title = meta_text(topic.get("title") or topic.get("fancy_title")) or url_segment_title(file.url)
    tags = tuple(str(t.get("name", "") if isinstance(t, dict) else t) for t in topic.get("tags") or ())
    trail, method, _, _ = document_trail(file)
    opening = min(by_number)
    out = [(None, document_page(file, title=title, trail=trail, trail_method=method, keywords=tags,
                                sections=(Section(title, 0, "", _post_text(by_number[opening])),),
                                links=_post_links(file, by_number[opening], topic.get("id"), opening, file.url)))]
    topic_crumbs = (*trail, Crumb(title, file.url))
    crumb_of = {n: Crumb(_post_title(post), f"{file.url}/{n}") for n, post in by_number.items()}
    chains = reply_chains(by_number, opening)
    keyed = [(number, str(number), by_number[number], chains[number]) for number in sorted(chains)]
    keyed += [(number, key, post, _extra_chain(post, by_number, opening, chains)) for key, number, post in extra]
    for _, key, post, (chain, missing) in sorted(keyed, key=lambda k: k[0]):  # by number, stream order within
        out.append(_post_page(file, topic, opening, post, key, topic_crumbs + tuple(crumb_of[n] for n in chain),
                              missing))
    return out
