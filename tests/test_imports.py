"""The shape of the code: what the host takes from the runner, what it declares, no cycles."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import pytest

from conftest import REPO

HOST = sorted((REPO / "orchestrator").rglob("*.py"))
# Scripts that run on the host (plain_loop.py runs inside an image, beside the runner).
BENCH = [p for p in sorted((REPO / "bench").glob("*.py")) if p.name != "plain_loop.py"]
RUNNER = sorted((REPO / "images" / "runner" / "dlbench_runner").glob("*.py"))


def module_of(path: Path) -> str:
    """``orchestrator/runtimes/docker.py`` -> ``orchestrator.runtimes.docker`` (a package's
    ``__init__.py`` is the package)."""
    root = REPO / "images" / "runner" if path.is_relative_to(REPO / "images" / "runner") else REPO
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[str, int]]:
    """(absolute module name, line) of every import in a file, at any depth; relative
    imports are resolved against the file's package (``orchestrator.x.y``)."""
    package = module_of(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[:len(package) - (node.level - 1)])
                names = [f"{base}.{node.module}"] + [f"{base}.{node.module}.{a.name}" for a in node.names] \
                    if node.module else [f"{base}.{alias.name}" for alias in node.names]
            else:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            found += [(name, node.lineno) for name in names]
    return found


def test_the_host_takes_only_the_contract_and_the_fair_networks_from_the_runner():
    for path in HOST + BENCH:
        for name, line in imports(path):
            if name.split(".")[0] == "dlbench_runner":
                assert name in ("dlbench_runner", "dlbench_runner.contract", "dlbench_runner.fair") or \
                    name.startswith(("dlbench_runner.contract.", "dlbench_runner.fair.")), \
                    f"{path.name}:{line} imports {name}"


def test_the_runner_is_standard_library_only():
    own = {p.stem for p in RUNNER}
    for path in RUNNER:
        for name, line in imports(path):
            top = name.split(".")[0]
            if top in ("dlbench_runner", "") or top in own:
                continue
            # numpy, which every image has: only in the data readers' functions, the attacks
            # of the robustness check, the migration check's arrays, the fair networks and their ops
            # (which the runner imports where it runs them); torch only in what the PyTorch
            # frameworks' adapters share (imported by those adapters alone)
            torch_shared = ("torch_adapter.py", "torch_fair.py")
            assert top in sys.stdlib_module_names or (top == "numpy" and path.name in (
                "data.py", "robustness.py", "migration.py", "fair.py", "ops.py", *torch_shared)) or \
                (top == "torch" and path.name in torch_shared), f"{path.name}:{line} imports {name}"
        ast.parse(path.read_text(), str(path), feature_version=(3, 9))


def test_every_imported_package_is_declared():
    declared = {re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0].lower()
                for d in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]}
    distributions = importlib.metadata.packages_distributions()
    local = {"orchestrator", "dlbench_runner", "dlbench_images", "tomllib", "tomli"} | {p.stem for p in BENCH}
    for path in HOST + BENCH:
        for name, line in imports(path):
            top = name.split(".")[0]
            if not top or top in sys.stdlib_module_names or top in local:
                continue
            owners = {d.lower() for d in distributions.get(top, [top])}
            assert owners & declared, f"{path.relative_to(REPO)}:{line} imports {top}, " \
                                      f"which pyproject.toml does not declare"


