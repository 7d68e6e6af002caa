"""The import boundaries docs/ARCHITECTURE.md states ("Modules and their
direction"), read from the source (ast), so that breaking one fails here and
not in a later refactoring.

1. The crawler, `ritrag.transforms.crawl`, is a room of its own: the crawl and
   refresh jobs import it, nothing else does. The build reads what a crawl
   leaves through the core (`ritrag.crawl_dir`) and its input side
   (`ritrag.transforms.sources.warc`).
2. No module of the core, transforms/, pipelines/ or serving/ imports a ritrag
   module inside a function: such an import hides from the module's head what it
   depends on, and often an import cycle. Lazy imports of third-party packages
   stay allowed (torch, faiss, redis, the extras a command may lack), and cli/ is
   not checked: a command imports the job or server it runs when it runs it.
   LAZY lists the lazy ritrag imports that remain, each with its reason; none of
   them may hide a cycle.
3. Each agent framework's library is imported by its adapter module alone
   (`ritrag.serving.adapters.*`, each an extra of its own), and the adapters
   by no other part of the product, so ritrag runs with none of them.
4. The input kinds, read from their registry (`transforms/sources/kinds.py`):
   sniffing (the contract, the registry, the sniffer) needs the standard library
   alone, and neither it, dispatch nor the crawler loads a kind's parser (each
   is imported on first use, its packages being the pipeline extra's, not the
   crawl extra's); a parser takes what it needs of the HTML parser from
   `sources.common`; setup.py's SOURCES extra is the kinds' packages.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from ritrag.transforms.sources.kinds import KINDS
from support import parsed_source

REPO = Path(__file__).resolve().parent.parent
PACKAGES = {"ritrag": "ritrag", "transforms": "ritrag.transforms", "pipelines": "ritrag.pipelines",
            "serving": "ritrag.serving", "evaluation": "ritrag.evaluation", "cli": "ritrag.cli",
            "benchmarks": "benchmarks"}
CRAWLER = "ritrag.transforms.crawl"
CRAWLER_IMPORTERS = {"ritrag.pipelines.crawl", "ritrag.pipelines.refresh"}
NO_LAZY_RITRAG = ("ritrag", "transforms", "pipelines", "serving")
SERVER_PARTS = "a part of the server one mode needs (REST, MCP, a shared budget store, an object-store " \
               "mirror, the version watcher), loaded by the command that runs it"
LAZY = {("ritrag.serving.server", f"ritrag.serving.{part}"): SERVER_PARTS
        for part in ("budget_store", "http", "mcp_server", "reload", "remote")}

FRAMEWORKS = {"langchain_core": "ritrag.serving.adapters.langchain",
              "llama_index": "ritrag.serving.adapters.llamaindex",
              "agents": "ritrag.serving.adapters.openai_agents"}  # the OpenAI Agents SDK's package
ADAPTERS = "ritrag.serving.adapters"


def module_name(path: Path) -> str:
    folder = path.relative_to(REPO).parts[0]
    parts = path.relative_to(REPO / folder).with_suffix("").parts
    return ".".join([PACKAGES[folder], *(p for p in parts if p != "__init__")])


MODULES = {module_name(path): path for folder in PACKAGES if (REPO / folder).is_dir()
           for path in sorted((REPO / folder).rglob("*.py"))}


def imported(node: ast.Import | ast.ImportFrom, importer: str) -> list[str]:
    """The modules an import statement names (`from a import b` names a.b when that is a module)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    package = importer if MODULES.get(importer, Path()).name == "__init__.py" else importer.rpartition(".")[0]
    base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], node.module or ""]).strip(".") \
        if node.level else node.module
    submodules = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in MODULES]
    return submodules if len(submodules) == len(node.names) else [base, *submodules]


