"""A job of several workers as host processes: N local processes, or one a node of a Slurm
allocation, started with srun.

Each worker runs the same runner with the same spec (``dlbench_runner/world.py``); what
makes it one of N is in its environment, as in a container: its rank, worker 0's address
and every worker's, and its share of the job's threads (``contract.worker_threads``).

- **On this host** (``start_local``): the workers listen on the loopback, each on a free
  port; the job's CPUs are split among them where there is one for each (each pinned to its
  own), shared where not.  Worker 0's output is the job's log; the others' goes to
  ``worker-R.log`` beside it.  The first worker that ends with a non-zero code ends the job:
  the others are killed at once and the job fails naming that worker and its exit.
- **Across the nodes of an allocation** (``start_srun``: a Slurm task of a job of N workers
  holding N nodes): one ``srun`` starts a worker on each node (``SLURM_PROCID`` is its
  rank), at the node's address (``scontrol``'s ``NodeAddr``) and a port of the job's.  Slurm
  binds the tasks to the CPUs it gave them, and with ``--kill-on-bad-exit`` ends every task
  once one fails; srun's own line names the node and the task, and becomes the row's
  error.  The runner's data and out/ are on the file system the nodes share (the job's
  directory).  Only worker 0's node is this one: the job's resource trace is not sampled
  (it would be srun's), and its CPU time is not counted.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from dlbench_runner import contract

from ..errors import DlbenchError
from .base import exited

PORT = 29500
TERM_GRACE_S = 10.0     # srun forwards SIGTERM to its tasks; then it is killed
# srun's line for a task that failed: "srun: error: n2: task 1: Exited with exit code 3"
SRUN_TASK = re.compile(r"srun: error: (?P<node>[^:\s]+): tasks? (?P<task>[\d,-]+): (?P<what>.+)")


class AllocationError(DlbenchError):
    pass


@dataclass(frozen=True)
class Allocation:
    """The nodes of a Slurm allocation, in order, with their addresses; the job's port."""

    nodes: tuple[str, ...]
    addresses: tuple[str, ...]
    port: int = PORT

    @classmethod
    def from_environment(cls, environ=os.environ) -> "Allocation | None":
        """The allocation of this Slurm job where it holds several nodes; None where it
        holds one (or this is no Slurm job)."""
        if int(environ.get("SLURM_JOB_NUM_NODES") or 1) < 2:
            return None
        names = _scontrol(["show", "hostnames", environ["SLURM_JOB_NODELIST"]]).split()
        addresses = []
        for name in names:
            line = _scontrol(["show", "node", "-o", name])
            found = re.search(r"\bNodeAddr=(\S+)", line)
            addresses.append(found.group(1) if found else name)
        # a port of the job's own: two jobs of workers on one node do not meet
        port = PORT + int(environ.get("SLURM_JOB_ID") or 0) % 1000
        return cls(tuple(names), tuple(addresses), port)


