"""The home page's chart, drawn from committed rows: each framework's training time in the
quick profile, MNIST and CIFAR-10 side by side, its accuracy at the end of each bar.

    .venv/bin/python docs/home_chart.py         writes docs/img/quick-training-time.svg

A plain SVG file, written here and committed, so that the page shows it as an image without a
script; tests/test_docs.py draws it again from the rows and fails if the committed file differs.
"""

from __future__ import annotations

import sys
from pathlib import Path
from xml.sax.saxutils import escape

DOCS = Path(__file__).resolve().parent
ROWS = DOCS / "measurements" / "2026-11-27-quick-checks" / "runs"
OUT = DOCS / "img" / "quick-training-time.svg"
DATASETS = {"mnist": ("MNIST", "#4c78a8"), "cifar10": ("CIFAR-10", "#f58518")}
LEFT, BAR_WIDTH, RIGHT, TOP, BAR, GAP = 110, 440, 110, 44, 13, 12


def figures(rows: Path = ROWS) -> list[tuple[str, str, float, float]]:
    """(framework, data set, training seconds, accuracy) of every ok row, in the study's order."""
    import pandas as pd

    from orchestrator import catalog

    runs = pd.read_parquet(rows, columns=["framework", "dataset", "status", "train_time_s", "accuracy"])
    runs = runs[runs.status == "ok"]
    medians = runs.groupby(["framework", "dataset"])[["train_time_s", "accuracy"]].median()
    order = {name: i for i, name in enumerate(catalog.STUDY_ORDER)}
    keys = sorted(medians.index, key=lambda k: (order.get(k[0], len(order)), k[0], list(DATASETS).index(k[1])))
    return [(fw, ds, float(medians.at[(fw, ds), "train_time_s"]), float(medians.at[(fw, ds), "accuracy"]))
            for fw, ds in keys]


def svg(found: list[tuple[str, str, float, float]]) -> str:
    frameworks = list(dict.fromkeys(fw for fw, *_ in found))
    longest = max(seconds for _, _, seconds, _ in found)
    step = next(s for s in (5, 10, 20, 25, 50, 100, 200, 500, 1000, 2000, 5000) if longest / s <= 6)
    top_tick = step * -(-longest // step)
    scale = BAR_WIDTH / top_tick
    group = len(DATASETS) * BAR + GAP
    height = TOP + len(frameworks) * group + 30
    width = LEFT + BAR_WIDTH + RIGHT
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
           f'height="{height}" font-family="sans-serif" font-size="12" role="img">',
           "<title>Training time in the quick profile, per framework and data set</title>"]
    x = LEFT
    for label, colour in DATASETS.values():          # the legend
        out.append(f'<rect x="{x}" y="10" width="12" height="12" fill="{colour}"/>')
        out.append(f'<text x="{x + 17}" y="20">{escape(label)}</text>')
        x += 30 + 8 * len(label)
    tick = 0
    while tick <= top_tick:
        x = LEFT + tick * scale
        out.append(f'<line x1="{x:.1f}" y1="{TOP - 6}" x2="{x:.1f}" y2="{height - 26}" stroke="#ddd"/>')
        out.append(f'<text x="{x:.1f}" y="{height - 12}" text-anchor="middle" fill="#555">{tick:g}</text>')
        tick += step
    out.append(f'<text x="{LEFT + BAR_WIDTH + 22}" y="{height - 12}" fill="#555">s of training</text>')
    for row, framework in enumerate(frameworks):
        y = TOP + row * group
        out.append(f'<text x="{LEFT - 8}" y="{y + BAR + 4}" text-anchor="end">{escape(framework)}</text>')
        for index, dataset in enumerate(DATASETS):
            for fw, ds, seconds, accuracy in found:
                if (fw, ds) != (framework, dataset):
                    continue
                top, length = y + index * BAR, seconds * scale
                hover = escape(f"{fw} {DATASETS[ds][0]}: {seconds:.1f} s, {accuracy:.1%} accurate")
                out.append(f'<rect x="{LEFT}" y="{top}" width="{length:.1f}" height="{BAR - 2}" '
                           f'fill="{DATASETS[ds][1]}"><title>{hover}</title></rect>')
                out.append(f'<text x="{LEFT + length + 4:.1f}" y="{top + BAR - 3}" font-size="10" '
                           f'fill="#333">{seconds:.0f} s · {accuracy:.1%}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main() -> int:
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(svg(figures()))
    print(f"wrote {OUT.relative_to(DOCS.parent)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(DOCS.parent))
    sys.exit(main())
