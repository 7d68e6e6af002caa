"""What a person meets first (issue #38): `ritrag --version`, errors that say
what is wrong (no index at a path, a version the index does not hold), reports
in plain English, and a crawl's log without Beam's empty-write notices."""
from __future__ import annotations

import importlib.metadata
import json
import logging
import shutil
import subprocess
import sys

from ritrag import cli
from ritrag.evaluation.forest_report import counted
from support import SAMPLE


def test_version_names_the_installed_package(capsys):
    try:
        cli.main(["--version"])
    except SystemExit as done:
        assert done.code == 0
    assert capsys.readouterr().out.strip() == f"ritrag {importlib.metadata.version('ritrag')}"


def test_the_entry_point_prints_its_version(tmp_path):
    done = subprocess.run([sys.executable, "-m", "ritrag.cli", "--version"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("ritrag 0.")


def refusal(capsys) -> dict:
    return json.loads(capsys.readouterr().err.strip().splitlines()[-1])["error"]


def test_a_directory_that_is_not_there_is_no_index_at_that_path(tmp_path, capsys):
    missing = tmp_path / "nothing-here"
    assert cli.main(["toc", str(missing), "tls"]) == 1
    error = refusal(capsys)
    assert error["reason"] == "index_unavailable" and error["message"] == f"no index at {missing}"


def test_rolling_back_to_a_version_not_held_names_the_versions_that_are(tiny_hash_index, tmp_path, capsys):
    index = tmp_path / "idx"
    shutil.copytree(tiny_hash_index, index)
    assert cli.main(["rollback", str(index), "v000007"]) == 1
    error = refusal(capsys)
    assert error["reason"] == "unknown_version"
    assert "no version v000007" in error["message"] and "it holds v000001" in error["message"]


def test_report_counts_read_as_english():
    assert [counted(n, "page") for n in (0, 1, 2)] == ["0 pages", "1 page", "2 pages"]
    assert counted(1, "orphan") == "1 orphan"


def test_a_crawl_round_logs_no_empty_write_notice(tmp_path, caplog):
    """A crawl whose rounds have no accounting mismatch (the normal case) writes
    no mismatches file; Beam's notice of it is filtered from the log."""
    from ritrag.pipelines import crawl

    with caplog.at_level(logging.WARNING):
        crawl.run(["--seed", "http://127.0.0.1:9/", "--out", str(tmp_path / "c"), "--timeout_s", "5",
                   "--retries", "0"])
    assert not [r for r in caplog.records if "No shards found to finalize" in r.getMessage()]
