"""`dlbench site`: one static site over the committed measurement folders
(docs/measurements/*), opened in a real headless browser (Debian's chromium through its
chromedriver, as tests/test_report_page.py): no console error on any page, every chart
drawn, every link of the index and of the history leading to a page that exists, no page
wider than a 1280-pixel window; screenshots of the index, the history and a quick folder's
page are kept for a person to look at.  Bad input is one line and a non-zero exit, with
nothing written."""

from __future__ import annotations

import os
import urllib.parse
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from conftest import REPO, dlbench, needs_browser

MEASUREMENTS = REPO / "docs" / "measurements"
FOLDERS = sorted(p for p in MEASUREMENTS.iterdir() if p.is_dir())
BROWSER_WINDOW = (1280, 1000)       # no page wider than this window


def results_folders() -> list[Path]:
    """The committed results folders as the site counts them: each folder with rows, and
    the results folders one level inside one without."""
    found = []
    for folder in FOLDERS:
        if (folder / "runs").is_dir():
            found.append(folder)
        else:
            found += sorted(d for d in folder.iterdir() if (d / "runs").is_dir())
    return found


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site") / "out"
    proc = dlbench("site", *FOLDERS, "-o", out, check=True)
    assert proc.stdout == "" and f"site written to {out / 'index.html'}" in proc.stderr
    return out


def test_the_site_holds_an_index_a_history_and_a_page_per_results_folder(site):
    folders = results_folders()
    assert len(folders) >= 19
    pages = sorted(p.parent.name for p in (site / "runs").glob("*/index.html"))
    assert len(pages) == len(folders)
    assert "2026-11-28-exact-attacks-quick" in pages and "2026-11-26-quick" in pages
    index = (site / "index.html").read_text()
    for name in pages:
        assert f'href="runs/{name}/index.html"' in index
    assert index.count("<tr>") == len(folders) + 1
    # the library once, shared; each page refers to it
    assert (site / "plotly.min.js").stat().st_size > 1_000_000
    quick = (site / "runs" / "2026-11-26-quick" / "index.html").read_text()
    assert '<script src="../../plotly.min.js"></script>' in quick and len(quick) < 1_000_000
    assert 'id="speed-1"' in quick                    # a quick run's training-time chart


def test_the_history_has_a_chart_per_framework_data_set_and_profile_of_own_settings(site):
    """Counted from the raw rows: each framework, data set and profile with an ok run of the
    framework's own settings in some folder... at least those of the quick runs that the
    first-run folder holds with its own defaults (caffe, tensorflow and mxnet on MNIST)."""
    history = (site / "history.html").read_text()
    first_run = MEASUREMENTS / "2026-11-27-first-run" / "runs"
    rows = [r for f in first_run.glob("*.parquet") for r in pq.read_table(f).to_pylist()]
    own = {(r["framework"], r["dataset"], r["profile"]) for r in rows
           if r["status"] == "ok" and r["framework"] in ("caffe", "tensorflow", "mxnet") and r["dataset"] == "mnist"}
    assert len(own) == 3
    for framework, dataset, profile in own:
        assert f'id="history-{framework}-{dataset}-{profile}"' in history


def test_a_missing_folder_is_one_line_and_nothing_is_written(tmp_path):
    out = tmp_path / "out"
    proc = dlbench("site", MEASUREMENTS / "2026-11-26-quick", tmp_path / "nowhere", "-o", out)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "nowhere: no such directory" in proc.stderr
    assert not out.exists()


def test_folders_without_a_row_are_one_line_and_nothing_is_written(tmp_path):
    empty = tmp_path / "empty"
    (empty / "runs").mkdir(parents=True)
    (tmp_path / "notes").mkdir()
    out = tmp_path / "out"
    proc = dlbench("site", empty, tmp_path / "notes", "-o", out)
    assert proc.returncode != 0 and "no stored runs" in proc.stderr
    assert [line for line in proc.stderr.splitlines() if "error" in line] == [proc.stderr.splitlines()[-1]]
    assert not out.exists()


def test_an_out_that_is_a_file_is_one_line_and_the_file_is_kept(tmp_path):
    out = tmp_path / "out"
    out.write_text("mine")
    proc = dlbench("site", MEASUREMENTS / "2026-11-26-caffe-mnist-paper", "-o", out)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "a file, not a directory" in proc.stderr
    assert out.read_text() == "mine"


