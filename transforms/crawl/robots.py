"""robots.txt: what a host lets a user agent fetch, parsed by protego (Scrapy's parser).

Policy for a robots.txt that cannot be read as rules, as RFC 9309 (section 2.3.1)
and Google do:

* 2xx with a text body: the rules it states (Disallow, Allow, Crawl-delay, Sitemap).
* 2xx with an HTML body (a site that answers every path with its home page):
  no rules are in it, so everything is allowed; the CrawlDB row says
  `robots_html`.
* 4xx other than 429 (no robots.txt): everything allowed.
* 429, 5xx, or the host unreachable: everything disallowed for this crawl (the
  site may be down or overloaded; RFC 9309 lets a crawler assume complete
  disallow). Nothing else of the host is requested; its URLs get `disallowed`
  rows and are tried again by the next crawl.
* A redirect not followed (more than MAX_ROBOTS_REDIRECTS hops, or one leaving
  the host): robots.txt is unavailable, everything allowed (RFC 9309 2.3.1.2).
  (The crawl follows robots.txt redirects only within the host: one to another
  host is where a hostile site would send the crawler, an internal address say.)
* Only the first MAX_ROBOTS_BYTES are read and parsed (RFC 9309 2.5; the line
  cut at the limit is dropped); the CrawlDB row says `robots_truncated`.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from protego import Protego

ALLOW_ALL, DISALLOW_ALL, RULES = "allow_all", "disallow_all", "rules"
MAX_ROBOTS_BYTES = 500 * 1024  # RFC 9309 2.5: at least 500 KiB; Google's limit
MAX_ROBOTS_REDIRECTS = 5  # RFC 9309 2.3.1.2: at least five


@dataclass(frozen=True)
class RobotsRules:
    """A host's robots decision: `policy` is ALLOW_ALL, DISALLOW_ALL or RULES (from `text`)."""

    policy: str
    text: str = ""
    reason: str = ""  # why a policy other than RULES was chosen, or that the rules were cut

    @cached_property
    def _parsed(self) -> Protego:
        return Protego.parse(self.text)

    def allows(self, url: str, user_agent: str) -> bool:
        if self.policy != RULES:
            return self.policy == ALLOW_ALL
        return self._parsed.can_fetch(url, user_agent)

    def crawl_delay(self, user_agent: str) -> float:
        if self.policy != RULES:
            return 0.0
        return float(self._parsed.crawl_delay(user_agent) or 0.0)

    def sitemaps(self) -> list[str]:
        return list(self._parsed.sitemaps) if self.policy == RULES else []


def looks_like_html(body: bytes, content_type: str) -> bool:
    head = body[:512].lstrip().lower()
    return "html" in content_type.lower() or head.startswith((b"<!doctype html", b"<html", b"<head", b"<body"))


def robots_rules(http_status: int | None, content_type: str = "", body: bytes = b"") -> RobotsRules:
    """The decision for a robots.txt answer; `http_status` None: not reachable.
    A body longer than MAX_ROBOTS_BYTES is read up to its last full line within them."""
    if http_status is None:
        return RobotsRules(DISALLOW_ALL, reason="robots_unreachable")
    if http_status == 429 or http_status >= 500:
        return RobotsRules(DISALLOW_ALL, reason=f"robots_http_{http_status}")
    if http_status >= 400:
        return RobotsRules(ALLOW_ALL, reason=f"robots_http_{http_status}")
    if http_status >= 300:  # a redirect the crawl did not follow: a loop, too long, or off the host
        return RobotsRules(ALLOW_ALL, reason="robots_redirect_unresolved")
    if looks_like_html(body, content_type):
        return RobotsRules(ALLOW_ALL, reason="robots_html")
    if len(body) > MAX_ROBOTS_BYTES:
        kept = body[:MAX_ROBOTS_BYTES]
        return RobotsRules(RULES, kept[:kept.rfind(b"\n") + 1].decode("utf-8", errors="replace"),
                           reason="robots_truncated")
    return RobotsRules(RULES, body.decode("utf-8", errors="replace"))