def imports(module: str) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(imports run when the module is imported, imports inside its functions), as (line, module)."""
    top: list[tuple[int, str]] = []
    local: list[tuple[int, str]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                (local if in_function else top).extend((child.lineno, name) for name in imported(child, module))
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue  # never run
            else:
                visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(parsed_source(MODULES[module].read_text(encoding="utf-8")), False)
    return top, local


def loaded_with(module: str, loaded: frozenset[str] = frozenset()) -> set[str]:
    """Every ritrag module that importing `module` runs (with the packages above
    each), `loaded` being in sys.modules already."""
    seen: set[str] = set(loaded)
    stack = [module]
    while stack:
        name = stack.pop()
        parents = [".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 2)]
        for found in (p for p in parents if p in MODULES and p not in seen):
            seen.add(found)
            stack.extend(target for _, target in imports(found)[0])
    return seen


def is_in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_checks_see_what_they_check():
    assert {"ritrag.transforms.crawl.round", "ritrag.transforms.sources.warc", "ritrag.urls"} <= set(MODULES)
    assert any(is_in(target, CRAWLER) for _, target in imports("ritrag.pipelines.crawl")[0])
    assert "ritrag.transforms.sources.pdf" in PARSER_MODULES and "pypdf" in third_party("ritrag.transforms.sources.pdf")
    assert "ritrag.transforms.sources.kinds" in loaded_with("ritrag.transforms.sources.sniff")
    assert "ritrag.transforms.crawl.downloader" in loaded_with("ritrag.transforms.crawl.round")
    assert {"langchain_core.tools", "ritrag.serving.adapters.base"} <= {
        target for _, target in imports("ritrag.serving.adapters.langchain")[0]}


@pytest.mark.parametrize("module", sorted(m for m in MODULES if not is_in(m, CRAWLER) and m not in CRAWLER_IMPORTERS))
def test_only_the_crawl_jobs_import_the_crawler(module):
    top, local = imports(module)
    offenders = [f"{MODULES[module].relative_to(REPO)}:{line}: {target}"
                 for line, target in top + local if is_in(target, CRAWLER)]
    assert not offenders, ("the crawler is imported only by pipelines/crawl.py and pipelines/refresh.py; what the "
                           "build reads of a crawl is in ritrag.crawl_dir and ritrag.transforms.sources.warc:\n"
                           + "\n".join(offenders))


@pytest.mark.parametrize("module", sorted(m for m in MODULES if MODULES[m].relative_to(REPO).parts[0] in NO_LAZY_RITRAG))
def test_no_ritrag_module_is_imported_inside_a_function(module):
    offenders = [f"{MODULES[module].relative_to(REPO)}:{line}: {target}" for line, target in imports(module)[1]
                 if is_in(target, "ritrag") and (module, target) not in LAZY]
    assert not offenders, "import it at the top of the module (a cycle it would make is a design error):\n" + \
        "\n".join(offenders)


@pytest.mark.parametrize("lazy", sorted(LAZY))
def test_a_lazy_import_left_hides_no_cycle(lazy):
    importer, target = lazy
    assert target in {t for _, t in imports(importer)[1]}, f"{importer} no longer imports {target} lazily: drop it"
    # The packages above the importer are loaded already when its function runs.
    above = frozenset(".".join(importer.split(".")[:i]) for i in range(1, importer.count(".") + 1))
    assert importer not in loaded_with(target, above), f"{target} imports {importer} back: a cycle"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_framework_is_imported_by_its_adapter_only(module):
    top, local = imports(module)
    offenders = [f"{MODULES[module].relative_to(REPO)}:{line}: {target}" for line, target in top + local
                 if FRAMEWORKS.get(target.split(".")[0], module) != module
                 or (is_in(target, ADAPTERS) and not is_in(module, ADAPTERS))]
    assert not offenders, ("an agent framework is imported only by its module of ritrag.serving.adapters, and the "
                           "adapters by nothing else (each framework is an extra of its own):\n" + "\n".join(offenders))


SNIFFING = ("ritrag.transforms.sources.base", "ritrag.transforms.sources.kinds", "ritrag.transforms.sources.sniff")
# The module of each kind's parser ("module:function"; HTML is read by transforms/parse).
PARSER_MODULES = {kind.parser.partition(":")[0]: kind for kind in KINDS if kind.parser}


def third_party(module: str) -> set[str]:
    """The top-level packages outside ritrag that `module` imports (at its head or in a function)."""
    top, local = imports(module)
    return {target.split(".")[0] for _, target in top + local if not is_in(target, "ritrag")}


@pytest.mark.parametrize("module", SNIFFING)
def test_sniffing_needs_the_standard_library_alone(module):
    top, local = imports(module)
    assert {target for _, target in top + local if is_in(target, "ritrag")} <= set(SNIFFING)
    assert third_party(module) <= sys.stdlib_module_names | {"__future__"}


@pytest.mark.parametrize("module", sorted({"ritrag.transforms.sources.sniff", "ritrag.transforms.sources.dispatch",
                                           *(m for m in MODULES if is_in(m, CRAWLER))}))
def test_no_kind_parser_is_loaded_before_it_is_used(module):
    loaded = loaded_with(module) & set(PARSER_MODULES)
    assert not loaded, f"{module} loads the parsers of {sorted(PARSER_MODULES[m].name for m in loaded)}; " \
                       "dispatch imports a kind's parser on first use"


@pytest.mark.parametrize("module", sorted(PARSER_MODULES))
def test_a_kind_names_a_parser_that_exists(module):
    function = PARSER_MODULES[module].parser.partition(":")[2]
    tree = parsed_source(MODULES[module].read_text(encoding="utf-8"))
    assert function in {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}


@pytest.mark.parametrize("module", sorted(PARSER_MODULES))
def test_a_kind_takes_the_html_parsers_pieces_from_common(module):
    offenders = [f"{MODULES[module].relative_to(REPO)}:{line}: {target}" for line, target in sum(imports(module), [])
                 if is_in(target, "ritrag.transforms.parse")]
    assert not offenders, "import them from ritrag.transforms.sources.common:\n" + "\n".join(offenders)


def test_the_sources_extra_is_the_kinds_packages():
    tree = parsed_source((REPO / "setup.py").read_text(encoding="utf-8"))
    extra = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == "SOURCES" for t in node.targets))
    assert sorted(extra) == sorted({package for kind in KINDS for package in kind.packages})
