"""Real HTTP servers on 127.0.0.1 for the crawl tests. `CrawlSite` serves a
folder of pages plus robots.txt, a sitemap index pointing at a gzipped sitemap,
and paths that misbehave. `HostileSite` answers scripted raw bytes per path (to
drip headers, stack encodings, redirect anywhere). Their request logs are the
witness of what the crawler did."""
from __future__ import annotations

import email.utils
import gzip
import hashlib
import os
import posixpath
import socket
import socketserver
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable
from urllib.parse import unquote

SLOW_HOLD_S = 120  # /slow.html answers when the site closes, or after this: always past a crawl's deadline
OVERLAP_WAIT_S = 60
RESPONSE_S = 0.02  # every page answer takes this long, so concurrent requests overlap


@dataclass
class Request:
    path: str
    host: str
    headers: dict
    status: int


class ServedInThread:
    """A socketserver `self.server` run in a daemon thread while the `with` block lasts."""

    server: socketserver.BaseServer
    closing: threading.Event  # set when the `with` block ends: handlers holding an answer let go

    def __enter__(self):
        self.closing = threading.Event()
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()


class CrawlSite(ServedInThread):
    def __init__(self, root: Path, *, flaky: str, busy: str, redirect_target: str, huge_bytes: int,
                 await_overlap: bool = False):
        """`await_overlap`: the first page request is answered only once a second
        one is in flight (or after OVERLAP_WAIT_S), so a crawler allowed two
        requests at once shows it whatever the machine's load."""
        self.root, self.flaky, self.busy = root, flaky, busy
        self.overlapped = threading.Event()
        if not await_overlap:
            self.overlapped.set()
        self.redirect_target, self.huge_bytes = redirect_target, huge_bytes
        self.log: list[Request] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.port = self.server.server_address[1]
        self.base = f"http://127.0.0.1:{self.port}/"

    def page_paths(self) -> list[str]:
        return sorted(str(p.relative_to(self.root)) for p in self.root.rglob("*.html"))

    def extras(self) -> list[str]:
        return ["private/secret.html", "redirect/a", "loop/a", "missing.html", "gone.html", "slow.html",
                "data.json", "huge.html"]

    def robots(self) -> str:
        return (f"User-agent: *\nDisallow: /private/\nCrawl-delay: 0.01\n\n"
                f"Sitemap: {self.base}sitemap_index.xml\n")

    def sitemap_index(self) -> bytes:
        return (f'<?xml version="1.0" encoding="UTF-8"?>\n<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
                f"<sitemap><loc>{self.base}sitemaps/pages.xml.gz</loc></sitemap></sitemapindex>").encode()

    def sitemap(self) -> bytes:
        urls = [self.base + p for p in self.page_paths() + self.extras()]
        urls.append(f"http://localhost:{self.port}/out-of-scope.html")
        body = "".join(f"<url><loc>{u}</loc></url>" for u in urls)
        xml = f'<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{body}</urlset>'
        return gzip.compress(xml.encode(), mtime=0)

    def _handler(self):
        site = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _send(self, status: int, body: bytes = b"", ctype: str = "text/html", headers: dict = ()):
                self.send_response(status)
                if ctype:
                    self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for k, v in dict(headers).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)
                return status

            def do_GET(self):
                host = self.headers.get("Host", "")
                if self.path == "/slow.html":  # the crawler gives up before the answer: not in flight for it
                    with site._lock:  # logged as it arrives: the crawl may end before the answer
                        site.log.append(Request(self.path, host, dict(self.headers), 200))
                    site.closing.wait(SLOW_HOLD_S)
                    try:
                        self._send(200, b"<html>late</html>")
                    except OSError:  # the crawler hung up long ago
                        pass
                    return
                with site._lock:
                    site.in_flight += 1
                    site.max_in_flight = max(site.max_in_flight, site.in_flight)
                    n = site.counts[self.path] = site.counts.get(self.path, 0) + 1
                    if site.in_flight >= 2:
                        site.overlapped.set()
                try:
                    if self.path.endswith(".html"):
                        site.overlapped.wait(OVERLAP_WAIT_S)
                    status = self._answer(n)
                finally:
                    with site._lock:
                        site.in_flight -= 1
                        site.log.append(Request(self.path, host, dict(self.headers), status))

            def _answer(self, n: int) -> int:
                path = self.path.split("?", 1)[0]
                if path == "/robots.txt":
                    return self._send(200, site.robots().encode(), "text/plain")
                if path == "/sitemap_index.xml":
                    return self._send(200, site.sitemap_index(), "application/xml")
                if path == "/sitemaps/pages.xml.gz":
                    return self._send(200, site.sitemap(), "application/x-gzip")
                if path == "/redirect/a":
                    return self._send(301, headers={"Location": "/redirect/b"})
                if path == "/redirect/b":
                    return self._send(302, headers={"Location": "/" + site.redirect_target})
                if path in ("/loop/a", "/loop/b"):
                    return self._send(302, headers={"Location": "/loop/b" if path == "/loop/a" else "/loop/a"})
                if path == "/gone.html":
                    return self._send(410, b"gone")
                if path == "/data.json":
                    return self._send(200, b'{"a": 1}', "application/json")
                if path == "/huge.html":
                    return self._send(200, b"<html>" + b"x" * site.huge_bytes + b"</html>")
                if path == "/" + site.flaky and n == 1:
                    return self._send(500, b"try again")
                if path == "/" + site.busy and n == 1:
                    return self._send(429, b"slow down", headers={"Retry-After": "1"})
                file = site.root / path.lstrip("/")
                if path.endswith("/"):
                    file = file / "index.html"
                if not file.is_file():
                    return self._send(404, b"not found")
                data = file.read_bytes()
                etag = '"' + hashlib.sha256(data).hexdigest()[:16] + '"'
                modified = email.utils.formatdate(int(os.stat(file).st_mtime), usegmt=True)
                time.sleep(RESPONSE_S)
                # Either validator confirms the page; the 304 repeats neither (as Python's http.server
                # does), so a crawler must keep the validators it has.
                if self.headers.get("If-None-Match") == etag or self.headers.get("If-Modified-Since") == modified:
                    return self._send(304, ctype="")
                return self._send(200, data, headers={"ETag": etag, "Last-Modified": modified})

        return Handler


