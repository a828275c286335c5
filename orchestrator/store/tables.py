"""The side tables: a job's many rows beside its row (its resource trace, its accuracy under
attack, a fair job's step losses and layer times, its model on each platform), one file per job in a folder of their
own, each with its schema, its version and its rules (``rowcheck``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, NamedTuple

import pyarrow as pa

from .. import rowcheck
from ..schema import (OPS_SCHEMA, PLATFORMS_SCHEMA, ROBUSTNESS_SCHEMA, STEPS_SCHEMA, TRACE_SCHEMA,
                      upgrade_robustness)
from .layout import OLD_TRACES, _openable


class SideTable(NamedTuple):
    """A table of many rows per job beside the rows: one file per job, in ``folder``."""
    kind: str                   # in messages: "trace file"
    folder: str
    schema: pa.Schema
    version_key: bytes          # the schema metadata that holds its version
    old_folder: str | None = None   # where an older layout kept its files
    order: tuple = ("run_id",)  # how ``load_side`` sorts its rows
    integers: bool = False      # whether pandas gets its integer columns as nullable Int64
    upgrade: Callable[[pa.Table, int], pa.Table] | None = None  # older versions' rows to this one
    rules: dict[str, str] | None = None     # what its values may be (``rowcheck``)

    @property
    def version(self) -> int:
        return int(self.schema.metadata[self.version_key])


TRACE = SideTable("trace", "traces", TRACE_SCHEMA, b"dlbench.trace_schema_version",
                  old_folder=OLD_TRACES, order=("run_id", "t_s"), rules=rowcheck.TRACE)
ROBUSTNESS = SideTable("robustness", "robustness", ROBUSTNESS_SCHEMA,
                       b"dlbench.robustness_schema_version", integers=True,
                       upgrade=upgrade_robustness, rules=rowcheck.ROBUSTNESS)
STEPS = SideTable("step loss", "steps", STEPS_SCHEMA, b"dlbench.steps_schema_version",
                  order=("run_id", "step"), integers=True, rules=rowcheck.STEPS)
OPS = SideTable("op time", "ops", OPS_SCHEMA, b"dlbench.ops_schema_version", integers=True,
                rules=rowcheck.OPS)
PLATFORMS = SideTable("platform", "platforms", PLATFORMS_SCHEMA, b"dlbench.platforms_schema_version",
                      order=("run_id", "platform"), integers=True, rules=rowcheck.PLATFORMS)
SIDE_TABLES = (TRACE, ROBUSTNESS, STEPS, OPS, PLATFORMS)
# The side tables a job's collected result may hold rows of (the trace is sampled apart).
RESULT_TABLES = (ROBUSTNESS, STEPS, OPS, PLATFORMS)
TRACES = TRACE.folder


def side_files(results: Path, side: SideTable) -> list[Path]:
    """A side table's files a reader may open: an old layout's first, then its folder's."""
    old = sorted((results / side.old_folder).glob("*.parquet")) if side.old_folder else []
    return _openable(results, old + sorted((results / side.folder).glob("*.parquet")))


def trace_files(results: Path) -> list[Path]:
    return side_files(results, TRACE)


def side_path(results: Path, side: SideTable, run_id: str) -> Path:
    return results / side.folder / f"{run_id}.parquet"


def trace_path(results: Path, run_id: str) -> Path:
    return side_path(results, TRACE, run_id)
