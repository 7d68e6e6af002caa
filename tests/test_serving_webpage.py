"""The pages a person meets, in headless Chromium (Debian's `chromium` package):
the web page loads, names the index it searches, runs the query from its URL
against the HTTP service and shows the sub-forest with each hit's cross-links;
/docs (Swagger UI) renders from the server's own files, with no network.
Skipped when no Chromium is installed."""
from __future__ import annotations

import html
import re
import shutil
import struct
import subprocess
import urllib.parse
import zlib
from pathlib import Path

import numpy as np
import pytest

from ritrag.serving.http import create_app
from ritrag.serving.outline import preorder
from ritrag.serving.tools import ToolService
from serving_fixtures import loaded_index, serving, wait_until_ready

CHROMIUM = next((path for name in ("chromium", "chromium-browser", "google-chrome")
                 if (path := shutil.which(name))), None)
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (apt-get install chromium)")
# The colours of a POST operation's badge, seen only once the page's script ran: Swagger UI's
SWAGGER_POST_GREEN = (73, 204, 144)
REDOC_POST_BLUE = (24, 111, 175)  # ReDoc's POST badge in its side menu


def chromium(profile: Path, *args: str) -> str:
    """Headless Chromium's stdout; no background traffic, 20 s of virtual time
    for the page's scripts (virtual: the budget does not depend on the machine's speed)."""
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
         f"--user-data-dir={profile}", "--virtual-time-budget=20000", *args],
        capture_output=True, text=True, timeout=120, check=True).stdout


