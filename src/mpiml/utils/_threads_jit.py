"""Dynamic scheduling for the compiled CPU kernels: an atomic counter that a rank's threads take work from.

Numba's ``prange`` hands each thread an equal run of the iterations, fixed in advance (its
``workqueue`` layer, which mpiml uses: see :mod:`mpiml.utils._threads`).  A thread that runs
slower than the others (its core's other hardware thread busy, another rank's thread or the
system scheduled on its core) then holds up the whole kernel, and with several ranks the
collective after it: a rank's step took as long as its slowest thread.  With
:func:`fetch_add`, a kernel runs ``prange`` over its threads only and each thread takes the
next part of the work from a shared counter until none is left, so the threads finish
together whatever their speeds::

    counter = np.zeros(1, np.int64)
    for w in nb.prange(workers):
        while True:
            part = fetch_add(counter)
            if part >= parts:
                break
            ...

The work of a part must not depend on which thread runs it (the kernels keep per-part
partial results and add them in part order, so the bits do not depend on the schedule).

``MPIML_CPU_SCHEDULE=static`` (for A/B measurements) makes :func:`workers` return one worker a
part: Numba's equal runs of ``prange`` iterations then fix how many parts each thread takes,
as a plain ``prange`` over the parts would.
"""

import os

from ._jit import numba

__all__ = ["fetch_add", "workers", "add_one"]


def workers(parts, threads):
    """The ``prange`` count of a kernel whose threads take ``parts`` from a counter: its threads
    (dynamic), or ``parts`` under ``MPIML_CPU_SCHEDULE=static``."""
    if os.environ.get("MPIML_CPU_SCHEDULE") == "static":
        return int(max(1, parts))
    return int(max(1, min(parts, threads)))

numba()  # the cache directory and thread settings, before Numba's first import
from numba import types  # noqa: E402
from numba.core import cgutils  # noqa: E402
from numba.core.extending import intrinsic  # noqa: E402


@intrinsic
def fetch_add(typingctx, counter):
    """``counter[0] += 1`` as one atomic operation; returns the value before (int64 counter array)."""
    if not (isinstance(counter, types.Array) and counter.dtype == types.int64):
        return None
    sig = types.int64(counter)

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [context.get_constant(types.intp, 0)])
        return builder.atomic_rmw("add", ptr, context.get_constant(types.int64, 1), "monotonic")

    return sig, codegen


@numba().njit(cache=True, nogil=True)
def add_one(counter):
    """:func:`fetch_add` called from Python (an intrinsic runs only inside compiled code)."""
    return fetch_add(counter)
