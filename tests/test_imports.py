"""The shape of the code: what the host takes from the runner, what it declares, no cycles."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

from conftest import REPO

HOST = sorted((REPO / "orchestrator").glob("*.py"))
# Scripts that run on the host (plain_loop.py runs inside an image, beside the runner).
BENCH = [p for p in sorted((REPO / "bench").glob("*.py")) if p.name != "plain_loop.py"]
RUNNER = sorted((REPO / "images" / "runner" / "dlbench_runner").glob("*.py"))


def imports(path: Path) -> list[tuple[str, int]]:
    """(absolute module name, line) of every import in a file, at any depth; relative
    imports of the orchestrator are named ``orchestrator.x``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = path.parent.name if node.level == 1 else ""
                names = [f"{base}.{node.module}"] if node.module else \
                    [f"{base}.{alias.name}" for alias in node.names]
            else:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            found += [(name, node.lineno) for name in names]
    return found


def test_the_host_takes_only_the_contract_from_the_runner():
    for path in HOST + BENCH:
        for name, line in imports(path):
            if name.split(".")[0] == "dlbench_runner":
                assert name in ("dlbench_runner", "dlbench_runner.contract") or \
                    name.startswith("dlbench_runner.contract."), f"{path.name}:{line} imports {name}"


def test_the_runner_is_standard_library_only():
    own = {p.stem for p in RUNNER}
    for path in RUNNER:
        for name, line in imports(path):
            top = name.split(".")[0]
            if top in ("dlbench_runner", "") or top in own:
                continue
            # numpy: only inside the data readers' functions, which every image has
            assert top in sys.stdlib_module_names or (top == "numpy" and path.name == "data.py"), \
                f"{path.name}:{line} imports {name}"
        ast.parse(path.read_text(), str(path), feature_version=(3, 9))


def test_every_imported_package_is_declared():
    declared = {re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0].lower()
                for d in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]}
    distributions = importlib.metadata.packages_distributions()
    local = {"orchestrator", "dlbench_runner", "dlbench_images", "tomllib", "tomli"}
    for path in HOST + BENCH:
        for name, line in imports(path):
            top = name.split(".")[0]
            if not top or top in sys.stdlib_module_names or top in local:
                continue
            owners = {d.lower() for d in distributions.get(top, [top])}
            assert owners & declared, f"{path.relative_to(REPO)}:{line} imports {top}, " \
                                      f"which pyproject.toml does not declare"


def test_the_host_modules_import_no_cycle():
    graph = {p.stem: set() for p in HOST}
    for path in HOST:
        for name, _ in imports(path):
            parts = name.split(".")
            if parts[0] == "orchestrator" and len(parts) > 1 and parts[1] in graph and parts[1] != path.stem:
                graph[path.stem].add(parts[1])
    done, path = set(), []

    def visit(module):
        if module in path:
            raise AssertionError("import cycle: " + " -> ".join(path[path.index(module):] + [module]))
        if module in done:
            return
        path.append(module)
        for other in sorted(graph[module]):
            visit(other)
        path.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)
