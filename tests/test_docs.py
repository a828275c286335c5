"""The documentation site: it builds strictly (no broken link or anchor, no missing page), and
its generated pages are generated: the schema from schema.py, each table of measured figures
from the rows committed beside it, so a table whose rows are missing fails the build."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import markdown
import pytest
import yaml
from conftest import REPO

from orchestrator import catalog, schema


def mkdocs(config, site):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config),
                           "-d", str(site)], capture_output=True, text=True, env=env, timeout=900)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The documentation site, built once for the tests that read it."""
    built = tmp_path_factory.mktemp("docs") / "site"
    proc = mkdocs(REPO / "mkdocs.yml", built)
    assert proc.returncode == 0, proc.stderr
    return built


def test_the_site_builds_strictly_with_its_generated_pages(site):
    tmp_path = site.parent
    page = (tmp_path / "site" / "schema" / "index.html").read_text()
    for name in schema.COLUMNS:       # every column, from the code
        assert f"<code>{name}</code>" in page, name
    assert f"Schema version <strong>{schema.SCHEMA_VERSION}</strong>" in page
    measured = (tmp_path / "site" / "measurements" / "index.html").read_text()
    assert "Against the paper" in measured and "56.52" in measured     # from the committed rows
    assert "dlbench: report" not in measured                           # every marker replaced
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    home = (tmp_path / "site" / "index.html").read_text()
    start = home.index('id="quick-start"')             # the home page opens with the quick start,
    assert start < home.index(".venv/bin/dlbench<span") < home.index(
        'src="img/quick-training-time.svg"') < home.index('id="what-dlbench-does"')   # then its chart
    assert (tmp_path / "site" / "img" / "quick-training-time.svg").is_file()
    for text in (home, readme):                       # the first run's time and disk, said up front
        assert "15 to 18 minutes" in text and "6 GB" in text
    assert 'href="https://github.com/' in home         # repo_url
    assert 'href="stylesheets/extra.css"' in home


CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")


@pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason="needs a headless browser: Debian's "
                    "chromium and chromium-driver (scripts/setup --dev installs them)")
def test_no_page_is_wider_than_a_1280_pixel_window(site):
    """A wide generated table scrolls inside its own box; the page itself never scrolls sideways."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--window-size=1280,900"):
        options.add_argument(argument)
    options.binary_location = CHROMIUM
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        for name in ("measurements", "configuration", "fair", "schema", "robustness"):
            driver.get((site / name / "index.html").as_uri())
            page, window, tables = driver.execute_script("""
                return [document.documentElement.scrollWidth, document.documentElement.clientWidth,
                        document.querySelectorAll('.md-typeset table').length];""")
            assert tables > 0, name
            assert page <= window, f"{name}: the page is {page} px wide in a {window} px window"
        driver.get((site / "index.html").as_uri())
        drawn = driver.execute_script("const i = document.querySelector('img[src$=\".svg\"]');"
                                      "return i && i.complete ? i.naturalWidth : 0;")
        assert drawn > 300                                   # the home page's chart loaded
    finally:
        driver.quit()


def test_the_home_page_chart_is_drawn_from_the_committed_rows():
    sys.path.insert(0, str(REPO / "docs"))
    try:
        import home_chart
    finally:
        sys.path.remove(str(REPO / "docs"))
    found = home_chart.figures()
    assert len(found) == 12 and {fw for fw, *_ in found} == set(catalog.STUDY_ORDER)
    caffe = next(f for f in found if f[:2] == ("caffe", "mnist"))
    assert caffe[2] == pytest.approx(25.78, abs=0.01) and caffe[3] == pytest.approx(0.9737)
    drawn = home_chart.svg(found)
    assert drawn == home_chart.OUT.read_text(), "run docs/home_chart.py and commit the chart"
    assert drawn.count("<rect") == 12 + len(home_chart.DATASETS) and "26 s · 97.4%" in drawn


def test_a_table_whose_rows_are_missing_fails_the_build(tmp_path):
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    measurements = sorted((tmp_path / "docs" / "measurements").iterdir())
    assert measurements
    shutil.rmtree(measurements[0] / "runs")
    proc = mkdocs(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode != 0
    assert "the rows behind this table are missing" in proc.stderr


LIST_LINE = re.compile(r"\n\s*(?:[-*+]|\d+\.) \S")      # a list item's first line


def lists_read_as_text(text: str) -> list[str]:
    """The paragraphs of a page, rendered with the site's Markdown extensions, that hold a
    list item's line: a list without a blank line before it, which Python-Markdown (unlike
    GitHub) reads as running text and ``--strict`` lets pass."""
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    extensions = [e if isinstance(e, str) else next(iter(e)) for e in config["markdown_extensions"]]
    html = markdown.markdown(text, extensions=extensions)
    return [p for p in re.findall(r"<p>(.*?)</p>", html, re.S) if LIST_LINE.search(p)]


def test_every_list_in_the_docs_and_the_readme_renders_as_a_list():
    pages = sorted((REPO / "docs").rglob("*.md")) + [REPO / "README.md"]
    assert len(pages) > 20
    found = {str(page.relative_to(REPO)): text for page in pages
             for text in lists_read_as_text(page.read_text())}
    assert not found, f"a list needs a blank line before it: {found}"


def test_the_list_check_finds_a_list_that_follows_a_paragraph():
    assert lists_read_as_text("How it differs:\n- one\n- two\n")
    assert lists_read_as_text("Steps:\n1. one\n2. two\n")
    assert not lists_read_as_text("How it differs:\n\n- one\n- two\n")
    assert not lists_read_as_text("## Heading\n- one\n")