def test_the_host_modules_import_no_cycle():
    modules = {module_of(p): p for p in HOST}
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        for imported, _ in imports(path):
            parts = imported.split(".")
            known = [".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in graph]
            if known and known[0] != name:
                graph[name].add(known[0])
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


# The stages from the top down: a module imports only from its own layer or the ones below;
# a package's modules are in its layer, and every module not named here is in the lowest
# layer (planning, images, runtimes, storage, the checks).
LAYERS = {"orchestrator.__main__": 6, "orchestrator.entry": 6, "orchestrator.cli": 5,
          "orchestrator.execute": 4, "orchestrator.tune": 4, "orchestrator.schedulers": 3,
          "orchestrator.run": 2, "orchestrator.prepare": 1}


def layer(module: str) -> int:
    """The layer of a module: its own, or its package's."""
    parts = module.split(".")
    return next((LAYERS[".".join(parts[:n])] for n in range(len(parts), 0, -1)
                 if ".".join(parts[:n]) in LAYERS), 0)


def test_no_import_goes_up_a_layer():
    modules = {module_of(p): p for p in HOST}
    for name, path in modules.items():
        for imported, line in imports(path):
            parts = imported.split(".")
            known = [".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in modules]
            if known and known[0] != name:
                assert layer(known[0]) <= layer(name), \
                    f"{path.relative_to(REPO)}:{line} imports {known[0]}, a layer above it"


# What every command would pay if the command line imported it before knowing the command;
# each is imported where it is used (bench/startup.py times the commands' imports).
HEAVY = {"pyarrow", "pandas", "numpy", "docker", "requests", "plotly", "optuna", "scipy", "onnx",
         "onnxruntime", "pydantic"}


def packages(names) -> set[str]:
    return {name.split(".")[0] for name in names}


def test_the_command_line_module_imports_no_heavy_library():
    proc = subprocess.run([sys.executable, "-c", "import sys, orchestrator.cli; print(*sys.modules)"],
                          capture_output=True, text=True, cwd=REPO, timeout=300, check=True)
    modules = set(proc.stdout.split())
    assert "orchestrator.cli" in modules
    assert not packages(modules) & HEAVY
    assert not {"orchestrator.store", "orchestrator.execute", "orchestrator.options",
                "orchestrator.plan", "orchestrator.campaign", "orchestrator.run"} & modules


def modules_of(*args: str, env: dict | None = None) -> set[str]:
    """Every module in ``sys.modules`` once a fresh ``dlbench ARGS`` has ended (whatever its
    exit status: doctor's is 1 where Docker is missing)."""
    with tempfile.TemporaryDirectory() as folder:
        listing = Path(folder) / "modules.txt"
        code = ("import atexit, runpy, sys\n"
                f"atexit.register(lambda: open({str(listing)!r}, 'w').write('\\n'.join(sys.modules)))\n"
                f"sys.argv = ['dlbench', *{list(args)!r}]\n"
                "runpy.run_module('orchestrator', run_name='__main__')\n")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                              timeout=300, env=dict(os.environ, **(env or {})))
        assert listing.is_file(), proc.stderr[-3000:]
        modules = set(listing.read_text().split())
    assert "orchestrator.cli" in modules, proc.stderr[-3000:]
    return modules


# What each command that bench/startup.py times must not import (the figures are bench/'s): every
# library it does not use, and, by their modules, the parts of dlbench it does not need.  No
# command imports pydantic to read its options (cli.common._Plain takes them), nor reading
# rows (schema.py needs none: records.py, which writes them, does).  results, report and
# compare read rows with pyarrow and NumPy, and so with pandas too: pyarrow imports pandas,
# where it is installed, the first time it converts a Python value, which the store's row
# checks do.  doctor talks to Docker (the Docker SDK, requests) and asks the driver for
# GPUs (pynvml), but reads no rows.  A group of these runs is too few to be judged, so
# compare needs no SciPy; nor does report, whose families of runs vary no setting.
ROWS = "tests/fixtures/results-v12"
UNUSED = {"docker", "requests", "plotly", "optuna", "onnx", "onnxruntime", "pydantic", "orchestrator.options",
          "orchestrator.records", "orchestrator.execute", "orchestrator.run", "orchestrator.tune"}
COMMANDS = {
    # click writes the help: typer's Rich panels import markdown-it, Pygments and attrs
    "help": (("--help",), HEAVY | {"typer.rich_utils", "rich.markdown", "pygments", "attr", "orchestrator.store",
                                   "orchestrator.report", "orchestrator.options"}),
    "results": (("results", "--results", ROWS), UNUSED | {"scipy", "orchestrator.report.paper",
                                                          "orchestrator.report.text", "orchestrator.report.views"}),
    "compare": (("compare", ROWS, ROWS), UNUSED | {"scipy", "orchestrator.report.transfer", "orchestrator.report.html"}),
    "report": (("report", "--results", ROWS, "--format", "md", "--data-dir", "{empty}"),
               UNUSED | {"scipy", "orchestrator.report.html", "orchestrator.report.charts"}),
    "doctor": (("doctor", "--results", ROWS, "--data-dir", "{empty}"),
               (UNUSED - {"docker", "requests"}) | {"pyarrow", "pandas", "numpy", "scipy", "orchestrator.store.rows",
                                                    "orchestrator.schema", "orchestrator.plan"}),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_command_imports_only_what_it_uses(command, tmp_path):
    args, forbidden = COMMANDS[command]
    modules = modules_of(*(a.format(empty=tmp_path) for a in args), env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    found = {name.split(".")[0] if name.split(".")[0] in forbidden else name
             for name in modules if name in forbidden or name.split(".")[0] in forbidden}
    assert not found, f"dlbench {command} imports {', '.join(sorted(found))}"
    if command in ("results", "compare", "report"):
        assert {"pyarrow", "pandas"} <= packages(modules), command       # they read the rows
