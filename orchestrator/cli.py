"""The command line: options in, one call into the pipeline, errors on one line."""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import json
import sys
import warnings
from pathlib import Path
from typing import Annotated, Any, Callable, Optional, get_args

import typer
from typer.exceptions import TyperException
from rich.console import Console
from dlbench_runner import contract

# Each command imports what it uses: dlbench --help loads none of store (pyarrow), execute (the
# Docker SDK, the job loop), options (pydantic), datasets, downloads or sources
from . import __version__, axes, build, catalog
from .choices import SCHEDULERS, VARIANTS
from .interrupts import interrupted, received
from .runtimes import RUNTIMES
from .errors import (DatasetError, DeprecatedName, DlbenchError, StoreWarning, UsageError, docker_errors,
                     usage_message)

EXIT_CODES = ("Exit status: 0 ok; 1 an error (one line on stderr); 2 a usage error; 3 some jobs "
              "not ok (their rows are stored); 4 dlbench compare --fail-on-slowdown: a group "
              "slower past it; 5 dlbench compare --fail-on-slowdown: a group it could not judge "
              "(too few runs, one side only); 128 + the signal's number when stopped by one: 130 "
              "Ctrl-C (SIGINT), 143 SIGTERM, 129 SIGHUP (the rows stored so far are kept).")
class _Readable:
    """A command whose options show their values by a word (TEXT, INTEGER, PATH,
    table|csv|json), and whose arguments their names alone, not the Python type that Typer
    0.2x shows (<str>, <list[str]>)."""

    def get_params(self, ctx):
        params = super().get_params(ctx)
        for param in params:
            found = getattr(param, "type_descriptor", None)      # Typer 0.2x's own parser
            if param.metavar is None and found is not None and param.param_type_name == "option":
                param.metavar = _metavar(param, found)
            elif found is not None and param.param_type_name == "argument":
                param.display_type_rich = _no_type       # its name says what it takes, and its help
        return params


def _no_type(ctx) -> None:
    return None


def _metavar(param, found) -> str:
    if getattr(param, "is_flag", False):
        return ""
    if found.is_choice:
        return "|".join(str(getattr(choice, "value", choice)) for choice in found.choices)
    kind = (get_args(found.annotation) or [str])[0] if found.is_list else found.annotation
    return {int: "INTEGER", float: "NUMBER", Path: "PATH"}.get(kind, "TEXT")


class _Command(_Readable, typer.core.TyperCommand):
    pass


class _Group(_Readable, typer.core.TyperGroup):
    pass


class _Typer(typer.Typer):
    def command(self, *args, **kwargs):
        return super().command(*args, **{**kwargs, "cls": kwargs.get("cls") or _Command})


# Help as click writes it: typer's Rich panels import Markdown, Pygments and attrs, a good part
# of the start-up that every command pays
app = _Typer(cls=_Group, add_completion=True, invoke_without_command=True, pretty_exceptions_enable=False,
                  help="Benchmark deep-learning frameworks in containers, as GTDLBench did.",
                  epilog=EXIT_CODES, rich_markup_mode=None)
datasets_app = _Typer(cls=_Group, invoke_without_command=True, help="Check, download or import the data sets.",
                           rich_markup_mode=None)
app.add_typer(datasets_app, name="datasets")
out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)     # a log file gets whole lines, not 80 columns


BaseSource = enum.Enum("BaseSource", {b: b for b in build.BASE_SOURCES}, type=str)


class Format(str, enum.Enum):
    table = "table"
    csv = "csv"
    json = "json"


class PlanFormat(str, enum.Enum):
    table = "table"
    json = "json"


class DoctorFormat(str, enum.Enum):
    table = "table"
    json = "json"


Runtime = enum.Enum("Runtime", {r: r for r in RUNTIMES}, type=str)
Scheduler = enum.Enum("Scheduler", {s: s for s in SCHEDULERS}, type=str)


def _one_of(choices) -> str:
    return "|".join(choices)


def _names(text: str | None) -> list[str] | None:
    from .options import names      # pydantic: loaded by the commands that take names only

    return names(text)


Frameworks = Annotated[Optional[str], typer.Option(
    help=f"Comma-separated, from {', '.join(catalog.STUDY_ORDER)} and any added on "
         f"${catalog.PATH_VARIABLE} or by an installed package (default: all).")]
BaseOpt = Annotated[BaseSource, typer.Option(
    "--base", help="Root file system: pull debian:bullseye-slim, make one with debootstrap, "
                   "or auto (pull, else debootstrap).")]
