"""What one after-training check is to the job loop: the protocol every check implements.

A check takes part in a job's life at three points, each optional (``Check``'s own
methods do nothing):

    stage(job) -> {name: bytes}       before the job runs: the files it finds beside its
                                      spec (a fair job's initial weights), made once per job
    take(after, stop, before)         once the job has ended, before its out/ is read: what
        -> taken                      the host does with the files the job left (run the
                                      exported model in a child process that ``stop`` ends);
                                      any value, handed to ``found``; ``before``: what the
                                      checks before it in ``CHECKS`` took, by name (the
                                      platforms deploy the model the migration check ran)
    found(after, result, taken)       for an ok row only: its share of the row, a ``Found``
        -> Found                      (the row's columns, rows of side tables, files stored
                                      beside the row)

and declares the row's columns it fills (``row_fields``: name -> (type, default), as
pydantic's ``create_model`` takes them; the stored row's schema is built from them,
``schema.COLUMNS``).  ``After`` is what a check is handed of the job once it has ended.
A check never fails a job: what it cannot do is a reason in the row.
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any


@dataclasses.dataclass(frozen=True)
class After:
    """A job that has ended, as its checks see it."""

    job: Any                        # the plan's Job
    run_id: str
    job_dir: Path
    data_root: Path | None          # where the data sets are (the test images)
    staged: dict[str, bytes]        # the files the checks staged for it, by name
    tools: dict = dataclasses.field(default_factory=dict)   # tool image -> its Target (``Job.images``)


@dataclasses.dataclass
class Found:
    """A check's share of an ok row."""

    fields: dict[str, Any] = dataclasses.field(default_factory=dict)      # the row's columns
    sides: dict[str, list[dict]] = dataclasses.field(default_factory=dict)   # side table folder -> rows
    files: dict[str, bytes] = dataclasses.field(default_factory=dict)     # stored beside the row, by kind


class Check:
    """A check that does nothing: subclasses override what they take part in."""

    name = "check"
    row_fields: dict[str, tuple] = {}

    def stage(self, job) -> dict[str, bytes]:
        return {}

    def take(self, after: After, stop: threading.Event | None, before: dict[str, Any]) -> Any:
        return None

    def found(self, after: After, result, taken: Any) -> Found:
        return Found()
