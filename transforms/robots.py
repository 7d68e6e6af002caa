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
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from protego import Protego

ALLOW_ALL, DISALLOW_ALL, RULES = "allow_all", "disallow_all", "rules"


@dataclass(frozen=True)
class RobotsRules:
    """A host's robots decision: `policy` is ALLOW_ALL, DISALLOW_ALL or RULES (from `text`)."""

    policy: str
    text: str = ""
    reason: str = ""  # why a policy other than RULES was chosen

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
    """The decision for a robots.txt answer; `http_status` None: not reachable."""
    if http_status is None:
        return RobotsRules(DISALLOW_ALL, reason="robots_unreachable")
    if http_status == 429 or http_status >= 500:
        return RobotsRules(DISALLOW_ALL, reason=f"robots_http_{http_status}")
    if http_status >= 400:
        return RobotsRules(ALLOW_ALL, reason=f"robots_http_{http_status}")
    if http_status >= 300:  # redirects were followed by the fetcher; one left is a loop or too long
        return RobotsRules(ALLOW_ALL, reason="robots_redirect_unresolved")
    if looks_like_html(body, content_type):
        return RobotsRules(ALLOW_ALL, reason="robots_html")
    return RobotsRules(RULES, body.decode("utf-8", errors="replace"))
