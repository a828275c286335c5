"""The command line: options in, one call into the pipeline, errors on one line."""

from __future__ import annotations

import enum
import signal
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.exceptions import TyperException
from rich.console import Console

from . import __version__, build, catalog, datasets, plan as planning, report, sources, store
from .errors import DlbenchError, UsageError, docker_errors

app = typer.Typer(add_completion=False, invoke_without_command=True, pretty_exceptions_enable=False,
                  help="Benchmark deep-learning frameworks in containers, as GTDLBench did.")
datasets_app = typer.Typer(invoke_without_command=True, help="Check, download or import the data sets.")
app.add_typer(datasets_app, name="datasets")
out = Console(soft_wrap=True)
err = Console(stderr=True)


class BaseSource(str, enum.Enum):
    auto = "auto"
    debootstrap = "debootstrap"
    pull = "pull"


class Format(str, enum.Enum):
    table = "table"
    csv = "csv"
    json = "json"


def _names(text: str | None) -> list[str] | None:
    return [n.strip() for n in text.split(",") if n.strip()] if text else None


Frameworks = Annotated[Optional[str], typer.Option(
    help=f"Comma-separated, from {', '.join(catalog.FRAMEWORKS)} (default: all that have images).")]
BaseOpt = Annotated[BaseSource, typer.Option(
    "--base", help="Root file system: pull debian:bullseye-slim, make one with debootstrap, "
                   "or auto (pull, else debootstrap).")]
MirrorOpt = Annotated[str, typer.Option(help="Debian mirror for debootstrap.")]
CaOpt = Annotated[Optional[Path], typer.Option(
    help="CA bundle the images trust (default: the host's system bundle).")]
NetworkOpt = Annotated[Optional[str], typer.Option(
    "--build-network", help="Network mode for builds, e.g. host where the bridge cannot reach the mirrors.")]
SourcesOpt = Annotated[Optional[Path], typer.Option(
    "--sources", help="Local mirror of the pinned source archives, laid out as "
                      "<group>/<repo>-<commit>.tar.gz (default: $DLBENCH_SOURCES_DIR, else "
                      "downloads from GitHub into the user cache).")]
ResultsOpt = Annotated[Optional[Path], typer.Option(
    "--results", help="Results directory (default: $DLBENCH_RESULTS_DIR or ./dlbench-results).")]
DataOpt = Annotated[Optional[Path], typer.Option(
    "--data-dir", help="Local copy of the data sets in the canonical layout "
                       "(default: $DLBENCH_DATA_DIR, else the user cache, downloading as needed).")]


@app.callback()
@datasets_app.callback()
def _help_without_a_command(ctx: typer.Context):
    if ctx.invoked_subcommand is None:
        out.print(ctx.get_help())


def _builder_options(base, mirror, ca_bundle, network, sources_dir=None):
    return {"base_source": base.value, "mirror": mirror, "network": network,
            "ca_bundle": str(ca_bundle) if ca_bundle else None,
            "sources_dir": str(sources_dir) if sources_dir else None}


def _check_sources(frameworks, sources_dir):
    """The frameworks' pinned source archives, verified before Docker is asked anything."""
    pinned = sorted({repo for fw in frameworks for repo in catalog.models(fw).get("sources", [])})
    if pinned:
        sources.prepare(pinned, sources.mirror_dir(sources_dir))