MirrorOpt = Annotated[str, typer.Option(help="Debian mirror for debootstrap.")]
CaOpt = Annotated[Optional[Path], typer.Option(
    help="CA bundle the images trust (default: the host's system bundle).")]
NetworkOpt = Annotated[Optional[str], typer.Option(
    "--build-network", help="Network mode for builds, e.g. host where the bridge cannot reach the mirrors.")]
DownloadCacheOpt = Annotated[bool, typer.Option(
    help="Keep the Debian packages and Python packages the builds fetch, and serve them to "
         "later builds from the user cache (through a proxy on this host's loopback).")]
SourcesOpt = Annotated[Optional[Path], typer.Option(
    "--sources", help="Local mirror of the pinned source archives, laid out as "
                      "<group>/<repo>-<commit>.tar.gz (default: $DLBENCH_SOURCES_DIR, else "
                      "downloads from GitHub into the user cache).")]
ResultsOpt = Annotated[Optional[Path], typer.Option(
    "--results", help="Results directory (default: $DLBENCH_RESULTS_DIR or ./dlbench-results).")]
DataOpt = Annotated[Optional[Path], typer.Option(
    "--data-dir", help="Local copy of the data sets in the canonical layout "
                       "(default: $DLBENCH_DATA_DIR, else the user cache, downloading as needed).")]


_details = False        # --verbose: an error's detail follows its line


def _show_details(value: bool) -> bool:
    global _details
    _details = _details or value
    return value


Verbose = Annotated[bool, typer.Option(
    "--verbose", "-v", callback=_show_details,
    help="Show every line of the builds, and an error's details (an URL, the exception).")]


def _print_version(value: bool):
    if value:
        out.print(__version__)
        raise typer.Exit()


@app.callback()
def _main(ctx: typer.Context,
          version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                                help="Print dlbench's version and exit.")] = False):
    _help_without_a_command(ctx)


@datasets_app.callback()
def _help_without_a_command(ctx: typer.Context):
    if ctx.invoked_subcommand is None:
        out.print(ctx.get_help(), markup=False, highlight=False)


@dataclasses.dataclass(frozen=True)
class _Options:
    """Options that several commands take, declared once: (name, annotation, default) each,
    and what ``make`` makes of their values, the one argument a command gets for them."""

    options: tuple[tuple[str, Any, Any], ...]
    make: Callable[..., Any]


def _taking(**groups: _Options):
    """The command takes each group's options where its parameter of the group's name
    stands (which Typer never sees), and that parameter gets what the group makes of them."""
    def decorate(command):
        signature = inspect.signature(command, eval_str=True)
        params = []
        for param in signature.parameters.values():
            params += [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=kind,
                                         default=default) for name, kind, default in groups[param.name].options] \
                if param.name in groups else [param]

        @functools.wraps(command)
        def taking(**given):
            for name, group in groups.items():
                given[name] = group.make(**{option: given.pop(option) for option, _, _ in group.options})
            return command(**given)

        taking.__signature__ = signature.replace(parameters=params)
        taking.__annotations__ = {param.name: param.annotation for param in params}
        return taking
    return decorate


def _build_options(base, mirror, ca_bundle, build_network, sources_dir=None,
                   download_cache=True) -> build.BuildOptions:
    return build.BuildOptions(base_source=base.value, mirror=mirror, ca_bundle=ca_bundle,
                              network=build_network, sources_dir=sources_dir, download_cache=download_cache)


# How the images are built: build-images, and run and tune where an image is missing.
BUILD = _Options((("base", BaseOpt, BaseSource["auto"]), ("mirror", MirrorOpt, build.DEFAULT_MIRROR),
                  ("ca_bundle", CaOpt, None), ("build_network", NetworkOpt, None),
                  ("sources_dir", SourcesOpt, None), ("download_cache", DownloadCacheOpt, True)),
                 _build_options)
# Where --scheduler slurm submits: run's and tune's (partition, account, QOS).
SLURM = _Options((("partition", Annotated[Optional[str], typer.Option(help="Slurm partition.")], None),
                  ("account", Annotated[Optional[str], typer.Option(help="Slurm account.")], None),
                  ("qos", Annotated[Optional[str], typer.Option(help="Slurm QOS.")], None)),
                 lambda **given: tuple(given.values()))
# The compute settings run sweeps, one option each, as axes.AXES declares them: --blas, --onednn.
SETTINGS = _Options(tuple((axis.name, Annotated[Optional[str], typer.Option(axis.option, help=axis.help)], None)
                          for axis in axes.settings()),
                    lambda **given: given)


