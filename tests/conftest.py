"""Shared fixtures: indexes built from the tests' small site and from the
bundled sample corpus (built once per run)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from support import SAMPLE, build_index, write_tiny_site


@pytest.fixture(scope="session", autouse=True)
def outside_the_checkout(tmp_path_factory) -> None:
    """Every test runs from an empty folder, as the installed product runs: a
    process a test starts (`python -m ritrag.cli`, `python -c`, Beam's worker
    processes) puts its working directory first on its path, where the
    checkout's ritrag/ folder (the core alone) would shadow the installed
    package."""
    os.chdir(tmp_path_factory.mktemp("cwd"))


@pytest.fixture(scope="session")
def tiny_site(tmp_path_factory) -> Path:
    return write_tiny_site(tmp_path_factory.mktemp("tiny_site"))


@pytest.fixture(scope="session")
def tiny_index(tiny_site, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny_index")
    build_index(tiny_site, out)
    return out


@pytest.fixture(scope="session")
def tiny_hash_index(tiny_site, tmp_path_factory) -> Path:
    """The tiny site embedded with the hashing stand-in: for tests of what
    runs over an index (tools, agents, evaluation), not of retrieval quality."""
    out = tmp_path_factory.mktemp("tiny_hash_index")
    build_index(tiny_site, out, "--embedding_model", "hashing:384")
    return out


@pytest.fixture(scope="session")
def sample_index(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sample_index")
    build_index(SAMPLE, out)
    return out


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
