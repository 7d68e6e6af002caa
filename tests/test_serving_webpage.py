"""The web page, in headless Chromium (Debian's `chromium` package): it loads,
runs the query from its URL against the HTTP service and shows the sub-forest.
Skipped when no Chromium is installed."""
from __future__ import annotations

import html
import re
import shutil
import subprocess
import urllib.parse

import pytest

from ritrag.serving.http import create_app
from ritrag.serving.tools import ToolService
from serving_fixtures import loaded_index, serving

CHROMIUM = next((path for name in ("chromium", "chromium-browser", "google-chrome")
                 if (path := shutil.which(name))), None)


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (apt-get install chromium)")
def test_page_shows_the_toc_of_a_query(tiny_index, tmp_path):
    service = ToolService(loaded_index(str(tiny_index)))
    with serving(create_app(lambda: service)) as url:
        page = f"{url}/?q={urllib.parse.quote('which port does version 3 listen on')}"
        dom = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run",
             f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=20000", "--dump-dom", page],
            capture_output=True, text=True, timeout=120, check=True).stdout
    nodes = re.findall(r'<span class="node (hit|ctx)" title="Read (\w+)">([^<]+)<', dom)
    titles = [html.unescape(title).strip() for _, _, title in nodes]
    assert "Shop Server" in titles and "Version 3" in titles and "Configuring the server" in titles
    assert any(kind == "hit" for kind, _, _ in nodes)
    assert re.search(r"\d+ hits, index v\d{6}", dom)
    assert "o200k_base tokens: JSON" in dom