def _skipped(reason: str) -> None:
    err.print(f"[yellow]skipped:[/yellow] {reason}", highlight=False)


@app.command("build-images")
@_taking(build_options=BUILD)
def build_images(frameworks: Frameworks = None, build_options: build.BuildOptions = None,
                 rebuild: Annotated[bool, typer.Option(help="Build again even if nothing changed.")] = False,
                 variant: Annotated[str, typer.Option(
                     metavar=f"[{_one_of(VARIANTS)}],...",
                     help="cpu, gpu (CUDA builds, where a framework has one) or cpu,gpu.")] = "cpu",
                 jobs: Annotated[int, typer.Option(
                     "--jobs", help="Framework images built at once.")] = build.DEFAULT_JOBS,
                 verbose: Verbose = False):
    """Build the root, base and framework images (no registry needed)."""
    from . import build_progress, cache, options as options_
    from .display import RichDisplay
    from .runtimes.docker import docker_client

    variants = [options_.check_variant(v) for v in _names(variant) or []]
    names = catalog.check_frameworks(_names(frameworks)) if frameworks else catalog.names()
    todo = build.images_to_build(names, variants, named=bool(frameworks))
    display = RichDisplay(err, verbose=verbose)
    builder = build.Builder(docker_client(), build_options,
                            say=display.say, log_dir=cache.folder("build-logs"), on_step=display.build_step,
                            times=build_progress.Times())
    for tag, image in build.build_images(builder, todo, rebuild, skip=_skipped, jobs=jobs):
        out.print(f"{tag}  {image.short_id}  {image.labels.get(build.LABEL + '.framework-version', '')}")


def _slurm_task(plan_file, plan_index, results, verbose):
    from . import store
    from .schedulers import slurm
    from .display import RichDisplay

    if plan_index is None:
        raise UsageError("--plan-file goes with --plan-index")
    records = slurm.run_task(plan_file, plan_index, store.results_dir(results),
                             RichDisplay(err, verbose=verbose))
    if any(r.status != "ok" for r in records):
        raise typer.Exit(3)


def _warn_unstable() -> None:
    """Once, as the jobs start on this host: doctor's warnings on what makes timings unstable."""
    from .doctor import noise_warning

    if (line := noise_warning()) is not None:
        _warn_line(line)


