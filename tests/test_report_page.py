"""The HTML report loaded in a real headless browser (Debian's chromium, driven through its
chromedriver by selenium): no console error, every chart drawn, no tick labels on top of each
other, hover and the legend working, and each chart's CSV link giving the numbers the report
holds.

The page is of real stored rows: the committed measurement rows (docs/measurements/: twelve
quick jobs, the PyTorch port's 20-epoch MNIST runs on a GPU, two Lua Torch7 runs of one and
two epochs), resource traces sampled from a real process, and, for the training-time ratios
that only full-length runs of several frameworks have, runner results with chosen times taken
through the real collect and store (as tests/test_report.py makes them).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
import urllib.parse
from pathlib import Path

import pandas as pd
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from conftest import REPO, dlbench, needs_browser
from dlbench_runner import fair as networks
from orchestrator import catalog, store
from orchestrator.report import charts, html, paper
from test_report import records, runner_rows, sample, with_traces

pytestmark = needs_browser
MEASUREMENTS = REPO / "docs" / "measurements"
# the committed rows the page is made of (the counts below are of these; more may be committed)
MEASURED = ("2026-11-25-torch7-test-pass", "2026-11-26-pytorch-mnist-h200", "2026-11-26-quick")
# the paper, MNIST on CPU: TensorFlow 2.18x Caffe's training time, Theano 22.56x, Torch 18.84x
PAPER_RUNS = [
    dict(framework="caffe", train_time_s=t, accuracy=0.9903, framework_version="1.0.0")
    for t in (100.0, 104.0)] + [
    dict(framework="tensorflow", train_time_s=2.1757 * 1.3 * 100, accuracy=0.9921, framework_version="2.20.0"),
    dict(framework="theano", train_time_s=22.56 * 2.5 * 100, accuracy=0.9830, framework_version="1.0.5"),
    dict(framework="torch", train_time_s=18.84 / 1.2 * 100, accuracy=0.9925, framework_version="torch7"),
]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    """One results directory: the committed rows (two of them with traces) and the paper rows."""
    directory = tmp_path_factory.mktemp("page") / "results"
    for measured in (MEASUREMENTS / name for name in MEASURED):
        rows = records(measured)
        if measured.name.endswith("torch7-test-pass"):
            work = [sys.executable, "-c", "b = b'x' * (100 << 20); sum(i * i for i in range(3_000_000))"]
            with_traces(rows, {r.run_id: sample(work) for r in rows}, directory)
        else:
            store.append(directory, rows)
    crafted = runner_rows(tmp_path_factory.mktemp("paper-rows"), PAPER_RUNS)
    store.append(directory, records(crafted))
    return directory


@pytest.fixture(scope="module")
def page(results, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("out")
    dlbench("report", "--results", results, "--html", out, check=True)
    return out / "index.html"


def load(browser, path: Path) -> list[dict]:
    """Open the page; its console's errors (level SEVERE)."""
    browser.get(path.as_uri())
    browser.execute_async_script("""const done = arguments[arguments.length - 1];
        if (document.readyState === 'complete') done(); else addEventListener('load', () => done());""")
    return [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


PLOTS = """return [...document.querySelectorAll('.js-plotly-plot')].map(el => ({
    id: el.id, traces: el.data.length,
    points: el.calcdata.reduce((n, points) => n + points.length, 0),
    svg: el.querySelectorAll('.main-svg').length,
    drawn: el.querySelectorAll('.scatterlayer .trace, .barlayer .trace').length,
    csv: el.closest('figure').querySelector('a.csv').href,
    ticks: [...el.querySelectorAll('.xaxislayer-above text, .yaxislayer-above text')].map(t => {
        const r = t.getBoundingClientRect();
        return {axis: t.parentNode.getAttribute('class'), text: t.textContent,
                left: r.left, right: r.right, top: r.top, bottom: r.bottom};
    })}))"""


def fetched(browser, uri: str) -> str:
    """What the page's link gives, read by the browser itself."""
    return browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch(arguments[0]).then(r => r.text()).then(done, e => done('failed: ' + e));", uri)


def overlapping(ticks: list[dict]) -> list[tuple[str, str]]:
    """Pairs of tick labels of one axis whose boxes intersect."""
    found = []
    for i, a in enumerate(ticks):
        for b in ticks[i + 1:]:
            if a["axis"] == b["axis"] and a["text"] and b["text"] and a["left"] < b["right"] - 0.5 \
                    and b["left"] < a["right"] - 0.5 and a["top"] < b["bottom"] - 0.5 and b["top"] < a["bottom"] - 0.5:
                found.append((a["text"], b["text"]))
    return found


def test_the_page_renders_every_chart_without_an_error_and_its_csv_holds_the_report(browser, page, results):
    errors = load(browser, page)
    assert errors == []
    plots = browser.execute_script(PLOTS)
    ids = [p["id"] for p in plots]
    assert ids[:2] == ["chart-ratios", "chart-accuracy"]
    assert sum(i.startswith("chart-epochs-") for i in ids) == 2       # torch7's 2 epochs, pytorch's 20
    assert sum(i.startswith("chart-traces-") for i in ids) == 1
    assert page.read_text().count('<figure id="') == len(plots)        # every chart is drawn
    for plot in plots:
        assert plot["svg"] >= 1 and plot["traces"] >= 1 and plot["drawn"] >= plot["traces"], plot["id"]
        assert plot["points"] > 0, plot["id"]
        assert overlapping(plot["ticks"]) == [], plot["id"]

    document = json.loads(dlbench("report", "--results", results, "--format", "json", check=True).stdout)
    groups = pd.DataFrame(document["groups"])
    tables = {p["id"]: pd.read_csv(io.StringIO(fetched(browser, p["csv"]))) for p in plots}

    ratios = tables["chart-ratios"]
    judged = groups[groups["ratio_vs_published"].notna() & (groups["framework"] != groups["ratio_baseline"])]
    assert sorted(ratios["framework"]) == sorted(judged["framework"]) == ["tensorflow", "theano", "torch"]
    expected = judged.set_index("framework")
    for row in ratios.itertuples():
        assert row.here_over_paper == pytest.approx(expected.at[row.framework, "ratio_vs_published"])
        assert row.verdict == expected.at[row.framework, "ratio_verdict"]
    assert dict(zip(ratios["framework"], ratios["verdict"].str.split(":").str[0])) == {
        "tensorflow": "reproduced", "theano": "not reproduced", "torch": "reproduced"}

    accuracy = tables["chart-accuracy"]
    with_accuracy = groups[groups["accuracy_pct_median"].notna()]
    assert len(accuracy) == len(with_accuracy) == len(groups)
    assert sorted(accuracy["accuracy_pct"]) == pytest.approx(sorted(with_accuracy["accuracy_pct_median"]))
    caffe = accuracy[(accuracy["framework"] == "caffe") & (accuracy["profile"] == "paper")].iloc[0]
    assert (caffe["published_accuracy_pct"], caffe["verdict"]) == (99.03, "reproduced")

    epochs = pd.concat([t for i, t in tables.items() if i.startswith("chart-epochs-")])
    stored = store.load(results).set_index("run_id")
    assert set(epochs["run_id"]) == {r for r, e in stored["epoch_loss"].items() if len(e) >= 2}
    assert len(epochs) == sum(len(stored.at[r, "epoch_loss"]) for r in set(epochs["run_id"]))
    run = epochs["run_id"].iloc[0]
    assert list(epochs.loc[epochs["run_id"] == run, "loss"]) == pytest.approx(list(stored.at[run, "epoch_loss"]))
    traces = tables[next(i for i in tables if i.startswith("chart-traces-"))]
    assert set(traces["run_id"]) == set(store.load_traces(results)["run_id"])
    assert (traces["memory_bytes"] >= 100 << 20).any()


def test_hover_shows_values_with_units_and_the_legend_hides_a_framework(browser, page):
    load(browser, page)
    text = browser.execute_script("""const el = document.getElementById('chart-accuracy');
        Plotly.Fx.hover(el, [{curveNumber: 0, pointNumber: 0}]);
        return el.querySelector('.hoverlayer').textContent;""")
    assert "accuracy" in text and "%" in text and "median of" in text
    text = browser.execute_script("""const el = document.getElementById('chart-ratios');
        Plotly.Fx.hover(el, [{curveNumber: 0, pointNumber: 0}]);
        return el.querySelector('.hoverlayer').textContent;""")
    assert "here ÷ paper" in text and "×" in text and "in the paper" in text

    toggle = browser.find_element(By.CSS_SELECTOR, "#chart-accuracy .legend .traces .legendtoggle")
    toggle.click()                        # a real click on the legend's first entry
    hidden = "return document.getElementById('chart-accuracy').data.map(t => [t.name, t.visible])"
    WebDriverWait(browser, 10).until(lambda b: ["caffe", "legendonly"] in b.execute_script(hidden))
    assert [name for name, visible in browser.execute_script(hidden) if visible == "legendonly"] == ["caffe"]


def test_accuracy_under_attack_is_a_chart_per_data_set(browser, results, tmp_path):
    """Robustness rows of two groups on MNIST: one chart, a line per group through the clean
    and FGSM points and a PGD diamond; its CSV is the medians drawn; a row without accuracy
    (no gradient to the input) is not drawn; rows without robustness get no such chart."""
    directory = tmp_path / "results"
    shutil.copytree(results, directory)
    rows = paper.build(store.load(directory)).rows
    quick = rows[(rows["status"] == "ok") & (rows["dataset"] == "mnist") & (rows["profile"] == "quick")]
    widest = quick.groupby("section")["framework"].nunique().idxmax()
    quick = quick[quick["section"] == widest].drop_duplicates("framework")
    chosen = quick.iloc[:2]             # two frameworks of one machine
    for run, clean in zip(chosen.itertuples(), (0.98, 0.9)):
        store.write_side(directory, store.ROBUSTNESS, run.run_id, [
            {"attack": a, "epsilon": e, "steps": n, "images": 100, "accuracy": acc, "time_s": 1.0}
            for a, e, n, acc in [("none", 0.0, 0, clean), ("fgsm", 0.1, 1, clean - 0.3),
                                 ("fgsm", 0.2, 1, clean - 0.6), ("pgd", 0.1, 10, clean - 0.5)]]
            + [{"attack": "fgsm", "epsilon": 0.3, "steps": 1, "images": 100, "accuracy": None,
                "reason": "no input gradient"}])
    rep = paper.build(store.load(directory))
    rep.robustness = store.load_robustness(directory, rep.rows["run_id"])
    page = html.write_page(rep, tmp_path / "page")
    assert load(browser, page) == []
    plots = {p["id"]: p for p in browser.execute_script(PLOTS)}
    robust = [p for key, p in plots.items() if key.startswith("chart-robust")]
    assert len(robust) == 1 and robust[0]["svg"] >= 1 and robust[0]["drawn"] >= 2
    data = pd.read_csv(io.StringIO(fetched(browser, robust[0]["csv"])))
    assert sorted(set(data["framework"])) == sorted(chosen["framework"])
    assert len(data) == 8 and 0.3 not in set(data["epsilon"])
    clean = data[data["attack"] == "none"].set_index("framework")["accuracy_pct"]
    assert sorted(clean) == pytest.approx([90.0, 98.0])
    assert "Accuracy under attack" not in html.render_page(paper.build(store.load(results)))


def test_the_csv_link_is_the_chart_table_itself():
    data = pd.DataFrame({"framework": ["caffe", "theano"], "accuracy_pct": [99.03, 49.66],
                         "verdict": ["reproduced", "not comparable: quick profile (it trains, for)"]})
    uri = html.csv_uri(data)
    assert uri.startswith("data:text/csv;charset=utf-8,")
    back = pd.read_csv(io.StringIO(urllib.parse.unquote(uri.split(",", 1)[1])))
    pd.testing.assert_frame_equal(back, data)


SWEEP = MEASUREMENTS / "2026-11-27-batch-threads"     # a real campaign over batch size and threads


def test_a_campaign_over_batch_size_and_threads_draws_its_settings(browser, tmp_path):
    """The committed rows of a real campaign (the PyTorch port's quick MNIST model at three
    batch sizes on one and two CPUs): the page holds the correlation table and the small
    multiples, a row per setting and a column per measure, each framework a line whose
    points are the medians the table's CSV gives; a screenshot is kept for a look."""
    directory = tmp_path / "results"
    store.append(directory, records(SWEEP))
    out = tmp_path / "page"
    dlbench("report", "--results", directory, "--html", out, check=True)
    assert load(browser, out / "index.html") == []
    plots = {p["id"]: p for p in browser.execute_script(PLOTS)}
    chart = plots["chart-settings-0"]
    assert chart["traces"] == 2 * 4 and chart["drawn"] == chart["traces"]     # 2 settings x 4 measures
    assert overlapping(chart["ticks"]) == []
    titles = browser.execute_script("""return [...document.querySelectorAll(
        '#chart-settings-0 .annotation-text')].map(t => t.textContent)""")
    assert titles == [f"{m} by {a}" for a in ("threads", "batch_size")
                      for m in ("train time", "accuracy", "CPU use", "peak memory")]
    data = pd.read_csv(io.StringIO(fetched(browser, chart["csv"])))
    stored = store.load(directory)
    ok = stored[stored["status"] == "ok"]
    at_two = ok[ok["threads"] == 2]["train_time_s"].median()
    drawn = data[(data["axis"] == "threads") & (data["measure"] == "train_time_s") & (data["value"] == 2)]
    assert drawn["median"].tolist() == pytest.approx([at_two])
    tables = browser.execute_script("""return [...document.querySelectorAll('table')].map(t => t.textContent)
        .filter(t => t.includes('setting') && t.includes('ρ'))""")
    assert len(tables) == 1 and "batch_size32, 64, 1286ρ +0.00ρ -0.97" in tables[0]  # accuracy falls
    browser.set_window_size(1400, 1800)
    browser.execute_script("document.getElementById('chart-settings-0').scrollIntoView()")
    shot = Path(os.environ.get("DLBENCH_SCREENSHOTS", tmp_path)) / "settings-chart.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000


FAIR = MEASUREMENTS / "2026-11-27-fair"     # the six frameworks' fair runs, full length


def test_the_fair_runs_draw_their_loss_curves_and_differences(browser, tmp_path):
    """The committed fair runs (all six frameworks, both data sets) with their step losses:
    a chart per data set, each framework's loss on top and its relative difference from the
    first framework's below, with the verification tables; a screenshot is kept for a look."""
    directory = tmp_path / "results"
    store.append(directory, records(FAIR))
    steps = store.load_steps(FAIR)
    for run_id, part in steps.groupby("run_id"):
        store.write_side(directory, store.STEPS, run_id, part.to_dict(orient="records"))
    out = tmp_path / "page"
    dlbench("report", "--results", directory, "--html", out, check=True)
    assert load(browser, out / "index.html") == []
    plots = {p["id"]: p for p in browser.execute_script(PLOTS)}
    for dataset in ("mnist", "cifar10"):
        chart = plots[f"chart-fair-0-{dataset}"]
        assert chart["traces"] == 6 + 5 and chart["drawn"] == chart["traces"]
        assert overlapping(chart["ticks"]) == []
        data = pd.read_csv(io.StringIO(fetched(browser, chart["csv"])))
        assert sorted(set(data["framework"])) == sorted(catalog.names()[:6])
        assert len(data) == 6 * len(steps[steps["run_id"] == steps["run_id"].iloc[0]])
    tables = browser.execute_script("""return [...document.querySelectorAll('table')].map(t => t.textContent)
        .filter(t => t.includes('logit error'))""")
    assert len(tables) == 1 and tables[0].count("yes") == 12
    browser.set_window_size(1400, 1400)
    browser.execute_script("document.getElementById('chart-fair-0-mnist').scrollIntoView()")
    shot = Path(os.environ.get("DLBENCH_SCREENSHOTS", tmp_path)) / "fair-chart.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000


FAIR_OPS = MEASUREMENTS / "2026-11-27-fair-ops"     # the fair run from a fresh clone, layers timed


def test_the_fair_layer_times_draw_a_stacked_bar_per_framework(browser, tmp_path):
    """The committed fair run whose jobs timed their layers: per data set, one bar per
    framework stacking each layer's forward and backward time, the rest of the step, the
    step and the network as one model; its CSV the report's numbers; a screenshot kept."""
    directory = tmp_path / "results"
    store.append(directory, records(FAIR_OPS))
    for side in ("steps", "ops"):
        shutil.copytree(FAIR_OPS / side, directory / side)
    out = tmp_path / "page"
    dlbench("report", "--results", directory, "--html", out, check=True)
    assert load(browser, out / "index.html") == []
    plots = {p["id"]: p for p in browser.execute_script(PLOTS)}
    ops = store.load_ops(FAIR_OPS)
    for dataset in ("mnist", "cifar10"):
        layers = len(networks.NETWORKS[dataset]["layers"])
        chart = plots[f"chart-ops-0-{dataset}"]
        # a forward and a backward bar per layer, the rest, the network's diamonds, the steps
        assert chart["traces"] == 2 * layers + 3 and chart["drawn"] == chart["traces"]
        assert overlapping(chart["ticks"]) == []
        data = pd.read_csv(io.StringIO(fetched(browser, chart["csv"])))
        assert sorted(set(data["framework"])) == sorted(catalog.names()[:6])
        assert len(data) == 6 * (layers + 2)            # the layers, the network, the step
        drawn = data[data["layer"] == "conv1"].set_index("framework")["forward_s"]
        stored = ops[(ops["layer"] == "conv1") & (ops["pass"] == "forward")
                     & (ops["shape"] == data[data["layer"] == "conv1"]["shape"].iloc[0])]
        assert sorted(drawn.round(12)) == sorted(stored["time_s"].round(12))
    browser.set_window_size(1400, 1000)
    browser.execute_script("document.getElementById('chart-ops-0-cifar10').scrollIntoView()")
    shot = Path(os.environ.get("DLBENCH_SCREENSHOTS", tmp_path)) / "ops-chart.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
