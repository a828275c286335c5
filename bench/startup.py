#!/usr/bin/env python3
"""How long each dlbench command spends importing before it starts its work.

Each command (``dlbench --help``, ``results`` and ``report`` on a small results folder,
``compare`` of two such folders, ``doctor``) runs ``--rounds`` times in a fresh
``python -X importtime -m orchestrator ...``, in turn; Python's own import log gives the
cumulative time of every top-level import, and their sum is the command's import time (the
interpreter's own start-up, ``site`` and ``encodings``, included).  Printed for each command:
the least and the median of the rounds, the command's wall time (median) and the heaviest
packages it imported (their cumulative time in the median round).  ``--tree COMMAND``
prints that command's import tree, down to the imports that take at least ``--min-ms``.

The goal is under 0.3 s of imports a command; ``dlbench --help`` has none of the heavy
libraries (pyarrow, pandas, the Docker SDK, Plotly, Optuna, SciPy), which the commands
import where they use them.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from _common import Parser, header, positive_int

HERE = Path(__file__).resolve().parent
SMALL = HERE.parent / "docs" / "measurements" / "2026-11-26-quick"     # 12 quick runs
OTHER = HERE.parent / "docs" / "measurements" / "2026-11-27-quick-checks"
GOAL_S = 0.3


@dataclass
class Import:
    """One line of ``-X importtime``: a module, its own and its cumulative time (µs)."""
    name: str
    own_us: int
    total_us: int
    depth: int
    children: list[Import] = field(default_factory=list)


def parse(log: str) -> list[Import]:
    """The top-level imports of an ``-X importtime`` log, each with its tree.  Python writes
    a module's line after those of the modules it imported, two spaces deeper each."""
    pending: list[Import] = []
    for line in log.splitlines():
        if not line.startswith("import time:") or line.rstrip().endswith("imported package"):
            continue
        own, total, name = line[len("import time:"):].split("|", 2)
        text = name[1:]                         # one space after the bar, then the depth
        depth = (len(text) - len(text.lstrip(" "))) // 2
        node = Import(text.strip(), int(own), int(total), depth)
        while pending and pending[-1].depth > depth:
            node.children.insert(0, pending.pop())
        pending.append(node)
    return pending


def packages(tops: list[Import]) -> dict[str, int]:
    """Each third-party package's cumulative time (µs), where it was first imported."""
    found: dict[str, int] = {}

    def visit(node: Import) -> None:
        top = node.name.split(".")[0]
        if top not in found and top not in sys.stdlib_module_names and top != "orchestrator" \
                and not top.startswith("_"):
            found[top] = node.total_us
        for child in node.children:
            visit(child)

    for node in tops:
        visit(node)
    return found


def commands(results: Path, other: Path) -> dict[str, list[str]]:
    return {"help": ["--help"],
            "results": ["results", "--results", str(results)],
            "report": ["report", "--results", str(results), "--format", "md"],
            "compare": ["compare", str(results), str(other)],
            "doctor": ["doctor", "--results", str(results)]}


def run_once(args: list[str]) -> tuple[float, list[Import], int]:
    """(wall seconds, top-level imports, exit status) of one fresh ``dlbench ARGS``."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "orchestrator", *args],
                          cwd=HERE.parent, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, env=dict(os.environ, COLUMNS="100"))
    return time.perf_counter() - start, parse(done.stderr), done.returncode


def show_tree(node: Import, min_us: int, indent: int = 0) -> None:
    if node.total_us < min_us:
        return
    print(f"{node.total_us / 1000:8.1f} ms  {'  ' * indent}{node.name}")
    for child in node.children:
        show_tree(child, min_us, indent + 1)


def main() -> None:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=SMALL,
                        help="the small results folder (default: the committed 12 quick runs)")
    parser.add_argument("--other", type=Path, default=OTHER,
                        help="compare's B side (default: the committed quick runs with checks)")
    parser.add_argument("--rounds", type=positive_int, default=5, help="runs of each command (default 5)")
    parser.add_argument("--top", type=int, default=4, help="heaviest packages shown (default 4)")
    parser.add_argument("--commands", default="help,results,report,compare,doctor",
                        help="which, comma-separated (default: all five)")
    parser.add_argument("--tree", choices=["help", "results", "report", "compare", "doctor"],
                        help="print this command's import tree instead")
    parser.add_argument("--min-ms", type=float, default=5.0,
                        help="with --tree, the least cumulative time shown (default 5 ms)")
    args = parser.parse_args()
    for given, what in ((args.results, "--results"), (args.other, "--other")):
        if not (given / "runs").is_dir():
            parser.error(f"{what} {given}: not a results folder (no runs/ in it)")
    sys.path.insert(0, str(HERE.parent))
    table = commands(args.results.resolve(), args.other.resolve())
    unknown = set(args.commands.split(",")) - set(table)
    if unknown:
        parser.error(f"--commands {args.commands}: choose from {', '.join(table)}")
    if args.tree:
        _, tops, _ = run_once(table[args.tree])
        for node in tops:
            show_tree(node, int(args.min_ms * 1000))
        return
    header(more=f"; load average {os.getloadavg()[0]:.2f}")
    print(f"results  {args.results} (compare's B: {args.other})")
    measured: dict[str, list[tuple[float, list[Import], int]]] = {
        name: [] for name in table if name in args.commands.split(",")}
    for _ in range(args.rounds):            # in turn, so that a burst of load touches all alike
        for name in measured:
            measured[name].append(run_once(table[name]))
    print(f"\n{'command':<9} {'imports: least':>14} {'median':>8} {'wall':>7}  status  heaviest "
          f"(cumulative ms, median round)")
    for name, rounds in measured.items():
        totals = [sum(t.total_us for t in tops) / 1e6 for _, tops, _ in rounds]
        middle = sorted(range(len(rounds)), key=lambda i: totals[i])[len(rounds) // 2]
        heavy = sorted(packages(rounds[middle][1]).items(), key=lambda kv: -kv[1])[:args.top]
        codes = sorted({code for _, _, code in rounds})
        print(f"{name:<9} {min(totals):>12.3f} s {statistics.median(totals):>6.3f} s "
              f"{statistics.median(w for w, _, _ in rounds):>5.2f} s  {','.join(map(str, codes)):<6}  "
              + ", ".join(f"{top} {us / 1000:.0f}" for top, us in heavy))
    over = [name for name, rounds in measured.items()
            if min(sum(t.total_us for t in tops) for _, tops, _ in rounds) / 1e6 >= GOAL_S]
    print(f"\ngoal: under {GOAL_S} s of imports a command; "
          + (f"over it: {', '.join(over)}" if over else "every command within it"))


if __name__ == "__main__":
    main()