@app.command("build-images")
def build_images(frameworks: Frameworks = None, base: BaseOpt = BaseSource.auto,
                 mirror: MirrorOpt = build.DEFAULT_MIRROR, ca_bundle: CaOpt = None,
                 build_network: NetworkOpt = None, sources_dir: SourcesOpt = None,
                 rebuild: Annotated[bool, typer.Option(help="Build again even if nothing changed.")] = False,
                 variant: Annotated[str, typer.Option(
                     help="cpu, gpu (CUDA builds, where a framework has one) or cpu,gpu.")] = "cpu",
                 verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False):
    """Build the root, base and framework images (no registry needed)."""
    from .display import RichDisplay
    from .run import docker_client

    variants = _names(variant) or []
    for name in variants:
        if name not in build.VARIANTS:
            raise UsageError(f"--variant {name!r}: choose from {', '.join(build.VARIANTS)}")
    names = catalog.check_frameworks(_names(frameworks)) if frameworks else catalog.available()
    todo = {(fw, v): build.variant_unsupported(fw, v) for v in variants for fw in names}
    for reason in todo.values():
        if reason is not None and frameworks:
            raise UsageError(reason)      # asked for by name: say so before building anything
    _check_sources([fw for (fw, _), reason in todo.items() if reason is None], sources_dir)
    display = RichDisplay(err, verbose=verbose)
    builder = build.Builder(docker_client(), say=display.say,
                            log_dir=Path(datasets.cache_root()).parent / "build-logs",
                            **_builder_options(base, mirror, ca_bundle, build_network, sources_dir))
    builder.base(rebuild=rebuild)
    for (name, v), reason in todo.items():
        if reason is not None:
            err.print(f"[yellow]skipped:[/yellow] {reason}", highlight=False)
            continue
        image = builder.framework(name, rebuild=rebuild, variant=v)
        out.print(f"{build.image_tag(name, v)}  {image.short_id}  "
                  f"{image.labels.get(build.LABEL + '.framework-version', '')}")


