"""The commands about the machine and its data: ``datasets``, ``doctor``, ``version``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from .. import __version__, catalog
from ..errors import DatasetError
from .common import (DataOpt, DoctorFormat, ResultsOpt, SourcesOpt, _names, _show_details, _write,
                     app, datasets_app, err, out)


@datasets_app.command("verify")
def datasets_verify(data_dir: DataOpt = None):
    """Verify the data sets (local copy, or the cache) and print their checksums."""
    from .. import datasets

    root, _ = datasets.default_root(data_dir)
    for name in catalog.DATASETS:
        info = datasets.verify(name, root)
        out.print(f"{name}: ok  {info.samples['train']} train / {info.samples['test']} test  "
                  f"sha256 {info.sha256}" + ("  (byte-identical to the official files)" if info.official else ""))


@datasets_app.command("download")
def datasets_download(names: Annotated[Optional[str], typer.Argument(
        help=f"{', '.join(catalog.DATASETS)} (default: all)")] = None):
    """Download the official archives into the user cache and verify them."""
    from .. import datasets
    from ..display import RichDisplay

    for name in catalog.check_datasets(_names(names) or list(catalog.DATASETS)):
        info = datasets.download(name, progress=RichDisplay(err).download_progress())
        out.print(f"{name}: ok  {info.path}  sha256 {info.sha256}")


@datasets_app.command("import")
def datasets_import(source: Annotated[Path, typer.Argument(help="A data root in the canonical layout.")]):
    """Verify a local copy and copy it into the user cache."""
    from .. import datasets

    found = [name for name in catalog.DATASETS if (source / name).is_dir()]
    if not found:
        raise DatasetError(f"{source}: no data set in it (a data root holds "
                           f"{' or '.join(n + '/' for n in catalog.DATASETS)})"
                           if source.is_dir() else f"{source}: no such folder")
    for name in found:
        info = datasets.import_copy(name, source)
        out.print(f"{name}: imported to {info.path}  sha256 {info.sha256}")


@app.command()
def doctor(data_dir: DataOpt = None, results: ResultsOpt = None, sources_dir: SourcesOpt = None,
           format: Annotated[DoctorFormat, typer.Option(
               "--format", help="table, or json: a list of {name, status, detail}.")] = DoctorFormat.table,
           verbose: Annotated[bool, typer.Option(
               "--verbose", "-v", callback=_show_details,
               help="Every check on a line of its own, with its whole detail.")] = False):
    """Check Docker, images, GPUs, data sets, sources, disk and what makes timings unstable;
    exit 1 on a failure."""
    from .. import store
    from ..display import marked
    from ..doctor import FAIL, checks, concise

    found = list(checks(data_dir, store.results_dir(results), sources_dir))
    if format is DoctorFormat.json:
        _write(json.dumps([{"name": n, "status": s, "detail": d} for n, s, d in found], indent=1))
    else:
        marked(out, [(status, f"{name}: {detail}") for name, status, detail in
                     (found if verbose else concise(found))])
        if not verbose:
            marked(out, [("", "dlbench doctor --verbose shows every check and its whole detail")])
    if any(status == FAIL for _, status, _ in found):
        raise typer.Exit(1)


@app.command()
def version():
    """Print dlbench's version."""
    out.print(__version__)