@app.command()
@_taking(settings=SETTINGS, build_options=BUILD, slurm=SLURM)
def run(frameworks: Frameworks = None,
        datasets_: Annotated[Optional[str], typer.Option(
            "--datasets", help=f"Comma-separated: {', '.join(catalog.DATASETS)} (default: all).")] = None,
        campaign: Annotated[Optional[Path], typer.Option(
            help="A campaign file (TOML): the matrix of jobs; options below replace its axes.")] = None,
        name: Annotated[Optional[str], typer.Option(
            help="The campaign's name, stored in every row (default: the campaign file's name).")] = None,
        profile: Annotated[Optional[str], typer.Option(
            metavar=f"[{_one_of(catalog.PROFILES)}],...",
            help=f"Comma-separated, from {', '.join(catalog.PROFILES)} (default: "
                 f"{contract.PAPER_PROFILE}): the published settings; {contract.QUICK_PROFILE} trains "
                 f"the same models briefly, {contract.FAIR_PROFILE} one network "
                 "alike in every framework (docs: A fair comparison).")] = None,
        cpus: Annotated[Optional[int], typer.Option(
            help="Pin each job to this many CPUs and set its thread counts to match.")] = None,
        threads: Annotated[Optional[str], typer.Option(
            help="CPU counts to sweep, e.g. 1,2: each pins its jobs as --cpus does.")] = None,
        gpu: Annotated[Optional[str], typer.Option(
            help="Run on these GPUs (indices, e.g. 0 or 0,1,2,3): every job on each; the GPUs "
                 "side by side, one job on each at a time, each with its own share of the CPUs.")] = None,
        devices: Annotated[Optional[str], typer.Option(
            help="Devices to sweep, e.g. cpu,gpu:0.")] = None,
        variant: Annotated[Optional[str], typer.Option(
            metavar=f"[{_one_of(VARIANTS)}]",
            help="The images the jobs run in (default: the GPU image for GPU jobs, the CPU image "
                 "for CPU jobs); gpu runs CPU jobs in the GPU images too.")] = None,
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
                                    "cross-settings), e.g. caffe; own,caffe for both; caffe/mnist: "
                                    "caffe's MNIST defaults on every data set.")] = None,
        settings: dict = None,
        weights: Annotated[Optional[Path], typer.Option(
            help="With --profile fair: the initial weights (.npz, one data set's network; "
                 "default: drawn from each job's seed).")] = None,
        repeats: Annotated[Optional[int], typer.Option(help="Runs of each job (default 1).")] = None,
        seed: Annotated[Optional[int], typer.Option(help="Seed of the first repeat (default 1).")] = None,
        memory: Annotated[Optional[str], typer.Option(help="Memory limit per job, e.g. 8g.")] = None,
        timeout: Annotated[Optional[float], typer.Option(
            help="Stop a job after this many seconds; it is stored with status timeout.")] = None,
        results: ResultsOpt = None, data_dir: DataOpt = None,
        dry_run: Annotated[bool, typer.Option(help="Print the plan; touch nothing.")] = False,
        plan_format: Annotated[Optional[PlanFormat], typer.Option(
            "--format", help="With --dry-run: table (the default) or json, one job a line.")] = None,
        resume: Annotated[bool, typer.Option(
            help="Skip jobs already stored as ok (same definition, image and data; "
                 "of the same campaign when it has a name).")] = False,
        fail_fast: Annotated[bool, typer.Option(
            help="Stop after the first job that is not ok (its row is stored).")] = False,
        runtime: Annotated[Runtime, typer.Option(
            help="docker (each job in its own container) or native (a process of --python "
                 "on this host, no Docker).")] = Runtime["docker"],
        python: Annotated[Optional[str], typer.Option(
            help="With --runtime native: the Python that has the frameworks "
                 "(default: the one running dlbench).")] = None,
        build_options: build.BuildOptions = None,
        scheduler: Annotated[Optional[Scheduler], typer.Option(
            help="Where and when the jobs run: local (one job after another on this host; the "
                 "default) or slurm (one Slurm job array; the results directory must be shared "
                 "with the nodes).")] = None,
        slurm: tuple = (),
        sbatch_option: Annotated[list[str], typer.Option(
            "--sbatch-option", help="Another sbatch option, e.g. --sbatch-option=--time=30 "
                                    "(repeatable; given last, so it wins).")] = [],
        detach: Annotated[bool, typer.Option(
            help="With --scheduler slurm: submit, print the array id and return.")] = False,
        plan_file: Annotated[Optional[Path], typer.Option(hidden=True)] = None,
        plan_index: Annotated[Optional[int], typer.Option(hidden=True)] = None,
        verbose: Verbose = False):
    """Run the benchmark jobs, building missing images first; rows go to the results directory."""
    from . import execute
    from .display import RichDisplay, line
    from .options import RunOptions

    if plan_file is not None:       # one task of a Slurm array, on its node
        _slurm_task(plan_file, plan_index, results, verbose)
        return
    if python is not None and runtime.value != "native":
        raise UsageError("--python goes with --runtime native")
    request = execute.Request(
        options=RunOptions.from_command_line(
            name=name, frameworks=frameworks, datasets=datasets_, profile=profile, cpus=cpus,
            threads=threads, gpu=gpu, devices=devices, variant=variant, set_=set_, sweep=sweep,
            batch_sizes=batch_sizes, learning_rates=learning_rates, settings_from=settings_from,
            repeats=repeats, seed=seed, memory=memory, timeout=timeout, weights=weights, **settings),
        campaign=campaign, results=results, data_dir=data_dir, build=build_options,
        runtime=runtime.value, python=python, resume=resume, fail_fast=fail_fast,
        scheduler=scheduler.value if scheduler else None,
        slurm=execute.SlurmRequest(*slurm, tuple(sbatch_option), detach))
    planned = execute.plan(request)
    for note in planned.plan.skipped:
        err.print(f"[yellow]skipped:[/yellow] {note}")
    if plan_format is not None and not dry_run:
        raise UsageError("--format goes with --dry-run (the plan's format)")
    if dry_run:
        _dry_run(planned.plan, results, plan_format or PlanFormat.table)
        return
    done = execute.execute(request, RichDisplay(err, verbose=verbose, on_start=_warn_unstable,
                                                estimate=_estimator(planned.plan.jobs, results)),
                           lambda text: line(err, text), planned)
    if done.array_id is not None:
        out.print(done.array_id, highlight=False)
    if done.records is None:        # a detached array, or an array with nothing left to run
        if done.array_id is None:
            err.print("nothing to run: every job is stored as ok", highlight=False)
        return
    line(err, f"{len(done.records) - len(done.not_ok)} ok, {len(done.not_ok)} not ok; "
              f"results in {done.results}")
    _summarise(done, results)
    if done.not_ok:
        raise typer.Exit(3)


