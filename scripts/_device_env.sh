# Sourced by the GPU-host pass scripts (from the repository root): the environment they share.
# NVLink multicast off (DEVICE.md), unbuffered Python, the checkout's src/ and tests/ on PYTHONPATH,
# PY (the interpreter, $PYTHON or python3), and under Open MPI the launcher the tests use
# (MPIML_TEST_MPIEXEC[_ARGS]: mpirun, no binding, oversubscription allowed, root allowed when root).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
if mpirun --version 2>/dev/null | grep -qi "open mpi"; then
    export MPIML_TEST_MPIEXEC=${MPIML_TEST_MPIEXEC:-mpirun}
    _mpiml_extra="--bind-to none --oversubscribe"
    [ "$(id -u)" = 0 ] && _mpiml_extra="$_mpiml_extra --allow-run-as-root"
    export MPIML_TEST_MPIEXEC_ARGS=${MPIML_TEST_MPIEXEC_ARGS:-$_mpiml_extra}
    unset _mpiml_extra
fi