def _numbers(text: str | None, option: str, kind=float) -> list | None:
    if text is None:
        return None
    try:
        return [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{option} takes comma-separated numbers, not {text!r}") from None


@app.command()
def run(frameworks: Frameworks = None,
        datasets_: Annotated[Optional[str], typer.Option(
            "--datasets", help="Comma-separated: mnist, cifar10 (default: both).")] = None,
        campaign: Annotated[Optional[Path], typer.Option(
            help="A campaign file (TOML): the matrix of jobs; options below replace its axes.")] = None,
        name: Annotated[Optional[str], typer.Option(
            help="The campaign's name, stored in every row (default: the campaign file's name).")] = None,
        profile: Annotated[Optional[str], typer.Option(
            help="paper (the published defaults) or quick; comma-separated for both.")] = None,
        cpus: Annotated[Optional[int], typer.Option(
            help="Pin each job to this many CPUs and set its thread counts to match.")] = None,
        threads: Annotated[Optional[str], typer.Option(
            help="CPU counts to sweep, e.g. 1,2: each pins its jobs as --cpus does.")] = None,
        gpu: Annotated[Optional[int], typer.Option(help="Run on this GPU (index).")] = None,
        devices: Annotated[Optional[str], typer.Option(
            help="Devices to sweep, e.g. cpu,gpu:0.")] = None,
        set_: Annotated[list[str], typer.Option(
            "--set", help="Override a hyper-parameter, KEY=VALUE (repeatable).")] = [],
        sweep: Annotated[list[str], typer.Option(
            help="Sweep a hyper-parameter, KEY=VALUE,VALUE,... (repeatable).")] = [],
        batch_sizes: Annotated[Optional[str], typer.Option(
            help="Batch sizes to sweep, e.g. 32,64.")] = None,
        learning_rates: Annotated[Optional[str], typer.Option(
            help="Learning rates to sweep, e.g. 0.01,0.1.")] = None,
        settings_from: Annotated[Optional[str], typer.Option(
            "--settings-from", help="Train each framework's model with another framework's default "
                                    "batch size, learning rate and training length (GTDLBench's "
                                    "cross-settings), e.g. caffe; own,caffe for both.")] = None,
        repeats: Annotated[Optional[int], typer.Option(help="Runs of each job (default 1).")] = None,
        seed: Annotated[Optional[int], typer.Option(help="Seed of the first repeat (default 1).")] = None,
        memory: Annotated[Optional[str], typer.Option(help="Memory limit per job, e.g. 8g.")] = None,
        timeout: Annotated[Optional[float], typer.Option(
            help="Stop a job after this many seconds; it is stored with status timeout.")] = None,
        results: ResultsOpt = None, data_dir: DataOpt = None,
        dry_run: Annotated[bool, typer.Option(help="Print the plan; touch nothing.")] = False,
        resume: Annotated[bool, typer.Option(
            help="Skip jobs already stored as ok (same definition, image and data; "
                 "of the same campaign when it has a name).")] = False,
        fail_fast: Annotated[bool, typer.Option(
            help="Stop after the first job that is not ok (its row is stored).")] = False,
        runtime: Annotated[str, typer.Option(
            help="docker (each job in its own container) or native (a process of --python "
                 "on this host, no Docker).")] = "docker",
        python: Annotated[Optional[str], typer.Option(
            help="With --runtime native: the Python that has the frameworks "
                 "(default: the one running dlbench).")] = None,
        base: BaseOpt = BaseSource.auto, mirror: MirrorOpt = build.DEFAULT_MIRROR,
        ca_bundle: CaOpt = None, build_network: NetworkOpt = None, sources_dir: SourcesOpt = None,
        verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False):
    """Run the benchmark jobs, building missing images first; rows go to the results directory."""
    from . import campaign as campaigns
    from .display import RichDisplay
    from .run import RUNTIMES, run_plan

    if runtime not in RUNTIMES:
        raise UsageError(f"--runtime {runtime!r}: choose {' or '.join(RUNTIMES)}")
    if python is not None and runtime != "native":
        raise UsageError("--python goes with --runtime native")
    if cpus is not None and threads is not None:
        raise UsageError("give --cpus or --threads, not both")
    if gpu is not None and devices is not None:
        raise UsageError("give --gpu or --devices, not both")
    sweeps = planning.parse_sweeps(sweep)
    sweeps.update({k: [v] for k, v in planning.parse_overrides(set_).items()})
    for key, values in (("batch_size", _numbers(batch_sizes, "--batch-sizes", int)),
                        ("learning_rate", _numbers(learning_rates, "--learning-rates"))):
        if values is not None:
            sweeps[key] = values
    options = campaigns.Options(
        name=name, frameworks=_names(frameworks), datasets=_names(datasets_),
        profiles=_names(profile), repeats=repeats, seed=seed, memory=memory, timeout=timeout,
        threads=[cpus] if cpus is not None else _numbers(threads, "--threads", int),
        devices=[gpu] if gpu is not None else (campaigns.parse_devices(devices) if devices else None),
        settings_from=campaigns.parse_settings_from(settings_from) if settings_from is not None else None,
        hyperparameters=sweeps)
    the_plan = campaigns.make_plan(campaign, options)
    for note in the_plan.skipped:
        err.print(f"[yellow]skipped:[/yellow] {note}")
    if dry_run:
        for job in the_plan.jobs:
            sys.stdout.write(job.model_dump_json() + "\n")
        err.print(f"{len(the_plan.jobs)} job(s)" + (f" in campaign {the_plan.campaign}"
                                                      if the_plan.campaign else ""), highlight=False)
        return
    if runtime == "docker":
        _check_sources(sorted({job.framework for job in the_plan.jobs}), sources_dir)
    target = store.results_dir(results)
    records = run_plan(the_plan, target, data_dir,
                       _builder_options(base, mirror, ca_bundle, build_network, sources_dir),
                       RichDisplay(err, verbose=verbose), resume=resume, fail_fast=fail_fast,
                       runtime=runtime, python=python)
    failed = [r for r in records if r.status != "ok"]
    err.print(f"{len(records) - len(failed)} ok, {len(failed)} not ok; results in {target}")
    if failed:
        raise typer.Exit(3)


@app.command()
def results(results: ResultsOpt = None,
            format: Annotated[Format, typer.Option("--format", help="table, csv or json.")] = Format.table):
    """Show the stored runs."""
    text = report.render(store.load(store.results_dir(results)), format.value, out)
    if text is not None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")


@app.command()
def compact(results: ResultsOpt = None):
    """Merge a results directory's many small files (one a job) into one for rows and one
    for traces: reading and reporting become fast; nothing is lost."""
    target = store.results_dir(results)
    rows, traces = store.compact(target)
    out.print(f"{target}: merged {rows} row files and {traces} trace files", highlight=False)


class ReportFormat(str, enum.Enum):
    table = "table"
    md = "md"
    csv = "csv"
    json = "json"


@app.command("report")
def report_(results: ResultsOpt = None,
            format: Annotated[Optional[ReportFormat], typer.Option(
                "--format", help="table (default), md, csv or json.")] = None,
            html: Annotated[Optional[Path], typer.Option(
                "--html", help="Write a self-contained HTML page with plots to DIR/index.html.",
                metavar="DIR")] = None,
            tolerance: Annotated[float, typer.Option(
                help="Accuracy within this many percentage points of the paper counts as "
                     "reproduced.")] = report.compare.TOLERANCE_POINTS):
    """Compare the stored runs with the published GTDLBench numbers: statistics, verdicts, plots."""
    text, page = report.make_report(store.results_dir(results), format and format.value, html,
                                    tolerance, out)
    if text is not None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    if page is not None:
        err.print(f"report written to {page}", highlight=False, soft_wrap=True)


@datasets_app.command("verify")
def datasets_verify(data_dir: DataOpt = None):
    """Verify the data sets (local copy, or the cache) and print their checksums."""
    root, _ = datasets.default_root(data_dir)
    for name in catalog.DATASETS:
        info = datasets.verify(name, root)
        out.print(f"{name}: ok  {info.samples['train']} train / {info.samples['test']} test  "
                  f"sha256 {info.sha256}" + ("  (byte-identical to the official files)" if info.official else ""))


@datasets_app.command("download")
def datasets_download(names: Annotated[Optional[str], typer.Argument(help="mnist, cifar10 (default: both)")] = None):
    """Download the official archives into the user cache and verify them."""
    from .display import RichDisplay

    for name in catalog.check_datasets(_names(names) or list(catalog.DATASETS)):
        info = datasets.download(name, progress=RichDisplay(err).download_progress())
        out.print(f"{name}: ok  {info.path}  sha256 {info.sha256}")


@datasets_app.command("import")
def datasets_import(source: Annotated[Path, typer.Argument(help="A data root in the canonical layout.")]):
    """Verify a local copy and copy it into the user cache."""
    for name in catalog.DATASETS:
        if (source / name).is_dir():
            info = datasets.import_copy(name, source)
            out.print(f"{name}: imported to {info.path}  sha256 {info.sha256}")


@app.command()
def doctor(data_dir: DataOpt = None, results: ResultsOpt = None, sources_dir: SourcesOpt = None):
    """Check Docker, images, GPUs, data sets, sources and disk; say what is missing."""
    from .doctor import checks

    bad = 0
    for name, ok, detail in checks(data_dir, store.results_dir(results), sources_dir):
        mark = {True: "[green]ok[/green]  ", False: "[red]FAIL[/red]", None: "[yellow]note[/yellow]"}[ok]
        out.print(f"{mark} {name}: {detail}", highlight=False)
        bad += ok is False
    if bad:
        raise typer.Exit(1)


@app.command()
def version():
    """Print dlbench's version."""
    out.print(__version__)


class Interrupted(KeyboardInterrupt):
    """A stop signal, raised in the main thread wherever it is, as Ctrl-C is."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.exit_code = 128 + signum


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _interrupt(signum, frame):
    raise Interrupted(signum)


def main():
    # Installed whatever the parent left: a shell starts background jobs with SIGINT
    # ignored, and Python then never turns Ctrl-C into KeyboardInterrupt, so a
    # ``kill -INT`` would go by while every job ran to the end.
    for signum in STOP_SIGNALS:
        signal.signal(signum, _interrupt)
    code = 0
    try:
        with docker_errors("talking to Docker"):
            code = app(standalone_mode=False) or 0
    except typer.Exit as exc:
        code = exc.exit_code
    except TyperException as exc:   # option parsing: typer's usage errors
        _fail(exc.format_message(), exc.exit_code)
    except DlbenchError as exc:
        _fail(str(exc), exc.exit_code)
    except (KeyboardInterrupt, typer.Abort) as exc:
        _fail("interrupted; the rows stored so far are kept", getattr(exc, "exit_code", 130))
    if code == 130:
        _fail("interrupted; the rows stored so far are kept", 130)
    sys.exit(code)


def _fail(message: str, code: int):
    """Every error the user can act on ends here: one line, non-zero exit."""
    err.print(f"dlbench: error: {' '.join(message.split())}", markup=False, highlight=False,
              soft_wrap=True)
    sys.exit(code)


__all__ = ["app", "main", "UsageError"]