@app.command()
@_taking(build_options=BUILD, slurm=SLURM)
def tune(frameworks: Annotated[str, typer.Option(help="The framework to tune (one).")],
         datasets_: Annotated[str, typer.Option("--datasets", help="The data set (one).")],
         profile: Annotated[str, typer.Option(
             help=f"{contract.PAPER_PROFILE} or {contract.QUICK_PROFILE}: the default to start "
                  "from.")] = contract.QUICK_PROFILE,
         trials: Annotated[int, typer.Option(help="Trials in all, the default the first.")] = 12,
         space: Annotated[Optional[str], typer.Option(
             help="What to search, comma-separated: blas, threads, batch_size, learning_rate, "
                  "length, omp_threads (default: all but omp_threads that the framework has).")] = None,
         floor: Annotated[float, typer.Option(
             help="Points of accuracy below the default's that a trial may lose.")] = 0.5,
         min_accuracy: Annotated[Optional[float], typer.Option(
             help="An accuracy (%) every trial must reach, instead of --floor.")] = None,
         study: Annotated[Optional[str], typer.Option(
             help="The study's name (default: FRAMEWORK-DATASET-PROFILE).")] = None,
         storage: Annotated[Optional[str], typer.Option(
             help="An Optuna database URL for a study shared by machines, e.g. "
                  "postgresql://user@host/db (default: a journal file in the results directory).")] = None,
         resume: Annotated[bool, typer.Option(help="Continue the study to --trials.")] = False,
         parallel: Annotated[int, typer.Option(
             help="Trials asked at a time and run as one plan (with --scheduler slurm, one array).")] = 1,
         write: Annotated[Optional[Path], typer.Option(
             help="Write a campaign file that runs the best trial beside the default.")] = None,
         write_repeats: Annotated[int, typer.Option(help="Runs of each in --write's campaign.")] = 3,
         seed: Annotated[int, typer.Option(help="The sampler's seed.")] = 0,
         set_: Annotated[list[str], typer.Option(
             "--set", help="A hyper-parameter every trial keeps, KEY=VALUE (repeatable).")] = [],
         results: ResultsOpt = None, data_dir: DataOpt = None,
         runtime: Annotated[Runtime, typer.Option(help="docker or native, as for run.")] = Runtime["docker"],
         python: Annotated[Optional[str], typer.Option(help="With --runtime native: its Python.")] = None,
         build_options: build.BuildOptions = None,
         scheduler: Annotated[Optional[Scheduler], typer.Option(
             help="local (the default) or slurm: each round of --parallel trials one job array.")] = None,
         slurm: tuple = (),
         verbose: Verbose = False):
    """Search a framework's configuration for the fastest training that keeps its accuracy."""
    from . import execute, options as options_, store, tune as tune_
    from .display import RichDisplay

    framework, dataset = _names(frameworks) or [], _names(datasets_) or []
    if len(framework) != 1 or len(dataset) != 1:
        raise UsageError("dlbench tune searches one framework on one data set: give one of each "
                         "(--frameworks caffe --datasets mnist)")
    options_.check_profile(profile)
    request = tune_.TuneRequest(
        framework=framework[0], dataset=dataset[0], profile=profile, trials=trials,
        space=tuple(_names(space)) if space is not None else None, floor_points=floor,
        min_accuracy=min_accuracy, study=study, storage=storage, resume=resume, parallel=parallel,
        seed=seed, fixed=options_.parse_overrides(set_), run=execute.Request(
            results=results, data_dir=data_dir, runtime=runtime.value, python=python,
            build=build_options, scheduler=scheduler.value if scheduler else None,
            slurm=execute.SlurmRequest(*slurm)))
    if write is not None and write_repeats < 1:
        raise UsageError(f"--write-repeats {write_repeats}: at least 1")
    found = tune_.tune(request, RichDisplay(err, verbose=verbose, on_start=_warn_unstable),
                       lambda line: err.print(line, markup=False, highlight=False))
    for line in tune_.summary(found):
        out.print(line, markup=False, highlight=False)
    if write is not None:
        text = tune_.best_campaign(request, found, write_repeats)
        try:
            write.write_text(text)
        except OSError as exc:
            raise DlbenchError(f"--write {write}: {exc.strerror}") from None
        out.print(f"wrote {write}: dlbench run --campaign {write} --results "
                  f"{store.results_dir(results)} runs the best trial beside the default",
                  markup=False, highlight=False)


