"""The commands that build and run: ``build-images``, ``run``, ``tune``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from dlbench_runner import contract

from .. import axes, build, catalog
from ..errors import DlbenchError, UsageError
from .common import (BUILD, DataOpt, Frameworks, PlanFormat, ResultsOpt, Runtime, SETTINGS, SLURM,
                     Scheduler, Verbose, _names, _one_of, _screen, _skipped, _taking, _warn_line,
                     _write, app, err, out)


@app.command("build-images")
@_taking(build_options=BUILD)
def build_images(frameworks: Frameworks = None, build_options: build.BuildOptions = None,
                 rebuild: Annotated[bool, typer.Option(help="Build again even if nothing changed.")] = False,
                 variant: Annotated[str, typer.Option(
                     metavar=f"[{_one_of(catalog.VARIANTS)}],...",
                     help="cpu, gpu (CUDA builds, where a framework has one) or cpu,gpu.")] = "cpu",
                 jobs: Annotated[int, typer.Option(
                     "--jobs", help="Framework images built at once.")] = build.DEFAULT_JOBS,
                 verbose: Verbose = False):
    """Build the root, base, framework and tool images (no registry needed)."""
    from .. import cache, options as options_
    from ..build import progress as build_progress
    from ..display import RichDisplay
    from ..runtimes.docker import docker_client

    variants = [options_.check_variant(v) for v in _names(variant) or []]
    # the frameworks', and the tool images (catalog.TOOLS), which --frameworks may name too
    given = _names(frameworks) or []
    tools = [name for name in given if name in catalog.TOOLS] if frameworks else list(catalog.TOOLS)
    rest = [name for name in given if name not in catalog.TOOLS]
    names = (catalog.check_frameworks(rest) if rest else []) if frameworks else catalog.names()
    todo = build.images_to_build(names + tools, variants, named=bool(frameworks))
    display = RichDisplay(err, verbose=verbose)
    builder = build.Builder(docker_client(), build_options,
                            say=display.say, log_dir=cache.folder("build-logs"), on_step=display.build_step,
                            times=build_progress.Times())
    for tag, image in build.build_images(builder, todo, rebuild, skip=_skipped, jobs=jobs):
        out.print(f"{tag}  {image.short_id}  {image.labels.get(build.LABEL + '.framework-version', '')}")


def _slurm_task(plan_file, plan_index, results, verbose):
    from .. import store
    from ..schedulers import slurm
    from ..display import RichDisplay

    if plan_index is None:
        raise UsageError("--plan-file goes with --plan-index")
    records = slurm.run_task(plan_file, plan_index, store.results_dir(results),
                             RichDisplay(err, verbose=verbose))
    if any(r.status != "ok" for r in records):
        raise typer.Exit(3)


def _warn_unstable() -> None:
    """Once, as the jobs start on this host: doctor's warnings on what makes timings unstable."""
    from ..doctor import noise_warning

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
            metavar=f"[{_one_of(catalog.VARIANTS)}]",
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
        platforms: Annotated[Optional[str], typer.Option(
            metavar="[all|none|PLATFORM,...]", help=axes.named("platforms").help)] = None,
        versions: Annotated[list[str], typer.Option(
            metavar="FRAMEWORK=RELEASE,...", help=axes.named("versions").help)] = [],
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
    from .. import execute
    from ..display import RichDisplay, line
    from ..options import RunOptions

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
            repeats=repeats, seed=seed, memory=memory, timeout=timeout, weights=weights,
            platforms=platforms, versions=versions, **settings),
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
    from .. import execute, options as options_, store, tune as tune_
    from ..display import RichDisplay

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
    from .. import store
    from ..display import line
    from ..report import estimate
    from ..report.text import plan_text

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
    from ..display import command, line
    from ..report import summary

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
    from .. import store
    from ..report import estimate

    try:
        known = estimate.machine_speeds(store.results_dir(results))
    except DlbenchError:
        return None
    return jobs, lambda job: estimate.of_job(job, known)
