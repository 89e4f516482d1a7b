"""Timing helpers for device collectives: back-to-back eager calls and CUDA-graph replays.

Both return seconds per call on this rank, measured with CUDA events on the
stream the calls run on; the caller agrees across ranks (max).  ``fn`` must be
stream-ordered and must not wait on the host when the stream is capturing
(mpiml's ``nccl`` and ``ipc`` backends, CuPy-NCCL); warm it up first so that
compilation, connection set-up and memory-pool growth stay out of the capture.
"""

__all__ = ["time_eager", "time_graph", "capture"]


def _stream():
    import cupy

    return cupy.cuda.get_current_stream()


def time_eager(fn, iters, *, warmup=3, barrier=None):
    """Seconds per call of ``iters`` back-to-back calls of ``fn()`` (synchronised at the end)."""
    import time

    stream = _stream()
    for _ in range(warmup):
        fn()
    stream.synchronize()
    if barrier is not None:
        barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    stream.synchronize()
    return (time.perf_counter() - t0) / iters


def capture(fn, calls):
    """A CUDA graph of ``calls`` calls of ``fn()`` captured on the current (non-default) stream."""
    stream = _stream()
    stream.begin_capture()
    try:
        for _ in range(calls):
            fn()
    finally:
        graph = stream.end_capture()
    return graph


def time_graph(fn, iters, *, calls=20, barrier=None):
    """Seconds per call of ``fn`` captured ``calls`` times in one graph, replayed ``iters`` times.

    The current stream must not be the legacy default stream (use
    ``with cupy.cuda.Stream(non_blocking=True):``).
    """
    import time

    stream = _stream()
    fn()
    stream.synchronize()
    graph = capture(fn, calls)
    graph.launch(stream)
    stream.synchronize()
    if barrier is not None:
        barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        graph.launch(stream)
    stream.synchronize()
    return (time.perf_counter() - t0) / (iters * calls)
