"""What the commands share: the Typer application and its plumbing, the consoles, the
options several commands take (declared once), and their small helpers."""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import json
import re
import sys
from pathlib import Path
from typing import Annotated, Any, Callable, Optional, get_args

import typer
from rich.console import Console

from .. import __version__, axes, build, catalog
from ..runtimes import RUNTIMES


EXIT_CODES = ("Exit status: 0 ok; 1 an error (one line on stderr); 2 a usage error; 3 some jobs "
              "not ok (their rows are stored); 4 dlbench compare --fail-on-slowdown: a group "
              "slower past it; 5 dlbench compare --fail-on-slowdown: a group it could not judge "
              "(too few runs, one side only); 128 + the signal's number when stopped by one: 130 "
              "Ctrl-C (SIGINT), 143 SIGTERM, 129 SIGHUP (the rows stored so far are kept).")


class _Readable:
    """A command whose options show their values by a word (TEXT, INTEGER, PATH,
    table|csv|json), and whose arguments their names alone, not the Python type that Typer
    0.2x shows (<str>, <list[str]>); their values taken plainly where they can be
    (``_Plain``)."""

    def get_params(self, ctx):
        params = super().get_params(ctx)
        for param in params:
            found = getattr(param, "type_descriptor", None)      # Typer 0.2x's own parser
            if param.metavar is None and found is not None and param.param_type_name == "option":
                param.metavar = _metavar(param, found)
            elif found is not None and param.param_type_name == "argument":
                param.display_type_rich = _no_type       # its name says what it takes, and its help
            if found is not None and getattr(param, "_runtime_param", False) is None and _plain(found):
                param._runtime_param = _Plain(found.parameter_info, found.annotation, found)
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


# Typer 0.2x takes every value through a pydantic TypeAdapter, and so imports pydantic (a
# tenth of a second) in every command.  A value that is plainly of its option's type (a word,
# digits, a choice or a path as typer itself takes them) needs none; any other value goes to
# typer's own coercion, which says what is wrong with it as it always does.
try:
    from typer._coercion import RuntimeParam, build_runtime_param
    from typer._param_types import coerce_cli_choice, coerce_cli_path
except ImportError:         # another Typer: its own coercion for every value
    RuntimeParam = None

_INTEGER = re.compile(r"-?[0-9]+")
_DECIMAL = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")


class _NotPlain(Exception):
    pass


def _plain(found) -> bool:
    """Whether ``_Plain`` takes this parameter's values: a bool, word, number, path or
    choice, or a list of them, with no parser, file or range of its own."""
    info = found.parameter_info
    kind = (get_args(found.annotation) or [None])[0] if found.is_list else found.annotation
    return (RuntimeParam is not None and found.file_annotation is None and info.parser is None
            and info.min is None and info.max is None and not found.is_tuple
            and isinstance(kind, type) and (kind in (bool, str, int, float) or issubclass(kind, (Path, enum.Enum)))
            and (issubclass(kind, enum.Enum) or not found.is_choice))


if RuntimeParam is not None:
    @dataclasses.dataclass(frozen=True)
    class _Plain(RuntimeParam):
        """A parameter's values as typer takes them, pydantic left to the values that are
        not plain."""

        descriptor: Any

        def _coerce_value(self, value, param, ctx):
            try:
                if not self.descriptor.is_list:
                    return self._one(self.annotation, value, param, ctx)
                if not isinstance(value, (list, tuple)):
                    raise _NotPlain
                kind = get_args(self.annotation)[0]
                return [self._one(kind, item, param, ctx) for item in value]
            except _NotPlain:
                return build_runtime_param(self.descriptor)._coerce_value(value, param=param, ctx=ctx)

        def _one(self, kind, value, param, ctx):
            info = self.parameter_info
            if isinstance(value, bool) and kind is bool:
                return value
            if issubclass(kind, enum.Enum):
                try:
                    return coerce_cli_choice(value, choices=tuple(kind), case_sensitive=info.case_sensitive, ctx=ctx)
                except ValueError:
                    raise _NotPlain from None
            if isinstance(value, (int, float)) and not isinstance(value, bool) and kind is float:
                return float(value)         # a default
            if isinstance(value, int) and not isinstance(value, bool) and kind is int:
                return value
            if not isinstance(value, str):
                raise _NotPlain
            if kind is str:
                return value
            if kind is int and _INTEGER.fullmatch(value):
                return int(value)
            if kind is float and _DECIMAL.fullmatch(value):
                return float(value)
            if issubclass(kind, Path) and info.path_type is None:
                return coerce_cli_path(kind(value), info, path_type=kind, param=param, ctx=ctx)
            raise _NotPlain


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
Scheduler = enum.Enum("Scheduler", {s: s for s in catalog.SCHEDULERS}, type=str)


def _one_of(choices) -> str:
    return "|".join(choices)


def _names(text: str | None) -> list[str] | None:
    return axes.names(text)


Frameworks = Annotated[Optional[str], typer.Option(
    help=f"Comma-separated, from {', '.join(catalog.BUILT_IN)} and any added on "
         f"${catalog.PATH_VARIABLE} or by an installed package (default: all; a run leaves "
         f"out {', '.join(catalog.TODAY_ORDER)} unless named).")]
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


def _write(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def _warn_line(text: str) -> None:
    """One line in a log; in a terminal, wrapped between words."""
    err.print(f"dlbench: warning: {' '.join(text.split())}", markup=False, highlight=False,
              soft_wrap=not err.is_terminal)
