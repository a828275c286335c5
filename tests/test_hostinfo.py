"""Host facts that make timings unstable: read from /sys as the kernel lays it out, stored in
every row, and turned into doctor's warnings."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from orchestrator import doctor, hostinfo
from orchestrator.schema import ADDED_IN, ARROW_SCHEMA, RunRecord


def sysfs(root: Path, files: dict[str, str]) -> Path:
    """A /sys/devices/system/cpu tree holding these files."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text + "\n")
    return root


@pytest.mark.parametrize("files, expected", [
    ({"cpu0/cpufreq/scaling_governor": "performance", "cpu1/cpufreq/scaling_governor": "performance",
      "intel_pstate/no_turbo": "1", "isolated": "2-3"},
     {"host_cpu_governor": "performance", "host_turbo": False, "host_isolated_cpus": "2-3"}),
    ({"cpu0/cpufreq/scaling_governor": "powersave", "cpu1/cpufreq/scaling_governor": "performance",
      "intel_pstate/no_turbo": "0", "isolated": ""},
     {"host_cpu_governor": "performance,powersave", "host_turbo": True, "host_isolated_cpus": ""}),
    ({"cpu0/cpufreq/scaling_governor": "schedutil", "cpufreq/boost": "1"},       # AMD: cpufreq/boost
     {"host_cpu_governor": "schedutil", "host_turbo": True, "host_isolated_cpus": None}),
    ({"cpufreq/boost": "0"}, {"host_cpu_governor": None, "host_turbo": False, "host_isolated_cpus": None}),
    ({}, {"host_cpu_governor": None, "host_turbo": None, "host_isolated_cpus": None}),  # a VM, a container
])
def test_timing_facts_as_the_kernel_shows_them(tmp_path, files, expected):
    facts = hostinfo.timing_facts(sysfs(tmp_path / "cpu", files))
    assert {k: facts[k] for k in expected} == expected
    assert isinstance(facts["host_load_avg"], float) and facts["host_load_avg"] >= 0


def test_every_row_has_the_timing_facts_and_older_rows_have_them_empty():
    assert set(hostinfo.timing_facts()) <= set(ADDED_IN[4])
    for name in hostinfo.timing_facts():
        assert name in RunRecord.model_fields and ARROW_SCHEMA.field(name).nullable
    assert ARROW_SCHEMA.field("host_turbo").type == pa.bool_()
    assert set(hostinfo.timing_facts()) <= set(hostinfo.host_facts(None))


def statuses(facts: dict, cpus: int) -> dict:
    return {name: (status, detail) for name, status, detail in doctor.timing(facts, cpus)}


def test_doctor_warns_of_what_makes_timings_unstable():
    steady = statuses({"host_cpu_governor": "performance", "host_turbo": False, "host_load_avg": 0.4,
                       "host_isolated_cpus": "2-3"}, 2)
    assert {name: s for name, (s, _) in steady.items()} == {
        "CPU governor": "ok", "turbo boost": "ok", "load average": "ok", "isolated CPUs": "note"}
    assert steady["isolated CPUs"][1] == "2-3"
    shaky = statuses({"host_cpu_governor": "powersave", "host_turbo": True, "host_load_avg": 1.01,
                      "host_isolated_cpus": ""}, 2)
    assert {name: s for name, (s, _) in shaky.items()} == {
        "CPU governor": "warn", "turbo boost": "warn", "load average": "warn", "isolated CPUs": "note"}
    assert shaky["load average"][1].startswith("1.01 with 2 CPUs: other work is running")
    assert shaky["CPU governor"][1].startswith("powersave: the clock follows the load")
    unknown = statuses({"host_cpu_governor": None, "host_turbo": None, "host_load_avg": None,
                        "host_isolated_cpus": None}, 2)
    assert {s for s, _ in unknown.values()} == {"note"}      # unknown is never an error
