"""The command line's conventions, as a user meets them in a shell: the version, choices
checked in one place, documented exit codes, JSON from doctor, one-line errors, and tables
that a pipe receives whole."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest
import requests

from conftest import REPO, dlbench
from orchestrator import __version__
from orchestrator.errors import DockerUnavailable, docker_errors

NO_DOCKER = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}


def one_line_error(proc, code: int, message: str):
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("dlbench: error: "), proc.stderr
    assert message in proc.stderr, proc.stderr


def test_version_and_the_documented_exit_codes():
    assert dlbench("--version", check=True).stdout.strip() == __version__
    assert dlbench("version", check=True).stdout.strip() == __version__
    text = " ".join(dlbench("--help", env={"COLUMNS": "200"}, check=True).stdout.split())
    assert "Exit status: 0 ok; 1 an error (one line on stderr); 2 a usage error; 3 some jobs not ok" in text
    assert "130 Ctrl-C (SIGINT), 143 SIGTERM" in text


def test_choices_are_checked_item_by_item():
    plan = dlbench("run", "--profile", "quick,paper", "--frameworks", "caffe", "--datasets", "mnist",
                   "--dry-run", "--format", "json", env=NO_DOCKER, check=True)
    assert [json.loads(line)["profile"] for line in plan.stdout.splitlines()] == ["quick", "paper"]
    one_line_error(dlbench("run", "--profile", "quick,fast", "--dry-run"), 2,
                   "--profile 'fast': choose from paper, quick")
    one_line_error(dlbench("build-images", "--variant", "cpu,tpu", env=NO_DOCKER), 2,
                   "--variant 'tpu': choose from cpu, gpu")
    one_line_error(dlbench("run", "--runtime", "podman", "--dry-run"), 2, "--runtime 'podman': choose from docker, native")
    help_text = dlbench("run", "--help", env={"COLUMNS": "200"}, check=True).stdout
    assert "[paper|quick|fair],..." in help_text and "docker|native" in help_text


def test_importing_a_folder_without_a_data_set_is_an_error(tmp_path):
    one_line_error(dlbench("datasets", "import", tmp_path), 1,
                   f"{tmp_path}: no data set in it (a data root holds mnist/ or cifar10/)")
    (tmp_path / "notes.txt").write_text("no data here\n")
    (tmp_path / "mnist-old").mkdir()
    one_line_error(dlbench("datasets", "import", tmp_path), 1, "no data set in it")
    one_line_error(dlbench("datasets", "import", tmp_path / "missing"), 1, "missing: no such folder")


def test_doctor_speaks_json(tmp_path):
    proc = dlbench("doctor", "--format", "json", "--data-dir", tmp_path, "--results", tmp_path,
                   env=NO_DOCKER)
    assert proc.returncode == 1, proc.stderr          # no Docker daemon: a failed check
    checks = {c["name"]: c for c in json.loads(proc.stdout)}
    assert checks["docker"]["status"] == "fail" and "cannot reach the Docker daemon" in checks["docker"]["detail"]
    assert {c["status"] for c in checks.values()} <= {"ok", "fail", "warn", "note"}
    assert {"CPU governor", "turbo boost", "load average", "isolated CPUs", "disk"} <= set(checks)
    assert all(set(c) == {"name", "status", "detail"} for c in checks.values())
    table = dlbench("doctor", "--data-dir", tmp_path, "--results", tmp_path, env=NO_DOCKER)
    assert table.returncode == 1 and "FAIL docker: cannot reach the Docker daemon" in table.stdout


def test_results_in_a_pipe_keep_every_column_whole(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(REPO / "tests" / "fixtures" / "results-v1", results)
    text = dlbench("results", "--results", results, env={"COLUMNS": "60"}, check=True).stdout
    assert "…" not in text
    head = next(line for line in text.splitlines() if "when" in line)
    assert re.split(r"\s{2,}", head.strip()) == [
        "when", "framework", "data", "profile", "dev", "thr", "status", "accuracy %", "setup s",
        "train s", "test s", "img/s", "params", "CPU %", "load", "run"]
    assert "v1okrun0" in text and "v1badrun" in text and "failed" in text



def test_without_docker_the_error_names_the_daemon_tried_and_nothing_is_made(tmp_path):
    results, cache = tmp_path / "results", tmp_path / "cache"
    env = {**NO_DOCKER, "XDG_CACHE_HOME": str(cache)}
    said = ("cannot reach the Docker daemon at unix:///nonexistent/docker.sock (DOCKER_HOST): no "
            "such file or directory; is it running, and may this user use it? (dlbench run "
            "--runtime native runs the jobs without Docker)")
    run = ["run", "--frameworks", "caffe,torch", "--datasets", "mnist", "--results", results]
    one_line_error(dlbench(*run, env=env), 1, said)
    one_line_error(dlbench("build-images", "--frameworks", "torch", env=env), 1, said)
    verbose = dlbench(*run, "--verbose", env=env)
    assert verbose.returncode == 1
    assert verbose.stderr.splitlines()[1].startswith(
        "dlbench: detail: connecting to Docker: DockerException: ")
    assert not results.exists() and not cache.exists()     # no results, no source archives


def test_without_docker_host_the_default_socket_is_named(monkeypatch):
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    with pytest.raises(DockerUnavailable) as caught, docker_errors("connecting to Docker"):
        try:
            raise PermissionError(13, "Permission denied")
        except PermissionError as exc:
            raise requests.ConnectionError(f"('Connection aborted.', {exc!r})") from exc
    assert str(caught.value).startswith("cannot reach the Docker daemon at "
                                        "unix:///var/run/docker.sock: permission denied; ")


def test_a_cache_directory_that_cannot_be_made_is_one_line(tmp_path, monkeypatch):
    """XDG_CACHE_HOME naming a file gave a NotADirectoryError traceback."""
    from conftest import NO_ROUTE
    from orchestrator import owners
    from orchestrator.build import sources
    from orchestrator.errors import DlbenchError

    a_file = tmp_path / "a-file"
    a_file.write_text("")
    env = {"XDG_CACHE_HOME": str(a_file), **NO_ROUTE, **NO_DOCKER}
    why = f"{a_file}/dlbench/datasets: cannot make the cache directory: Not a directory"
    one_line_error(dlbench("datasets", "download", "mnist", env=env, timeout=300), 1, why)
    one_line_error(dlbench("run", "--runtime", "native", "--frameworks", "pytorch", "--datasets", "mnist",
                           "--profile", "quick", "--results", tmp_path / "results", env=env, timeout=300),
                   1, why)
    monkeypatch.setenv("XDG_CACHE_HOME", str(a_file))
    for folder, name in ((owners.owners_dir, "owners"), (sources.cache_dir, "sources")):
        with pytest.raises(DlbenchError, match=f"{a_file}/dlbench/{name}: cannot make the cache directory"):
            folder()


# -- the shell: completion, readable help, names as a user types them ---------------------------
def test_completion_is_on_and_completes_commands_and_options():
    assert "--install-completion" in dlbench("--help", env={"COLUMNS": "80"}, check=True).stdout
    script = REPO / ".venv" / "bin" / "dlbench"
    if not script.exists():
        script = shutil.which("dlbench")
    assert script, "the dlbench command is not installed"

    def complete(*words):
        env = {"_DLBENCH_COMPLETE": "complete_bash", "COMP_WORDS": " ".join(("dlbench",) + words),
               "COMP_CWORD": str(len(words))}
        proc = subprocess.run([str(script)], capture_output=True, text=True, timeout=60,
                              env={**os.environ, **env})
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split()
    assert complete("rep") == ["report"]
    assert "--frameworks" in complete("run", "--fra")


def test_run_help_fits_80_columns_with_readable_values_and_every_profile():
    text = dlbench("run", "--help", env={"COLUMNS": "80"}, check=True).stdout
    assert all(len(line) <= 80 for line in text.splitlines())
    assert not re.search(r"<(str|int|float|bool|path|list\[)", text), text
    assert "--frameworks TEXT" in text and "--cpus INTEGER" in text and "--results PATH" in text
    profile = " ".join(text.split("--profile", 1)[1].split("--cpus", 1)[0].split())
    from orchestrator import catalog
    for name in catalog.PROFILES:
        assert name in profile.split("(default")[1], profile      # in the help, not only the metavar


@pytest.mark.parametrize("command", [["compare"], ["site"], ["datasets", "import"], ["report"], ["tune"]])
def test_arguments_show_their_names_not_python_types(command):
    text = dlbench(*command, "--help", env={"COLUMNS": "80"}, check=True).stdout
    assert not re.search(r"<(str|int|float|bool|path|list\[)", text, re.I), text
    assert all(len(line) <= 80 for line in text.splitlines())


def test_a_wrong_choice_is_said_in_dlbench_words():
    proc = dlbench("results", "--format", "xml")
    one_line_error(proc, 2, "--format 'xml': choose from table, csv, json")
    assert "Value error" not in proc.stderr and "Invalid value" not in proc.stderr
    one_line_error(dlbench("run", "--cpus", "two", "--dry-run"), 2, "--cpus takes a whole number")


def test_names_are_case_insensitive_and_a_near_miss_gets_a_guess():
    one_line_error(dlbench("run", "--frameworks", "cafe", "--dry-run"), 2,
                   "unknown framework 'cafe' (did you mean caffe? choose from caffe,")
    one_line_error(dlbench("run", "--datasets", "mnst", "--dry-run"), 2,
                   "unknown data set 'mnst' (did you mean mnist? choose from mnist, cifar10)")
    one_line_error(dlbench("run", "--profile", "quik", "--dry-run"), 2,
                   "--profile 'quik': did you mean quick? choose from paper, quick, fair")
    dlbench("run", "--frameworks", "Caffe", "--datasets", "MNIST", "--profile", "Quick", "--dry-run",
            check=True)
    from orchestrator.options import Axes, RunOptions, merge
    axes = merge(Axes(), RunOptions.from_command_line(frameworks="Caffe,TensorFlow", datasets="MNIST",
                                                      profile="Quick"))
    assert (axes.frameworks, axes.datasets, axes.profiles) == (["caffe", "tensorflow"], ["mnist"], ["quick"])


def test_a_missing_data_directory_leaves_no_results_folder(tmp_path):
    """The results folder used to be made (with its lock file) before the data were checked."""
    results = tmp_path / "new" / "results"
    proc = dlbench("run", "--runtime", "native", "--frameworks", "caffe", "--datasets", "mnist",
                   "--profile", "quick", "--data-dir", tmp_path / "no-data", "--results", results,
                   env=NO_DOCKER, timeout=300)
    one_line_error(proc, 1, f"{tmp_path / 'no-data' / 'mnist'}: no such directory")
    assert not (tmp_path / "new").exists()


def test_every_option_takes_a_plain_value_as_typer_itself_does(tmp_path):
    """The command line's own coercion (``common._Plain``, without pydantic) against
    typer's, for every option of every command: the same value, or the same error."""
    coercion = pytest.importorskip("typer._coercion")
    import typer
    from typer._click import Context

    from orchestrator.cli import app, common

    (tmp_path / "a file").write_text("")
    values = [None, "5", "-3", "007", "+5", "1.5", "1e3", " 2", "abc", "", "table", "json", "TABLE",
              "cpu", "x/y", str(tmp_path), str(tmp_path / "a file"), "/nonexistent/q", ("a", "b"),
              ["5", "x"], 3, 2.5, True, False]

    def outcome(runtime, value, param, ctx):
        try:
            return "value", repr(runtime.coerce(value, param=param, ctx=ctx))
        except Exception as exc:  # noqa: BLE001
            return "error", type(exc).__name__, str(exc)

    compared, commands = 0, [typer.main.get_command(app)]
    while commands:
        command = commands.pop()
        commands += list(getattr(command, "commands", {}).values())
        ctx = Context(command)
        for param in command.get_params(ctx):
            found = getattr(param, "type_descriptor", None)
            if found is None:
                continue
            assert common._plain(found), f"{command.name} {param.name}: typer's own coercion (pydantic)"
            plain, typer_own = common._Plain(found.parameter_info, found.annotation, found), \
                coercion.build_runtime_param(found)
            for value in values:
                assert outcome(plain, value, param, ctx) == outcome(typer_own, value, param, ctx), \
                    (command.name, param.name, value)
                compared += 1
    assert compared > 1000