def _dry_run(plan, results: Path | None, fmt: PlanFormat) -> None:
    """--dry-run: the plan as a table (or one JSON job a line) on stdout; on stderr how many
    jobs, and last the plan's time on this machine (report/estimate.py)."""
    from . import store
    from .display import line
    from .report import estimate
    from .report.text import plan_text

    try:
        known, problem = estimate.machine_speeds(store.results_dir(results)), None
    except DlbenchError as exc:
        known, problem = {}, exc
    if fmt is PlanFormat.json:
        for job in plan.jobs:
            sys.stdout.write(job.model_dump_json() + "\n")
    else:
        _write(plan_text(plan.jobs, lambda job: estimate.of_job(job, known), _screen(),
                         out.color_system))
    line(err, f"{len(plan.jobs)} job(s)" + (f" in campaign {plan.campaign}" if plan.campaign else ""))
    line(err, f"estimated time: none ({problem})" if problem else estimate.of_jobs(
        [job for job in plan.jobs if job.unsupported is None], known).line("estimated time"))


def _summarise(done, results: Path | None) -> None:
    """The lines a run ends with (report/summary.py); the rows are stored whatever they say."""
    from .display import command, line
    from .report import summary

    try:
        lines = summary.run_summary(done.results, [r.run_id for r in done.records],
                                    command_results=results)
    except DlbenchError as exc:
        _warn_line(f"no summary of the run: {exc}")
        return
    for text in lines:
        (command if isinstance(text, summary.Command) else line)(err, text)


def _estimator(jobs, results: Path | None):
    """What the run's display estimates the time left with: the plan's jobs and each one's
    seconds at this machine's speeds (report/estimate.py); None where they cannot be read."""
    from . import store
    from .report import estimate

    try:
        known = estimate.machine_speeds(store.results_dir(results))
    except DlbenchError:
        return None
    return jobs, lambda job: estimate.of_job(job, known)


WhereOpt = Annotated[list[str], typer.Option(
    "--where", help="Only rows where COLUMN OP VALUE holds (OP = != < <= > >=; = and != take "
                    "a comma list), a stored column, e.g. framework_version=2.20.0 (repeatable).")]
FrameworkFilter = Annotated[Optional[str], typer.Option(
    "--framework", help="Only these frameworks' rows (comma-separated).")]
DatasetFilter = Annotated[Optional[str], typer.Option(
    "--dataset", help="Only these data sets' rows (comma-separated).")]
ColumnsOpt = Annotated[Optional[str], typer.Option(
    "--columns", help="The columns to show, comma-separated (docs: Reports).")]
WideOpt = Annotated[bool, typer.Option(
    "--wide", help="Every column, however wide the terminal.")]
DisturbedOpt = Annotated[bool, typer.Option(
    "--exclude-disturbed", help="Leave out the runs the noise rule marks as disturbed.")]


def _screen() -> int | None:
    """The terminal's width; None for a file or a pipe (tables whole, nothing wrapped)."""
    return out.width if out.is_terminal else None


@app.command()
def results(results: ResultsOpt = None,
            format: Annotated[Format, typer.Option("--format", help="table, csv or json.")] = Format.table,
            where: WhereOpt = [], framework: FrameworkFilter = None, dataset: DatasetFilter = None,
            columns: ColumnsOpt = None, wide: WideOpt = False):
    """Show the stored runs."""
    from . import store
    from .report import load, select      # pandas: loaded by the commands that show rows only
    from .report.text import results_text

    frame = load(store.results_dir(results), select.conditions(where, framework, dataset))
    _write(results_text(frame, format.value, _screen(), out.color_system, _names(columns), wide))