def raw_response(status: int, body: bytes = b"", headers: list[tuple[str, str]] | dict = (),
                 ctype: str = "text/html") -> bytes:
    """The bytes of a whole HTTP/1.1 response (the connection closes after it);
    header values are sent as UTF-8, whatever they hold."""
    lines = [f"HTTP/1.1 {status} X", f"Content-Type: {ctype}", f"Content-Length: {len(body)}",
             "Connection: close", *(f"{k}: {v}" for k, v in dict(headers).items())]
    return "\r\n".join(lines).encode() + b"\r\n\r\n" + body


def served_path(target: str) -> str:
    """The path a typical server resolves a request target to: percent-decoded,
    backslashes as slashes (as IIS does), dot segments and repeated slashes
    collapsed, never above the root. The query is dropped."""
    path = unquote(target.split("?", 1)[0]).replace("\\", "/")
    return posixpath.normpath("/" + path.lstrip("/"))


# A route answers with bytes, or writes to the connection itself (to drip or stream).
Route = bytes | Callable[[socket.socket], None]


class HostileSite(ServedInThread):
    """A raw HTTP/1.1 server on `host` (127.0.0.1, or 127.0.0.3 for a second
    host): `routes` maps the path a server resolves a request to (`served_path`)
    to its answer; anything else is a 404. `log` holds (request target, served
    path, headers) of every request."""

    def __init__(self, routes: dict[str, Route], host: str = "127.0.0.1"):
        self.routes = routes
        self.log: list[tuple[str, str, dict[str, str]]] = []
        site = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                head = b""
                while b"\r\n\r\n" not in head and len(head) < 65536:
                    data = self.request.recv(4096)
                    if not data:
                        return
                    head += data
                request_line, *header_lines = head.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
                target = request_line.split(" ")[1]
                headers = dict(line.split(": ", 1) for line in header_lines if ": " in line)
                path = served_path(target)
                site.log.append((target, path, headers))
                answer = site.routes.get(path, raw_response(404, b"not found"))
                try:
                    if callable(answer):
                        answer(self.request)
                    else:
                        self.request.sendall(answer)
                except OSError:  # the crawler hung up: what the test wants to see
                    pass

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.server = Server((host, 0), Handler)
        self.port = self.server.server_address[1]
        self.host = f"http://{host}:{self.port}"
        self.base = self.host + "/"

    def paths(self) -> list[str]:
        return [path for _, path, _ in self.log]

