"""What the device transports (``nccl``, ``ipc``) share: completion, errors, placement.

Device collectives are stream-ordered: they are enqueued on CuPy's current
stream and their results are valid for any later work on that stream, exactly
like a CuPy kernel or a NCCL call.  Whether the host also waits for completion
is ``MPIML_DEVICE_SYNC``:

* ``0`` (default): the call returns as soon as the work is enqueued.  Failures
  are still caught: the watchdog thread (:mod:`._watchdog`) sees a kernel that
  gave up after ``MPIML_TIMEOUT``, an NCCL error or an NCCL call that did not
  complete in time, aborts the transport and poisons the communicator, so the
  next call on it, or ``comm.synchronize()``, raises on every surviving rank;
* ``1``: the call also waits on the host until the collective has finished,
  at most ``MPIML_TIMEOUT`` seconds, and raises there.

While the current stream is being captured into a CUDA graph the host never
waits (it cannot), whatever the setting.
"""

import os

__all__ = ["device_sync", "DONE", "SpinRequest", "node_layout", "agree_or_raise"]

import time

from ..._errors import CommTimeoutError
from .._request import CompletedRequest, Request

#: shared completed request returned by stream-ordered calls that need no host wait
DONE = CompletedRequest()


class SpinRequest(Request):
    """A request whose :meth:`wait` polls without sleeping (still with the timeout).

    The generic wait backs off to 1 ms sleeps, but a staged collective makes
    progress only while it is tested (MPI's nonblocking collectives advance
    inside ``MPI_Test``, chunks move on as their copies land) and a device
    collective finishes in microseconds: sleeping would add up to a millisecond
    per step.  Spinning costs one core while waiting, as blocking MPI does.
    """

    def wait(self, timeout=None):
        if self.test():
            return self._value()
        from ... import _config

        limit = _config.timeout() if timeout is None else timeout
        deadline = None if limit is None else time.perf_counter() + limit
        spins = 0
        while not self.test():
            spins += 1
            if spins & 255 == 0:
                if deadline is not None and time.perf_counter() >= deadline:
                    self.abandon()
                    raise CommTimeoutError(self.op, self.peer, limit)
                time.sleep(0)
        return self._value()


def device_sync():
    """``MPIML_DEVICE_SYNC`` as a bool (default False: stream-ordered, watched by the watchdog)."""
    raw = os.environ.get("MPIML_DEVICE_SYNC", "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise ValueError(f"MPIML_DEVICE_SYNC must be 0 or 1; got {raw!r}")


def agree_or_raise(world, error, what):
    """Allgather a local error (or None); raise the same error on every rank if any rank had one.

    Set-up steps of device transports are collective: a rank must not leave the
    sequence alone, or the others would wait in the next exchange for ever.
    """
    from ..._errors import BackendUnavailableError

    errors = world.allgather_obj(error)
    bad = [(r, e) for r, e in enumerate(errors) if e]
    if bad:
        raise BackendUnavailableError(f"{what}: " + "; ".join(f"rank {r}: {e}" for r, e in bad))


def node_layout(infos, node_size=None):
    """Node index of every rank from ``infos`` (hostname first) and ``MPIML_NODE_SIZE``.

    Ranks on one host form a node; ``node_size=k`` further cuts each host into
    virtual nodes of ``k`` consecutive ranks, so two-level collectives can be
    tested on one machine.  Returns a list of node indices in rank order.
    """
    hosts, local_index, nodes, keys = {}, [], [], {}
    for info in infos:
        host = info[0]
        i = hosts.get(host, 0)
        hosts[host] = i + 1
        local_index.append(i)
    for info, i in zip(infos, local_index):
        key = (info[0], i // node_size if node_size else 0)
        nodes.append(keys.setdefault(key, len(keys)))
    return nodes