def _write(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


@app.command()
def status(results: ResultsOpt = None):
    """A Slurm campaign's jobs by state: queued, running, stored ok, failed..."""
    from . import store
    from .schedulers import slurm

    target = store.results_dir(results)
    found = slurm.status(target)
    if not found:
        out.print(f"{target}: no Slurm arrays submitted", highlight=False)
    for array in found:
        states = ", ".join(f"{n} {s}" for s, n in sorted(array["states"].items()))
        out.print(f"array {array['array']}" + (f" ({array['campaign']})" if array["campaign"] else "")
                  + f": {array['jobs']} job(s): {states}", highlight=False)


@app.command()
def compact(results: ResultsOpt = None):
    """Merge a results directory's many small files (one a job) into one for rows, one for
    traces and one for robustness: reading and reporting become fast; nothing is lost."""
    from . import store

    target = store.results_dir(results)
    out.print(f"{target}: merged {store.counted(store.compact(target))}", highlight=False)


@app.command()
def recover(results: ResultsOpt = None):
    """Store the rows a run could not write (a full or read-only disk) and kept aside
    in RESULTS/_rescued/."""
    from . import store

    target = store.results_dir(results)
    count, problems = store.recover(target)
    for line in problems:
        _warn_line(line)
    out.print(f"{target}: recovered {count} row(s)", highlight=False)
    if problems:
        raise typer.Exit(1)


@app.command()
def upgrade(results: ResultsOpt = None):
    """Rewrite a results directory's older files in the current layout and schema, so that
    any Parquet reader reads RESULTS/runs whole; nothing is lost."""
    from . import store

    target = store.results_dir(results)
    out.print(f"{target}: upgraded {store.counted(store.rewrite(target))} to schema version "
              f"{store.SCHEMA_VERSION}", highlight=False)


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
            tolerance: Annotated[Optional[float], typer.Option(
                help="Accuracy within this many percentage points of the paper counts as "
                     "reproduced (default: the report's, 1 point).")] = None,
            where: WhereOpt = [], framework: FrameworkFilter = None, dataset: DatasetFilter = None,
            columns: ColumnsOpt = None, wide: WideOpt = False, exclude_disturbed: DisturbedOpt = False,
            data_dir: Annotated[Optional[Path], typer.Option(
                "--data-dir", help="Local copy of the data sets, for the fair runs' reference "
                                   "training (default: $DLBENCH_DATA_DIR, else the user cache; "
                                   "never downloaded).")] = None,
            target: Annotated[Optional[str], typer.Option(
                "--target", metavar="T", help="Time to accuracy: the training accuracy to reach, a "
                "fraction (0.99) or a percent (99%) (default: each model's, docs/reports.md).")] = None,
            explain: Annotated[bool, typer.Option(
                "--explain", help="Print the rules behind the verdicts, spans, statistics and "
                                  "disturbed runs after the tables.")] = False):
    """Compare the stored runs with the published GTDLBench numbers: statistics, verdicts, plots."""
    from . import report, store

    goal = report.tta.parse_target(target)
    text, page = report.make_report(
        store.results_dir(results), format and format.value, html, tolerance, _screen(),
        out.color_system, report.select.conditions(where, framework, dataset), _names(columns),
        wide, exclude_disturbed, data_dir=data_dir, target=goal, explain=explain)
    if text is not None:
        _write(text)
    if page is not None:
        err.print(f"report written to {page}", highlight=False, soft_wrap=True)


@app.command()
def site(dirs: Annotated[list[Path], typer.Argument(
             help="Results folders; a folder holding results folders stands for each of them.",
             metavar="DIR", show_default=False)],
         out: Annotated[Path, typer.Option(
             "-o", "--out", help="The site's folder (made if missing; its pages replaced).",
             metavar="OUT")],
         data_dir: Annotated[Optional[Path], typer.Option(
             "--data-dir", help="Local copy of the data sets, for the fair runs' reference "
                                "training (as report's; never downloaded).")] = None):
    """One static site over many results folders: an index by date, machine and profile, each
    folder's report page, and a history chart per framework, data set and profile."""
    from .report import site as site_

    index = site_.build(dirs, out, data_dir)
    err.print(f"site written to {index}", highlight=False, soft_wrap=True)


class Metric(str, enum.Enum):
    train_time_s = "train_time_s"
    test_time_s = "test_time_s"
    accuracy = "accuracy"


@app.command("compare")
def compare_(a: Annotated[str, typer.Argument(
                 help="A: a results directory, a condition on the rows of --results "
                      "(framework_version=1.9.1), with --by a value of that setting, or a "
                      "campaign's name there.")],
             b: Annotated[str, typer.Argument(help="B, the same way.")],
             results: ResultsOpt = None,
             metric: Annotated[Metric, typer.Option(help="What to compare.")] = Metric.train_time_s,
             fail_on_slowdown: Annotated[Optional[str], typer.Option(
                 help="Exit with status 4 where a group of B is significantly slower than A's and "
                      "the interval's lower end is above this, e.g. 5%; else with status 5 where a "
                      "group cannot be judged (too few runs, one side only).")] = None,
             allow_inconclusive: Annotated[bool, typer.Option(
                 "--allow-inconclusive", help="With --fail-on-slowdown, let the groups that "
                                              "cannot be judged pass.")] = False,
             by: Annotated[Optional[str], typer.Option(
                 "--by", metavar="KEY", help="Compare across this setting (blas, onednn or a "
                 "hyper-parameter): A and B may be its values, e.g. --by blas blis openblas.")] = None,
             ignore: Annotated[list[str], typer.Option(
                 "--ignore", metavar="KEY", help="Pair groups that differ in this setting "
                                                 "(repeatable).")] = [],
             format: Annotated[Optional[ReportFormat], typer.Option(
                 "--format", help="table (default), md, csv or json.")] = None,
             where: WhereOpt = [], framework: FrameworkFilter = None, dataset: DatasetFilter = None,
             columns: ColumnsOpt = None, wide: WideOpt = False, exclude_disturbed: DisturbedOpt = False):
    """Compare two sets of runs group by group: medians, B ÷ A with its confidence interval,
    a significance test and a verdict."""
    from . import store
    from .report import compare, select, text

    chosen, slowdown = select.conditions(where, framework, dataset), compare.threshold(fail_on_slowdown)
    first, second, across = compare.sides(a, b, store.results_dir(results), chosen, by, ignore)
    cmp = compare.build(first, second, metric.value, exclude_disturbed, slowdown, across,
                        allow_inconclusive)
    _write(text.render_comparison(cmp, format.value if format else "table", _screen(),
                                  out.color_system, _names(columns), wide))
    if cmp.exit_status:
        raise typer.Exit(cmp.exit_status)


