"""MkDocs hooks: the pages that are generated, never typed by hand.

A page marks where generated Markdown goes with an HTML comment:

    <!-- dlbench: schema -->                 the row schema, from orchestrator/schema.py
    <!-- dlbench: report measurements/DIR --> `dlbench report --format md` of the rows
                                             committed under docs/measurements/DIR/runs/
    <!-- dlbench: robustness measurements/DIR -->  its robustness tables only (one per
                                             data set: attacks, ONNX, model size, check),
                                             and the transfer matrices where the rows'
                                             FGSM images and models are committed beside them
    <!-- dlbench: settings measurements/DIR -->    its measured table and the table of the
                                             varied settings against the measures

A marked results directory without rows is an error, so a table whose rows are missing
fails the build (``mkdocs build --strict``).
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

MARKER = re.compile(r"<!-- dlbench: (schema|(report|robustness|settings) (\S+)) -->")


def on_page_markdown(markdown, page, config, files):
    def replace(match):
        if match.group(1) == "schema":
            return schema_markdown()
        text = report_markdown(Path(config["docs_dir"]) / match.group(3))
        if match.group(2) == "settings":
            return settings_tables(text, match.group(3))
        return text if match.group(2) == "report" else robustness_tables(text, match.group(3))
    return MARKER.sub(replace, markdown)


def robustness_tables(text: str, where: str) -> str:
    """The robustness tables of a report's Markdown (each a heading and its table)."""
    parts = re.split(r"(?m)^(?=#+ )", text)
    found = [part for part in parts if re.match(r"#+ (Robustness|Transfer attacks) on ", part)]
    if not found:
        raise RuntimeError(f"{where}: the rows have no robustness rows to tabulate")
    return "".join(found)


def settings_tables(text: str, where: str) -> str:
    """The measured table and the table of varied settings of a report's Markdown."""
    parts = re.split(r"(?m)^(?=#+ )", text)
    found = [part for part in parts if re.match(r"#+ (Measured|How the varied settings)", part)]
    if not any(re.match(r"#+ How the varied settings", part) for part in found):
        raise RuntimeError(f"{where}: the rows vary no setting to tabulate")
    return "".join(found)


def report_markdown(results: Path) -> str:
    """The report of committed rows, as ``dlbench report --format md`` prints it."""
    from orchestrator import report, store

    if not (results / store.RUNS).is_dir():
        raise RuntimeError(f"{results}: the rows behind this table are missing "
                           f"(expected {results / store.RUNS})")
    text, _ = report.make_report(results, "md", None)
    # the report's own headings below the page's "### Rows: ..." heading
    return re.sub(r"^(#+) ", lambda m: "###" + m.group(1) + " ", text, flags=re.M)


def schema_markdown() -> str:
    """Every column of a row: its Parquet type, the schema version that added it and the
    comment it has in schema.py; then the history of versions, as schema.py keeps it."""
    from orchestrator import checks, schema

    comments = {}
    # the row's own columns, and each check's (``"name": (type, default),  # comment``)
    for source in (schema._Job, schema._Host, *(type(check) for check in checks.CHECKS)):
        for line in inspect.getsource(source).splitlines():
            found = re.match(r'\s+"?(\w+)"?:[^#]*#\s*(.*)$', line)
            if found:
                comments[found.group(1)] = found.group(2)
    added = {column: version for version, columns in schema.ADDED_IN.items() for column in columns}
    for version, renames in schema.RENAMED_IN.items():
        added.update({new: version for new in renames.values()})
    rows = ["| column | type | since version | note |", "|---|---|---:|---|"]
    for field in schema.ARROW_SCHEMA:
        note = comments.get(field.name, "").replace("|", "\\|")
        rows.append(f"| `{field.name}` | {field.type} | {added.get(field.name, 1)} | {note} |")
    doc = schema.__doc__ or ""
    start = doc.find("History of the row schema:")
    end = doc.find("Readers refuse")
    history = doc[start:end] if start >= 0 and end > start else doc
    return (f"Schema version **{schema.SCHEMA_VERSION}** "
            f"({len(schema.ARROW_SCHEMA)} columns; traces: version {schema.TRACE_SCHEMA_VERSION}).\n\n"
            + "\n".join(rows) + "\n\n## Versions\n\n```text\n" + history.strip("\n") + "\n```\n")
