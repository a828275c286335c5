"""The few lines ``dlbench run`` ends with: its quick jobs judged against the reference rows,
what was not judged and why, this machine's speed beside the reference machine's, and the
command that gives a verdict against the paper with its estimated time here."""
from __future__ import annotations

import textwrap
from pathlib import Path

from dlbench_runner import contract

from .. import catalog, store
from . import estimate, paper, reference_rows

WIDTH = 80


class Command(str):
    """A line that is a command to copy and paste: printed on a line of its own, never
    wrapped."""


def run_summary(results: Path, run_ids, reference: Path | None = None,
                command_results: Path | None = None) -> list[str]:
    """The summary of the runs ``run_ids`` stored in ``results``, at most ``WIDTH`` columns a
    line; ``command_results`` is the ``--results`` the paper command repeats (None: none)."""
    frame = store.load(results)
    frame = frame[frame["run_id"].isin(set(run_ids))]
    if not len(frame):
        return []
    rep = paper.build(frame)
    judgement = reference_rows.judge(rep, reference)
    lines = _verdicts(rep, judgement) + _speed(frame, rep, judgement)
    lines += _paper_command(rep, command_results)
    return lines


def _verdicts(rep: paper.Report, judgement: reference_rows.Judgement) -> list[str]:
    judged, not_judged = judgement.judged, judgement.not_judged
    others = rep.groups[rep.groups["profile"] != contract.QUICK_PROFILE]
    if not len(judgement.groups):
        counts = others["profile"].value_counts(sort=False)
        return _wrap("Not judged here: " + "; ".join(
            f"{n} {_jobs(n)} of the {profile} profile, {_where_judged(profile)}"
            for profile, n in counts.items()) + ".")
    where = judgement.machine or "none ship with this dlbench"
    lines = [f"Against dlbench's reference rows ({where}):"]
    if len(judged):
        missed = judged[judged["verdict"] == reference_rows.NOT_AS_EXPECTED]
        text = (f"{len(judged)} quick {_jobs(len(judged))} judged: "
                f"{len(judged) - len(missed)} trained as expected")
        if len(missed):
            text += "; not: " + ", ".join(f"{g.framework} {g.dataset} ({g.diff_points:+.2f} "
                                          f"points)" for g in missed.itertuples())
        lines += _wrap(text + f" (tolerance {reference_rows.TOLERANCE_POINTS:g} points or more)",
                       "  ")
    reasons = [(f"{g.framework} {g.dataset}", g.verdict.removeprefix(
        f"{reference_rows.NOT_COMPARABLE}: ")) for g in not_judged.itertuples()]
    reasons += [(f"{g.framework} {g.dataset}", f"{g.profile} profile, {_where_judged(g.profile)}")
                for g in others.itertuples()]
    if reasons:
        lines += _wrap(f"{len(reasons)} not judged: " + "; ".join(
            _grouped(reasons)), "  ")
    return lines


def _where_judged(profile: str) -> str:
    """What `dlbench report` does with the groups of a profile that is not judged here."""
    if profile == contract.FAIR_PROFILE:
        return "verified and compared by `dlbench report`"
    return "held against the paper by `dlbench report`"


def _speed(frame, rep: paper.Report, judgement: reference_rows.Judgement) -> list[str]:
    """This machine's speed beside the reference machine's, from the quick runs that no
    other work disturbed (``noise.RULE``: image builds beside them, load, CPU use, spread)
    where there are any; from disturbed ones only when there are no others, and then said."""
    quick = rep.rows[(rep.rows["status"] == "ok") & (rep.rows["profile"] == contract.QUICK_PROFILE)]
    disturbed = quick["disturbed"] != ""
    note = ""
    if disturbed.any() and not disturbed.all():
        judgement = reference_rows.judge(paper.build(frame, exclude_disturbed=True),
                                         against=judgement)
        note = f"; {int(disturbed.sum())} disturbed {_runs(int(disturbed.sum()))} left out"
    elif disturbed.any():
        note = ("; every run disturbed (image builds or other work beside it, `dlbench report` "
                "says which), so not a fair figure")
    ratio = judgement.speed_ratio()
    if ratio is None:
        return []
    timed = [r for r in judgement.judged["speed_ratio"] if paper.present(r) and r > 0]
    return _wrap(f"speed: training here takes {ratio:.2f}x the reference machine's time "
                 f"(geometric mean over {len(timed)} {_jobs(len(timed))}{note})", "  ")


def _runs(n: int) -> str:
    return "run" if n == 1 else "runs"


def _grouped(reasons: list[tuple[str, str]]) -> list[str]:
    """``job: reason`` items, the jobs that share a reason named together."""
    by_reason: dict[str, list[str]] = {}
    for job, reason in reasons:
        by_reason.setdefault(reason, []).append(job)
    return [f"{', '.join(jobs)}: {reason}" for reason, jobs in by_reason.items()]


def _paper_command(rep: paper.Report, command_results: Path | None) -> list[str]:
    """The command of a paper verdict for the run's quick models of the frameworks the paper
    can judge (not MXNet, the PyTorch port or an added framework: it has no numbers of
    theirs), and its time here from their measured speed."""
    quick = rep.groups[(rep.groups["profile"] == contract.QUICK_PROFILE) & (rep.groups["ok"] > 0)
                       & rep.groups["framework"].map(rep.reference.judges)]
    if not len(quick):          # no such quick job trained: no paper run to suggest
        return []
    models = list(dict.fromkeys(zip(quick["framework"], quick["dataset"], quick["model"],
                                    quick["device"])))
    rows = rep.rows[rep.rows["group"].isin(quick["group"])]
    known = estimate.speeds(rows, estimate.THIS_MACHINE)
    found = estimate.of_jobs(estimate.paper_jobs(models), known)
    command = paper_command(quick, rows, command_results)
    head = "For a verdict against the paper (full-length runs)"
    if found.jobs:
        head += f", about {estimate.duration(found.seconds)} on this machine"
    if found.missing:
        head += f" (not counted: {', '.join(found.missing)})"
    return _wrap(head + ":") + [Command(f"  {command}")]


def paper_command(groups, rows, results: Path | None = None) -> str:
    """``dlbench run`` for the frameworks, data sets and GPUs of ``groups`` and their
    ``rows``, paper profile."""
    frameworks = list(dict.fromkeys(groups["framework"]))
    datasets = list(dict.fromkeys(groups["dataset"]))
    words = ["dlbench run"]
    known = catalog.names()
    if frameworks and sorted(frameworks) != sorted(known):
        words.append("--frameworks " + ",".join(sorted(frameworks, key=lambda f: (
            known.index(f) if f in known else len(known), f))))
    if datasets and sorted(datasets) != sorted(catalog.DATASETS):
        words.append("--datasets " + ",".join(d for d in catalog.DATASETS if d in datasets))
    if gpus := sorted({str(g) for g in rows["gpu"] if paper.present(g)}):
        words.append("--gpu " + ",".join(gpus))
    if results is not None:
        words.insert(1, f"--results {results}")
    return " ".join(words)


def _jobs(n: int) -> str:
    return "job" if n == 1 else "jobs"


def _wrap(text: str, indent: str = "") -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_on_hyphens=False, break_long_words=False)