@datasets_app.command("verify")
def datasets_verify(data_dir: DataOpt = None):
    """Verify the data sets (local copy, or the cache) and print their checksums."""
    from . import datasets

    root, _ = datasets.default_root(data_dir)
    for name in catalog.DATASETS:
        info = datasets.verify(name, root)
        out.print(f"{name}: ok  {info.samples['train']} train / {info.samples['test']} test  "
                  f"sha256 {info.sha256}" + ("  (byte-identical to the official files)" if info.official else ""))


@datasets_app.command("download")
def datasets_download(names: Annotated[Optional[str], typer.Argument(
        help=f"{', '.join(catalog.DATASETS)} (default: all)")] = None):
    """Download the official archives into the user cache and verify them."""
    from . import datasets
    from .display import RichDisplay

    for name in catalog.check_datasets(_names(names) or list(catalog.DATASETS)):
        info = datasets.download(name, progress=RichDisplay(err).download_progress())
        out.print(f"{name}: ok  {info.path}  sha256 {info.sha256}")


@datasets_app.command("import")
def datasets_import(source: Annotated[Path, typer.Argument(help="A data root in the canonical layout.")]):
    """Verify a local copy and copy it into the user cache."""
    from . import datasets

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
    from . import store
    from .display import marked
    from .doctor import FAIL, checks, concise

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


def main():
    """The command line, once ``entry.main`` has taken over the stop signals."""
    warnings.showwarning = _warning
    code = 0
    try:
        with docker_errors("talking to Docker"):
            code = app(standalone_mode=False) or 0
    except typer.Exit as exc:
        code = exc.exit_code
    except TyperException as exc:   # option parsing: typer's usage errors
        _fail(usage_message(exc.format_message()), exc.exit_code)
    except DlbenchError as exc:
        _fail(str(exc), exc.exit_code, exc.detail, exc)
    except (KeyboardInterrupt, typer.Abort):
        code = 130
    if code == 130 or received:         # typer returns 130 for a KeyboardInterrupt
        code = interrupted()
    sys.exit(code)


_warned: set[str] = set()


def _warning(message, category, filename, lineno, file=None, line=None, _shown=warnings.showwarning):
    """A file the store left out, or a deprecated name, on one line, once (compaction meets
    a file at each of its steps); other warnings as Python shows them."""
    if not issubclass(category, (StoreWarning, DeprecatedName)):
        return _shown(message, category, filename, lineno, file, line)
    text = " ".join(str(message).split())
    if text not in _warned:
        _warned.add(text)
        _warn_line(text)


def _warn_line(text: str) -> None:
    """One line in a log; in a terminal, wrapped between words."""
    err.print(f"dlbench: warning: {' '.join(text.split())}", markup=False, highlight=False,
              soft_wrap=not err.is_terminal)


def _fail(message: str, code: int, detail: str | None = None, exc: DlbenchError | None = None):
    """Every error the user can act on ends here: one line (with --verbose, its detail
    after it), non-zero exit; an error of several problems (a campaign file's), one line
    each."""
    for line in getattr(exc, "lines", None) or [message]:
        err.print(f"dlbench: error: {' '.join(line.split())}", markup=False, highlight=False,
                  soft_wrap=not err.is_terminal)      # in a terminal, wrapped between words
    if detail and _details:
        err.print(f"dlbench: detail: {detail}", markup=False, highlight=False, soft_wrap=not err.is_terminal)
    sys.exit(code)


__all__ = ["app", "main", "UsageError"]
