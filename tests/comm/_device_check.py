"""Inputs written and results checked on the device, for the GPU collective stress scripts
(``gpu_stress_epochs.py``, ``gpu_replay.py``): a few kernel launches per call and no host copy.

Inputs are small integers, ``x[i] = i % 13 + c + kdev[0]``; a result is compared with its closed form
``a * ((i + off) % 13) + b + kc * kdev[0]`` and the mismatches are added to a device counter, read at the
scripts' sync points.  ``kdev`` is a device word, so CUDA graphs captured once check new values at each
replay.  Make a :class:`DeviceCheck` after the rank's GPU is chosen (``mpiml.init``).
"""

import numpy as np

import cupy as cp

_SRC = r'''
extern "C" __global__ void check_fill(float* x, long long n, float c, const float* kdev) {
    const float k = kdev[0];
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        x[i] = (float)(i % 13) + c + k;
}
// got[i] == a * ((i + off) % 13) + b + kc * kdev[0]; mismatches added to bad[0]
extern "C" __global__ void check_expect(const float* got, long long n, long long off, float a, float b, float kc,
                                        const float* kdev, int* bad) {
    const float k = kdev[0];
    int miss = 0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        miss += got[i] != a * (float)((i + off) % 13) + b + kc * k;
    if (miss) atomicAdd(bad, miss);
}
extern "C" __global__ void check_spin(long long cycles) {
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
}
'''


def _grid(n):
    return (max(1, min(256, -(-n // 256))),), (256,)


class DeviceCheck:
    """The kernels, compiled for the current device, and its mismatch counter."""

    def __init__(self):
        mod = cp.RawModule(code=_SRC)
        self._fill, self._expect, self._spin = (mod.get_function(n) for n in ("check_fill", "check_expect",
                                                                                "check_spin"))
        self.bad = cp.zeros(1, dtype=cp.int32)

    def fill(self, x, c, kdev):
        """``x[i] = i % 13 + c + kdev[0]`` on the current stream."""
        g, b = _grid(x.size)
        self._fill(g, b, (x, np.int64(x.size), np.float32(c), kdev))

    def expect(self, got, a, b, kc, kdev, off=0):
        """Count the elements of ``got`` that are not ``a * ((i + off) % 13) + b + kc * kdev[0]`` (current stream)."""
        if got.size:
            g, bl = _grid(got.size)
            self._expect(g, bl, (got, np.int64(got.size), np.int64(off), np.float32(a), np.float32(b),
                                 np.float32(kc), kdev, self.bad))

    def spin(self, cycles):
        """Hold the current stream for ``cycles`` clock cycles (one thread)."""
        self._spin((1,), (1,), (np.int64(cycles),))

    def mismatches(self):
        """The count so far (a copy to the host: waits for the work queued before it on the null stream)."""
        return int(self.bad.get()[0])
