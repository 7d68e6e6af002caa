"""Where a document file sits: its trail, from a docs-as-code nav file when one
covers it, else from its folders.

* `mkdocs.yml` in the document's folder or a folder above it (inside the input):
  its `nav` places every document it lists (method "mkdocs_nav"). A nav section
  is a crumb: linked to the section's index page (`index.md` / `README.md`
  listed in it) when it has one, else a label (a virtual node). The docs folder's
  own index page, when there is one, is the home every other document hangs
  under. An index page lists its section's entries as its `nav_order`, so
  siblings keep the nav's order. Documents the nav does not list, and nav
  entries that are links, fall back to folders.
* Folders (method "folders"): one crumb per directory between the site and the
  document (`ritrag.transforms.parse.trail.directory_trail`), linked to the directory's
  URL, which is its index document's URL (`index.md` and `README.md` are served
  as `index.html`: transforms/sources/dispatch.py `document_url_path`), so a
  folder with an index page is that page and one without is a virtual node
  titled by the folder's name, or by the `label` of the folder's Docusaurus
  `_category_.json` (or `.yml`) when it has one (its `position` is not used:
  the order of folders is their URL order).

The nav and category files are read once per worker (cached by path): a build
that edits them while it runs may place documents by either version. Both are
read by the one docs YAML loader (`common.load_yaml`): a nav file it refuses (an
alias bomb, an alias inside itself, nesting past its depth) is no nav, and its documents are placed by
their folders (logged); titles and labels are bounded scalars (`common.meta_text`).
The nav is walked without recursion, so its depth costs no stack.
"""
from __future__ import annotations

import functools
import json
import logging
import posixpath
from dataclasses import dataclass, field

import yaml
from apache_beam.io.filesystems import FileSystems

from ritrag.schema import Crumb
from ritrag.transforms.parse.trail import directory_trail
from ritrag.transforms.sources.common import SourceFile, RefusedYaml, load_yaml, meta_text

LOG = logging.getLogger("ritrag.sources")
MKDOCS_CONFIG = "mkdocs.yml"
INDEX_NAMES = ("index.md", "README.md")
CATEGORY_FILES = ("_category_.json", "_category_.yml", "_category_.yaml")  # Docusaurus


@dataclass
class Nav:
    """A nav flattened: every listed document (path relative to the docs folder)
    with its chain of section titles and its own title; each section's index
    document and entries in order (a section is keyed by its chain; () is the top)."""

    docs_dir: str
    entries: dict[str, tuple[tuple[str, ...], str | None]] = field(default_factory=dict)
    section_index: dict[tuple[str, ...], str] = field(default_factory=dict)
    section_entries: dict[tuple[str, ...], list[str | tuple[str, ...]]] = field(default_factory=dict)


def parse_nav(config_text: str, config_dir: str) -> Nav | None:
    """The nav of an `mkdocs.yml` (None when it has none, is not YAML, or is refused)."""
    try:
        config = load_yaml(config_text)
    except RefusedYaml as exc:
        LOG.warning("%s/%s refused, its documents are placed by folders: %s", config_dir, MKDOCS_CONFIG, exc.problem)
        return None
    except yaml.YAMLError:
        return None
    if not isinstance(config, dict) or not isinstance(config.get("nav"), list):
        return None
    nav = Nav(posixpath.join(config_dir, meta_text(config.get("docs_dir")) or "docs"))
    _walk(nav, config["nav"])
    return nav


def _walk(nav: Nav, top: list) -> None:
    """Flatten the nav's items into `nav`, in order (depth first, with a stack)."""
    stack: list[tuple[tuple[str, ...], list, int]] = [((), top, 0)]  # (chain, items, next item)
    while stack:
        chain, items, index = stack.pop()
        listed = nav.section_entries.setdefault(chain, [])
        if index >= len(items):
            continue
        stack.append((chain, items, index + 1))
        item = items[index]
        title, value = (None, item) if isinstance(item, str) else (
            next(iter(item.items())) if isinstance(item, dict) and len(item) == 1 else (None, None))
        title = None if title is None else meta_text(title)
        if isinstance(value, list) and title is not None:
            listed.append(chain + (title,))
            stack.append((chain + (title,), value, 0))
        elif isinstance(value, str) and "://" not in value and value not in nav.entries:
            path = posixpath.normpath(value.lstrip("/"))
            nav.entries[path] = (chain, title)
            listed.append(path)
            if chain and posixpath.basename(path) in INDEX_NAMES and chain not in nav.section_index:
                nav.section_index[chain] = path