def png_pixels(data: bytes) -> np.ndarray:
    """The pixels (height, width, channels) of an 8-bit, non-interlaced RGB or
    RGBA PNG, as Chromium writes its screenshots: the format's five row filters
    undone (PNG specification, section 9)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    position, idat, header = 8, bytearray(), None
    while position < len(data):
        length, kind = struct.unpack(">I4s", data[position:position + 8])
        body = data[position + 8:position + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        position += 12 + length
    width, height, bit_depth, colour_type, _, _, interlace = header
    assert bit_depth == 8 and colour_type in (2, 6) and interlace == 0, header
    channels = 3 if colour_type == 2 else 4
    stride = width * channels
    raw = np.frombuffer(zlib.decompress(bytes(idat)), dtype=np.uint8).reshape(height, stride + 1)
    out = np.zeros((height, stride), dtype=np.uint8)
    previous = np.zeros(stride, dtype=np.int64)
    for y in range(height):
        kind, line = raw[y, 0], raw[y, 1:].astype(np.int64)
        if kind == 0:
            row = line
        elif kind == 2:  # Up
            row = (line + previous) & 255
        elif kind == 1:  # Sub: a running sum per channel
            row = np.cumsum(line.reshape(width, channels), axis=0).reshape(stride) & 255
        else:  # Average (3) and Paeth (4) depend on the byte just decoded: one byte at a time
            row = line.copy()
            for x in range(stride):
                left = int(row[x - channels]) if x >= channels else 0
                up = int(previous[x])
                if kind == 3:
                    row[x] = (row[x] + (left + up) // 2) & 255
                else:
                    up_left = int(previous[x - channels]) if x >= channels else 0
                    guess = left + up - up_left
                    dl, du, dul = abs(guess - left), abs(guess - up), abs(guess - up_left)
                    near = left if dl <= du and dl <= dul else up if du <= dul else up_left
                    row[x] = (row[x] + near) & 255
        out[y] = row
        previous = row
    return out.reshape(height, width, channels)


def test_png_pixels_undoes_every_row_filter():
    """A 3x5 RGB image written with each of the five filters decodes to itself."""
    image = np.array([[[10 * y + x, 200 - 7 * x, (x * y * 37) & 255] for x in range(3)] for y in range(5)],
                     dtype=np.int64)
    rows, previous = [], np.zeros((3, 3), dtype=np.int64)
    for kind, row in enumerate(image):
        left = np.vstack([np.zeros((1, 3), dtype=np.int64), row[:-1]])
        up_left = np.vstack([np.zeros((1, 3), dtype=np.int64), previous[:-1]])
        guess = left + previous - up_left
        paeth = np.where((abs(guess - left) <= abs(guess - previous)) & (abs(guess - left) <= abs(guess - up_left)),
                         left, np.where(abs(guess - previous) <= abs(guess - up_left), previous, up_left))
        predicted = [0, left, previous, (left + previous) // 2, paeth][kind]
        rows.append(bytes([kind]) + bytes(((row - predicted) & 255).astype(np.uint8).ravel()))
        previous = row
    chunk = lambda kind, body: struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 3, 5, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(b"".join(rows))) + chunk(b"IEND", b""))
    assert np.array_equal(png_pixels(png), image)


@needs_chromium
def test_page_shows_the_index_and_the_toc_of_a_query(tiny_index, tmp_path):
    service = ToolService(loaded_index(str(tiny_index)))
    with serving(create_app(lambda: service)) as url:
        wait_until_ready(url)  # the page asks its query once, on load
        page = f"{url}/?q={urllib.parse.quote('which port does version 3 listen on')}"
        dom = chromium(tmp_path / "profile", "--dump-dom", page)
    nodes = re.findall(r'<span class="node (hit|ctx)" title="Read (\w+)">([^<]+)<', dom)
    titles = [html.unescape(title).strip() for _, _, title in nodes]
    assert "Shop Server" in titles and "Version 3" in titles and "Configuring the server" in titles
    assert any(kind == "hit" for kind, _, _ in nodes)
    assert re.search(r"\d+ hits, index v\d{6}", dom)
    assert "o200k_base tokens: JSON" in dom
    # before any query: which index answers, its live version and what it holds
    index = service.index.loaded
    assert (f"index {tiny_index.name}, version {index.version}: {len(index.node_row):,} nodes, "
            f"{int(index.chunks.live.sum()):,} chunks") in html.unescape(dom)


@needs_chromium
def test_page_shows_each_hits_cross_links(sample_index, tmp_path):
    """The sample's pages link to each other: the hits' see_also, as GetToC
    gives them, are listed under each hit, each a node to Read."""
    query, n = "configure the server port", 10
    service = ToolService(loaded_index(str(sample_index)))
    expected = {node["id"]: [link["id"] for link in node["see_also"]]
                for node, _ in preorder(service.get_toc(query, n=n)["trees"]) if node.get("see_also")}
    assert expected, "a ToC of the sample with cross-links to show"
    with serving(create_app(lambda: service)) as url:
        wait_until_ready(url)
        dom = chromium(tmp_path / "profile", "--dump-dom", f"{url}/?q={urllib.parse.quote(query)}&n={n}")
    label = (r'<span class="node hit" title="Read (\w+)">[^<]*<span class="id">[^<]*</span> '
             r'<span class="score">[^<]*</span></span>')
    shown = {hit: re.findall(r'title="Read (\w+)"', links)
             for hit, links in re.findall(label + r'<div class="see">see also: (.*?)</div>', dom)}
    assert shown == expected


@needs_chromium
@pytest.mark.parametrize("page, post_colour", [("/docs", SWAGGER_POST_GREEN), ("/redoc", REDOC_POST_BLUE)])
def test_api_pages_render_offline(tiny_hash_index, tmp_path, page, post_colour):
    """Swagger UI (/docs) and ReDoc (/redoc) draw the API from the server's own
    files: the screenshot is not a blank page (FastAPI's own pages, whose scripts
    come from a CDN, are one white colour offline), and shows the POST badges."""
    service = ToolService(loaded_index(str(tiny_hash_index)))
    shot = tmp_path / "page.png"
    with serving(create_app(lambda: service)) as url:
        wait_until_ready(url)
        chromium(tmp_path / "profile", "--window-size=1000,700", f"--screenshot={shot}", url + page)
    pixels = png_pixels(shot.read_bytes())[..., :3].astype(np.int64)
    assert pixels.shape[:2] == (700, 1000)
    not_white = (pixels < 240).any(axis=2).mean()
    colours = len(np.unique(pixels.reshape(-1, 3), axis=0))
    badge = (abs(pixels - post_colour).max(axis=2) <= 8).sum()
    assert not_white > 0.02 and colours > 50, (not_white, colours)
    assert badge > 200, badge