def _scontrol(args: list[str]) -> str:
    try:
        done = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise AllocationError(f"scontrol {' '.join(args)}: {exc}") from None
    if done.returncode != 0:
        raise AllocationError(f"scontrol {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def worker_environment(env: dict, job, rank: int | None, leader: str, hosts: list[str]) -> dict:
    """``env`` with what makes a process worker ``rank`` (None: srun's task sets it)."""
    out = dict(env)
    out.update(contract.thread_environment(contract.worker_threads(job.threads, job.workers),
                                           job.hyperparameters))
    out.update({contract.WORKER_ADDRESS: leader, contract.WORKER_HOSTS: ",".join(hosts)})
    if rank is not None:
        out[contract.WORKER_RANK] = str(rank)
    return out


def free_ports(count: int) -> list[int]:
    """``count`` ports of the loopback no one listens on now."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def cpu_share(cpus: list[int] | None, size: int, rank: int) -> list[int] | None:
    """Worker ``rank``'s CPUs of the job's: an even split where there is one for each."""
    if not cpus:
        return None
    each = len(cpus) // size
    return cpus[rank * each:(rank + 1) * each] if each else cpus


class Group:
    """The processes of a job's workers: ``leader`` is the one whose output is the job's
    (worker 0, or srun); ``error()`` says which worker failed, once they have ended."""

    def __init__(self, job, leader: subprocess.Popen, others: list[subprocess.Popen], srun: bool,
                 job_dir: Path):
        self.job, self.leader, self.others, self.srun = job, leader, others, srun
        self.job_dir = job_dir                          # where worker-R.log is
        self.failed: list[tuple[int, int]] = []         # (rank, exit code), the first first
        self.cpu_s: dict[int, float] = {}               # the others' CPU seconds, as they end
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._watch, args=(rank, p), daemon=True,
                                          name=f"worker-{rank}")
                         for rank, p in enumerate(others, start=1)]
        for thread in self._threads:
            thread.start()

    @property
    def processes(self) -> list[subprocess.Popen]:
        return [self.leader, *self.others]

    def _watch(self, rank: int, process: subprocess.Popen) -> None:
        # wait4, not wait: the worker's CPU time (and its descendants') is the job's
        try:
            _, status, usage = os.wait4(process.pid, 0)
        except ChildProcessError:           # reaped elsewhere (a kill's wait)
            code = process.wait()
        else:
            process.returncode = code = os.waitstatus_to_exitcode(status)
            self.cpu_s[rank] = usage.ru_utime + usage.ru_stime
        if code != 0:
            with self._lock:
                first = not self.failed
                self.failed.append((rank, _shell_code(code)))
            if first:
                self.kill()

    def kill(self) -> None:
        """Every worker, at once (srun: its tasks, through srun, then srun)."""
        if self.srun:
            with contextlib.suppress(ProcessLookupError):
                self.leader.send_signal(signal.SIGTERM)
            try:
                self.leader.wait(TERM_GRACE_S)
                return
            except subprocess.TimeoutExpired:
                pass
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)

    def finish(self, code: int, wait_s: float = 60.0) -> None:
        """Once worker 0 has ended with ``code``: the others end with it, or are stopped
        (at once where worker 0 failed first: the job's error is then its own)."""
        if code != 0:
            with self._lock:
                first = not self.failed
                if first:
                    self.failed.append((0, _shell_code(code)))
            if first:
                self.kill()
        for thread in self._threads:
            thread.join(wait_s)
        if any(thread.is_alive() for thread in self._threads):
            self.kill()
            for thread in self._threads:
                thread.join(5.0)

    def others_cpu_s(self) -> float | None:
        """The CPU seconds of the workers other than 0, once they have ended (None: srun's,
        on other nodes, or one not reaped here)."""
        if self.srun or len(self.cpu_s) != len(self.others):
            return None
        return sum(self.cpu_s.values())

    def error(self, tail: list[str]) -> str | None:
        """The row's error where a worker other than 0 ended the job (``tail``: the job's
        last lines, where srun names the failed task)."""
        size = self.job.workers
        if self.srun:
            for line in tail:
                found = SRUN_TASK.search(line)
                if found and found.group("task") != "0":
                    return (f"worker {found.group('task')} of {size} (on {found.group('node')}): "
                            f"{found.group('what').strip()}; srun stopped the others")
            return None
        if self.failed and self.failed[0][0] != 0:
            rank, code = self.failed[0]
            text = f"worker {rank} of {size}: {exited(code, 'process')}; the others were stopped"
            last = _last_line(self.job_dir / f"worker-{rank}.log")
            return text + (f" (its last line: {last[:300]})" if last else "")
        return None


def _shell_code(code: int) -> int:
    return 128 - code if code < 0 else code


def _last_line(path: Path) -> str | None:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return None
    return lines[-1].strip() if lines else None


def start_local(job, argv: list[str], env: dict, cwd: Path, job_dir: Path, popen) -> Group:
    """The job's workers as processes of this host, on the loopback (see the module)."""
    size = job.workers
    ports = free_ports(size)
    hosts = [f"127.0.0.1:{port}" for port in ports]
    processes = []
    try:
        for rank in range(size):
            mine = cpu_share(job.cpu_list, size, rank)
            environment = worker_environment(env, job, rank, hosts[0], hosts)
            output = subprocess.PIPE if rank == 0 else open(job_dir / f"worker-{rank}.log", "wb")
            try:
                processes.append(popen(argv, stdout=output, env=environment, cwd=cwd, cpus=mine))
            finally:
                if rank:
                    output.close()
    except BaseException:           # none of the workers started is left running
        for process in processes:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        raise
    return Group(job, processes[0], processes[1:], srun=False, job_dir=job_dir)


def start_srun(job, argv: list[str], env: dict, cwd: Path, job_dir: Path, popen,
               allocation: Allocation) -> Group:
    """One srun starting a worker on each node of the allocation (see the module)."""
    size = job.workers
    if len(allocation.nodes) != size:
        raise AllocationError(f"a job of {size} workers in an allocation of "
                              f"{len(allocation.nodes)} nodes")
    hosts = [f"{address}:{allocation.port}" for address in allocation.addresses]
    environment = worker_environment(env, job, None, hosts[0], hosts)
    cpus_each = max(1, job.cpus // size) if job.cpus else None
    # rank from srun; worker 0's output is srun's, the others' go beside the job's log
    wrapper = (f'export {contract.WORKER_RANK}="$SLURM_PROCID"; '
               'if [ "$SLURM_PROCID" = 0 ]; then exec "$@"; fi; '
               f'exec "$@" > {_quote(str(job_dir))}/worker-"$SLURM_PROCID".log 2>&1')
    command = ["srun", f"--nodes={size}", f"--ntasks={size}", "--ntasks-per-node=1",
               "--kill-on-bad-exit=1", "--unbuffered", f"--job-name=dlbench-workers",
               *([f"--cpus-per-task={cpus_each}"] if cpus_each else []),
               "sh", "-c", wrapper, "sh", *argv]
    process = popen(command, stdout=subprocess.PIPE, env=environment, cwd=cwd, cpus=None)
    return Group(job, process, [], srun=True, job_dir=job_dir)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"