@functools.lru_cache(maxsize=64)
def _load_nav(config_path: str) -> Nav | None:
    try:
        with FileSystems.open(config_path) as fh:
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return None
    return parse_nav(text, posixpath.dirname(config_path))


@functools.lru_cache(maxsize=4096)
def file_exists(path: str) -> bool:
    """Whether an input file (a nav, category or project file) exists, asked once per worker."""
    return FileSystems.exists(path)


def _covering_nav(file: SourceFile) -> Nav | None:
    """The nav of the nearest `mkdocs.yml` in the document's folder or above it, within the input."""
    if not file.root or not file.path.startswith(file.root):
        return None
    folders = file.path[len(file.root):].split("/")[:-1]
    for depth in range(len(folders), -1, -1):
        config = file.root + "/".join([*folders[:depth], MKDOCS_CONFIG]).lstrip("/")
        if file_exists(config):
            return _load_nav(config)
    return None


def nav_trail(nav: Nav, relative: str, url_of) -> tuple[tuple[Crumb, ...], str | None, tuple[str, ...]]:
    """(trail, nav title, nav order) of the document at `relative` (to the docs folder), listed in `nav`."""
    chain, title = nav.entries[relative]
    indexes = nav.section_index.get(chain) == relative
    listed_chain = chain[:-1] if indexes else chain
    home = next((name for name in INDEX_NAMES if name in nav.entries and not nav.entries[name][0]), None)
    crumbs = [Crumb(title_, url_of(nav.section_index[chain[:i + 1]]) if chain[:i + 1] in nav.section_index
                    else None) for i, title_ in enumerate(listed_chain)]
    if home and relative != home:
        crumbs.insert(0, Crumb(nav.entries[home][1] or "Home", url_of(home)))
    own = chain if indexes else (() if relative == home else None)
    order = tuple(url_of(entry) if isinstance(entry, str) else url_of(nav.section_index[entry])
                  for entry in nav.section_entries.get(own, ()) if own is not None
                  and (isinstance(entry, str) or entry in nav.section_index)
                  and entry != relative)
    return tuple(crumbs), title, order


def document_trail(file: SourceFile) -> tuple[tuple[Crumb, ...], str, str | None, tuple[str, ...]]:
    """(trail, trail method, title the nav gives it or None, nav order) of a document file."""
    nav = _covering_nav(file) if file.url_of else None
    if nav is not None:
        docs_dir = nav.docs_dir.rstrip("/") + "/"
        relative = file.path[len(docs_dir):] if file.path.startswith(docs_dir) else None
        if relative in nav.entries:
            def url_of(path: str) -> str:
                return file.url_of(docs_dir + path)

            crumbs, title, order = nav_trail(nav, relative, url_of)
            return crumbs, "mkdocs_nav", title, order
    return folder_trail(file), "folders", None, ()


def folder_trail(file: SourceFile) -> tuple[Crumb, ...]:
    """One crumb per folder between the site and the document, titled by the
    folder's `_category_.json` label where it has one, else by its name."""
    crumbs = directory_trail(file.site, file.url)
    if not crumbs or not file.root or not file.path.startswith(file.root):
        return crumbs
    folders = file.path[len(file.root):].split("/")[:-1]
    if len(folders) < len(crumbs):
        return crumbs
    # The crumbs are the document's innermost folders (the outer ones are the site's).
    paths = [file.root + "/".join(folders[:i + 1]) for i in range(len(folders) - len(crumbs), len(folders))]
    return tuple(Crumb(_category_label(path) or crumb.title, crumb.url) if crumb.title == posixpath.basename(path)
                 else crumb for crumb, path in zip(crumbs, paths))


@functools.lru_cache(maxsize=4096)
def _category_label(folder: str) -> str | None:
    """The `label` of a folder's Docusaurus category file, None without one."""
    for name in CATEGORY_FILES:
        path = posixpath.join(folder, name)
        if not file_exists(path):
            continue
        try:
            with FileSystems.open(path) as fh:
                text = fh.read()
            category = json.loads(text) if name.endswith(".json") else load_yaml(text)
        except (OSError, ValueError, yaml.YAMLError):
            return None
        label = meta_text(category.get("label")) if isinstance(category, dict) else ""
        return label or None
    return None
