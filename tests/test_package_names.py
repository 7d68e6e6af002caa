"""The product is one import namespace, `ritrag.*`: the folders pipelines/,
transforms/, serving/ and cli/ install as ritrag.pipelines, ... (setup.py), so
code that imports them, or reads their resources, by the folder's bare name
works only from a checkout and breaks the installed product (issue 24: `ritrag
serve` read its web page through the folder name, `files` of "serving")."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from support import parsed_source

REPO = Path(__file__).resolve().parent.parent
FOLDERS = ("pipelines", "transforms", "serving", "evaluation", "cli")
CODE = ("ritrag", *FOLDERS, "tests", "benchmarks")


def bare_names(source: str) -> list[tuple[int, str]]:
    """(line, what) for every import of a bare folder name and every
    `files("<folder>...")` / `import_module("<folder>...")` in `source`."""
    found = []
    for node in ast.walk(parsed_source(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names if a.name.split(".")[0] in FOLDERS]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in FOLDERS:
                found.append((node.lineno, f"from {node.module} import"))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            name = getattr(node.func, "id", getattr(node.func, "attr", ""))
            value = node.args[0].value
            if name in ("files", "import_module", "find_spec") and isinstance(value, str) \
                    and value.split(".")[0] in FOLDERS:
                found.append((node.lineno, f"{name}({value!r})"))
    return found


def test_the_check_sees_each_kind_of_bare_name():
    source = ("import serving.http\nfrom transforms.parse import x\nfiles('serving')\n"
              "importlib.import_module('pipelines.build')\nfrom ritrag.serving import http\nfiles('ritrag.serving')\n")
    assert [what for _, what in bare_names(source)] == [
        "import serving.http", "from transforms.parse import", "files('serving')", "import_module('pipelines.build')"]


@pytest.mark.parametrize("folder", CODE)
def test_no_code_names_a_folder_instead_of_its_package(folder):
    offenders = [f"{path.relative_to(REPO)}:{line}: {what}"
                 for path in sorted((REPO / folder).rglob("*.py"))
                 for line, what in bare_names(path.read_text(encoding="utf-8"))]
    assert not offenders, "use the installed name ritrag.<folder>:\n" + "\n".join(offenders)