# --- in the browser ---

def opened(browser, path: Path) -> dict:
    """Open a page: its console errors, its charts (drawn or not), its links, and how much
    wider than the window it is."""
    browser.get(path.as_uri())
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    found = browser.execute_script("""return {
        plots: [...document.querySelectorAll('.js-plotly-plot')].map(el => ({id: el.id,
            drawn: el.querySelectorAll('.main-svg').length > 0 && el.querySelectorAll(
                '.scatterlayer .trace, .barlayer .trace, .heatmaplayer image, .imagelayer image').length > 0})),
        figures: document.querySelectorAll('figure').length,
        links: [...document.querySelectorAll('a[href]')].map(a => a.href).filter(h => h.startsWith('file:')),
        wider: document.documentElement.scrollWidth - document.documentElement.clientWidth}""")
    return {"errors": errors, **found}


def shot(browser, name: str) -> None:
    """A screenshot of the whole page (for a person to look at), where DLBENCH_SCREENSHOTS
    names a folder."""
    folder = os.environ.get("DLBENCH_SCREENSHOTS")
    if folder:
        height = browser.execute_script("return document.documentElement.scrollHeight")
        browser.set_window_size(1280, min(height, 8000))
        browser.save_screenshot(str(Path(folder) / f"{name}.png"))
        browser.set_window_size(1280, 1000)


def local(uri: str) -> Path:
    return Path(urllib.parse.unquote(urllib.parse.urlparse(uri).path))


@needs_browser
def test_every_page_of_the_site_opens_without_an_error_with_every_chart_drawn(browser, site):
    index = opened(browser, site / "index.html")
    assert index["errors"] == [] and index["wider"] <= 0
    shot(browser, "site-index")
    pages = [local(link) for link in index["links"]]
    assert site / "history.html" in pages
    assert len([p for p in pages if p.parent.parent == site / "runs"]) == len(results_folders())
    # the index filters by a typed word: a machine, a profile
    shown = browser.execute_script("""const box = document.querySelector('input.filter');
        box.value = 'fair'; box.dispatchEvent(new Event('input'));
        return [...document.querySelectorAll('#folders tbody tr')].filter(r => !r.hidden).map(
            r => r.cells[2].textContent)""")
    # every committed folder with rows of the fair profile, and no other
    fair = sorted(f.name for f in results_folders()
                  if (pd.read_parquet(f / "runs", columns=["profile"])["profile"] == "fair").any())
    assert "2026-11-27-fair" in fair and sorted(shown) == fair

    history = opened(browser, site / "history.html")
    assert history["errors"] == [] and history["wider"] <= 0
    assert len(history["plots"]) == history["figures"] > 0
    assert all(p["drawn"] for p in history["plots"]), [p["id"] for p in history["plots"] if not p["drawn"]]
    shot(browser, "site-history")

    for page in pages:
        assert page.is_file(), page
        if page.parent.parent != site / "runs":
            continue
        found = opened(browser, page)
        assert found["errors"] == [], page
        assert found["wider"] <= 0, page
        assert found["plots"] and all(p["drawn"] for p in found["plots"]), page
        assert site / "index.html" in [local(link) for link in found["links"]]
        if page.parent.name == "2026-11-26-quick":
            assert any(p["id"] == "chart-speed-1" for p in found["plots"])
            shot(browser, "site-quick")


@needs_browser
def test_a_table_sorts_by_a_click_on_its_heading(browser, site):
    opened(browser, site / "runs" / "2026-11-26-quick" / "index.html")
    order = browser.execute_script("""const table = document.getElementById('judged');
        const heading = [...table.tHead.rows[0].cells].find(th => th.textContent.startsWith('accuracy %'));
        const column = [...table.tHead.rows[0].cells].indexOf(heading);
        heading.click();
        const up = [...table.tBodies[0].rows].map(r => parseFloat(r.cells[column].textContent));
        heading.click();
        const down = [...table.tBodies[0].rows].map(r => parseFloat(r.cells[column].textContent));
        return [up, down, heading.getAttribute('aria-sort')]""")
    up, down, state = order
    assert up == sorted(up) and down == sorted(up, reverse=True) and state == "descending"
    assert len(up) == 12
