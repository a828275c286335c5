"""A job trained data-parallel over several workers: who this worker is, and how a global
batch is shared among them.

The spec's ``workers`` (N, 2 or more) says a job is one of N processes training one model
with the framework's own engine (``models.json``'s ``distributed``); each worker runs this
runner with the same spec.  Where it stands among them the runtime says in the
environment, as it alone knows where the workers run:

    DLBENCH_WORKER_RANK      0 .. N-1; worker 0 tests, checks and writes the result
    DLBENCH_WORKER_ADDRESS   HOST:PORT where worker 0 listens for the others
    DLBENCH_WORKER_TIMEOUT_S how long a worker waits for the others (default 120)
    DLBENCH_WORKER_HOSTS     HOST:PORT of every worker, in rank order, comma-separated, for
                             an engine in which every worker listens (TensorFlow's)

The sharing is the same for every framework: of each global batch of B images (the
model's batch, the step a single worker takes), worker r takes the images r, r + N,
r + 2N, ... (``shard``), and scales its mean loss by its share of the batch (``scale``),
so that the engine's average of the workers' gradients is the gradient of the batch's
mean loss, as one worker computes it, also where B is not a multiple of N.
"""

import os

from .contract import (WORKER_ADDRESS as ADDRESS, WORKER_HOSTS as HOSTS, WORKER_RANK as RANK,
                       WORKER_TIMEOUT as TIMEOUT)
DEFAULT_TIMEOUT_S = 120.0


class WorldError(ValueError):
    """The environment does not say where this worker stands."""


class World:
    """This worker among ``size``: its ``rank``, where worker 0 listens (``host``, ``port``)."""

    def __init__(self, size, rank, host, port, timeout_s=DEFAULT_TIMEOUT_S, hosts=None):
        self.size, self.rank, self.host, self.port = size, rank, host, port
        self.timeout_s = timeout_s
        self.hosts = hosts          # every worker's HOST:PORT, in rank order, where given

    @property
    def leader(self):
        """Worker 0: the one that tests the model, checks it and writes the result."""
        return self.rank == 0

    def shard(self, batch):
        """This worker's images of a global batch (a sequence of indices or images)."""
        return batch[self.rank::self.size]

    def scale(self, batch_size):
        """What this worker's mean loss over its shard is multiplied by: the engine averages
        the workers' gradients (divides their sum by N), so each shard's mean counts by its
        share of the batch, times N."""
        share = len(range(self.rank, batch_size, self.size))
        return share * self.size / float(batch_size)

    def describe(self):
        return {"workers": self.size, "rank": self.rank}


def from_spec(spec, environ=os.environ):
    """The worker's ``World`` for a spec of several workers; None for a job of one."""
    size = spec.get("workers")
    if not size:
        return None
    if isinstance(size, bool) or not isinstance(size, int) or size < 2:
        raise WorldError("workers is a whole number, 2 or more, not %r" % (size,))
    try:
        rank = int(environ[RANK])
        host, _, port = environ[ADDRESS].rpartition(":")
        port = int(port)
        timeout = float(environ.get(TIMEOUT) or DEFAULT_TIMEOUT_S)
        hosts = environ[HOSTS].split(",") if environ.get(HOSTS) else None
    except (KeyError, ValueError):
        raise WorldError("a job of %d workers needs %s (0..%d) and %s (HOST:PORT) in its "
                         "environment" % (size, RANK, size - 1, ADDRESS))
    if hosts is not None and len(hosts) != size:
        raise WorldError("%s names %d workers, not %d" % (HOSTS, len(hosts), size))
    if not 0 <= rank < size or not host or not 0 < port < 65536 or not timeout > 0:
        raise WorldError("%s=%s, %s=%s: not a worker of %d" % (RANK, environ.get(RANK), ADDRESS,
                                                               environ.get(ADDRESS), size))
    return World(size, rank, host, port, timeout, hosts)
