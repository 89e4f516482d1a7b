#!/usr/bin/env bash
# The one GPU-host pass: every device call of the project runs a PART of this script.
#
#   bash scripts/device_pass.sh PART [PART ...]      (repository root, on the GPU host)
#
#   tests     the `-m gpu` tests of comm, the neighbours, the kernel loader and start-up (1-4 ranks)
#   tests2    the `-m gpu` tests of the kernels and k-means (~300 s on one H100)
#   tests3    every other `-m gpu` test: the linear models, decomposition, forests, datasets, validation,
#             model files
#   comm      mpiml info; device collectives at 4/3 ranks with a stalled or killed peer; mpiml tune
#             and mpiml bench comm on CuPy buffers; bench_gpu.py; vs_nccl.py; staged MPI (2 ranks)
#   kmeans    mpiml bench ml --algo kmeans: scaling, the whole fit at 4e7 x 64 (k-means||), the four
#             benchmark shapes; the kernel benchmark on one GPU
#   knn       k-nearest neighbours (mpiml bench ml --algo knn); sparse k-means and neighbours
#   linear    LinearRegression, Ridge, LogisticRegression at their defaults at 1, 2, 4 ranks
#             (mpiml.bench.ml_decomp: mpiml, plain CuPy, scikit-learn, floor on the same data)
#   linear_scale  LinearRegression 1e8 x 64, LogisticRegression 1e7 x 128, sparse Ridge on one GPU
#   forest    random forests (mpiml bench ml --algo rf)
#   pca       PCA and TruncatedSVD at their defaults at 1, 2, 4 ranks (mpiml.bench.ml_decomp)
#   pca_scale PCA 1e7 x 512 and 1e6 x 512 (with scikit-learn), sparse TruncatedSVD on one GPU
#   firstfit  the first fit on a fresh machine (compilation included): benchmarks/gpu/first_fit.py
#   dask      Dask over mpi:// with CuPy frames: comm checks, the comm sweep, (x + x.T).sum() vs tcp://
#   seeds     the source documents' experiments (benchmarks/seeds/README.md) at the host's GPU count (<= 340 s)
#   seeds_ranks  000 on 1 GPU and every 2-GPU column (<= 190 s): `seeds seeds_ranks` fit one call; then
#             benchmarks/seeds/table.py
#   wave      one call with each performance target's headline: k-NN vs its peers and over GPUs, LinearRegression
#             and LogisticRegression on 1 and all GPUs, the forest on 1 and all GPUs, every op vs raw NCCL
#   wave2     the first fit on a fresh machine, PCA and Ridge on all GPUs
#   wave3     the linear models at 1 and all GPUs, the new collectives (correctness, then vs raw NCCL), the CuPy
#             kernels' manifest and the first fit, the k-NN ring vs local
#   wave3_one one GPU: the families' GPU tests, the new scikit-learn parameters on CuPy, the CuPy warm-up test
#   wave4     still to measure: k-NN d = 960, the forest regressor on 1 and all GPUs, the first fit with init
#             waiting (cold_wait), CPU ranks 1 -> 8 on the host's cores
#   wave5     every op vs raw NCCL at the defaults, the forest regressor on 1 and all GPUs, CPU ranks 1 -> 8,
#             1 and 2 CPU ranks on 2 cores
#   profile   where the time goes: the linear models' fits traced at 1 and all GPUs (Gram variant picked), the forest
#             regressor's level profile with larger histogram chunks, sparse TruncatedSVD's parts (~250 s)
#   check     after a merge (~550 s, 4 GPUs): the GPU tests of the linear models, decomposition and forests side by
#             side, the new IPC paths alone, then vs raw NCCL, the linear models and sparse products at the defaults
#   soak      five minutes of random checked collectives on every GPU (BUDGET=400)
#
# Environment (one preamble for every part): NVLink multicast off (DEVICE.md: NCCL_NVLS_ENABLE=0,
# TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1), Open MPI allowed to run as root with
# oversubscription, PYTHONPATH=src:tests (plus the wheels carried in .whl/: dask, distributed, heat),
# and the tests' launcher (MPIML_TEST_MPIEXEC[_ARGS]) set to that mpirun.
#
# Output, all under $OUT (default /tmp/device_pass_out):
#   device_pass_<PART>.log    every step's command, output, exit status and time, then the summary
#   results_<PART>.tar.gz     the JSON and PNG written by the part's benchmarks, named as in
#                             benchmarks/results/ (<benchmark>_<machine>.json, e.g. kmeans_fit_4xh200.json)
# Every step has its own time limit; a failing step does not stop the others; a step that would start
# after BUDGET seconds (default 560, so that one part fits a 10-minute call) is skipped and says so.
set -u
[ $# -ge 1 ] || { sed -n '2,/^set -u/p' "$0" | sed '$d'; exit 2; }

# ---------------------------------------------------------------------- the environment
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} MPIML_TIMEOUT=${MPIML_TIMEOUT:-120} DASK_LOGGING__DISTRIBUTED=error
export MPIML_TEST_MPIEXEC=mpirun MPIML_TEST_MPIEXEC_ARGS="--allow-run-as-root --bind-to none --oversubscribe"
OUT=${OUT:-/tmp/device_pass_out}
BUDGET=${BUDGET:-560}
mkdir -p "$OUT"
SITE=""
if ls .whl/*.whl >/dev/null 2>&1; then   # what the host lacks (scripts/device_wheels.sh): dask, distributed and their
    # needs; scikit-learn-intelex with its oneDAL and TBB, whose libraries go to PREFIX/lib (hence --prefix, not --target)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --ignore-installed --prefix /tmp/pfx \
        .whl/*.whl >"$OUT/wheels.log" 2>&1 && SITE=$(ls -d /tmp/pfx/lib/python3*/site-packages | head -1)
fi
export PYTHONPATH="$PWD/src:$PWD/tests${SITE:+:$SITE}"
MPIRUN="mpirun --allow-run-as-root --bind-to none --oversubscribe -x PYTHONPATH -x OMP_NUM_THREADS -x MPIML_TIMEOUT \
 -x DASK_LOGGING__DISTRIBUTED -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x NVSHMEM_DISABLE_NVLS"
PYTEST="python3 -m pytest -v -m gpu -p no:cacheprovider -o addopts= -rs --durations=10"
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
MODEL=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -oiE 'h100|h200|a100|l40s|b200' \
        | tr 'A-Z' 'a-z')
MACHINE="${NGPU}x${MODEL:-gpu}"            # names the results: kmeans_fit_4xh200.json
R=$(( NGPU >= 4 ? 4 : (NGPU >= 2 ? NGPU : 2) ))   # ranks of the multi-rank runs (they share one GPU if need be)
RANKS=$( [ "$NGPU" -ge 4 ] && echo 1,2,4 || { [ "$NGPU" -ge 2 ] && echo 1,2 || echo 1; })

step() {  # step NAME SECONDS COMMAND...: run with its own limit, output to the log, status to the summary
    local name=$1 secs=$2; shift 2
    if [ $((SECONDS - T0 + 10)) -gt "$BUDGET" ]; then SUMMARY+=("$name: skipped (budget)"); return; fi
    local left=$((BUDGET - (SECONDS - T0)))
    [ "$secs" -gt "$left" ] && secs=$left
    echo "=== [$name] (limit ${secs}s, at $((SECONDS - T0))s): $*" >>"$LOG"
    local t0=$SECONDS
    timeout -k 10 "$secs" "$@" >>"$LOG" 2>&1
    local rc=$?
    SUMMARY+=("$name: rc=$rc ($((SECONDS - t0))s)")
    echo "=== [$name] rc=$rc $((SECONDS - t0))s" >>"$LOG"
}

BG=()
bg_step() {  # bg_step NAME SECONDS COMMAND...: like step, but in the background (GPU test groups that share the GPUs);
             # its output goes to $RES/bg_<n>.log (in the part's archive), its status to the summary at bg_wait
    local name=$1 secs=$2 n=${#BG[@]}; shift 2
    echo "=== [$name] (background, limit ${secs}s, at $((SECONDS - T0))s, log bg_$n.log): $*" >>"$LOG"
    ( t0=$SECONDS; timeout -k 10 "$secs" "$@" >"$RES/bg_$n.log" 2>&1; echo "$name: rc=$? ($((SECONDS - t0))s)" \
        >"$RES/bg_$n.rc" ) &
    BG+=("$!")
}

bg_wait() {  # wait for every bg_step, then put their statuses and the tails of their logs in the summary and the log
    local n
    wait "${BG[@]}" 2>/dev/null
    for n in "${!BG[@]}"; do
        SUMMARY+=("$(cat "$RES/bg_$n.rc" 2>/dev/null || echo "background step $n: no status")")
        { echo "=== bg_$n.log (tail)"; tail -25 "$RES/bg_$n.log"; } >>"$LOG" 2>/dev/null
    done
    BG=()
}

keep() {  # keep FROM TO: rename a result (and its PNG) to its name in benchmarks/results/
    local from=${1%.json} to=${2%.json}
    [ -f "$RES/$from.json" ] && mv "$RES/$from.json" "$RES/$to.json"
    [ -f "$RES/$from.png" ] && mv "$RES/$from.png" "$RES/$to.png"
    return 0
}

# ---------------------------------------------------------------------- the parts
part_tests() {   # the comm tests (15 launches side by side, <= 240 s on 4 x H100: tests/comm/_gpu_jobs.py, each
                 # launch's output under $OUT/commtests_jobs); the families' tests are part tests2
    step "mpiml info ($R ranks)" 20 $MPIRUN -n "$R" python3 -m mpiml info
    step "GPU comm tests (1-4 ranks; every backend; graphs; timeouts; virtual nodes)" 260 \
        env MPIML_TEST_JOBS_DIR="$OUT/commtests_jobs" $PYTEST --timeout=240 tests/comm
    step "GPU tests of the neighbours, the loader and the init (1-4 ranks)" 200 $PYTEST --timeout=190 \
        tests/neighbors tests/kernels/test_loader.py tests/test_init.py
}

part_tests2() {   # the kernels and k-means (650 tests; ~300 s on one H100)
    step "GPU kernel and k-means tests (1-4 ranks)" 400 $PYTEST --timeout=390 tests/kernels tests/cluster
}

part_tests3() {   # the families' GPU tests, then datasets, validation, model files and the rest
    step "GPU tests of the linear models, decomposition, forests" 270 $PYTEST --timeout=260 tests/linear_model \
        tests/decomposition tests/ensemble
    step "GPU tests of datasets, validation, model files, the rest" 200 $PYTEST --timeout=190 tests --ignore=tests/comm \
        --ignore=tests/kernels --ignore=tests/cluster --ignore=tests/dask --ignore=tests/neighbors \
        --ignore=tests/linear_model --ignore=tests/decomposition --ignore=tests/ensemble
}

part_comm() {
    step "mpiml info ($R ranks)" 30 $MPIRUN -n "$R" python3 -m mpiml info
    step "collectives, $R ranks (mpi, nccl, ipc; graphs)" 70 $MPIRUN -n "$R" python3 tests/comm/gpu_collectives.py \
        mpi,nccl,ipc --graph
    step "collectives, 3 ranks (nccl, ipc)" 30 $MPIRUN -n 3 python3 tests/comm/gpu_collectives.py nccl,ipc --graph
    step "peer stall (ipc, $R ranks)" 25 env MPIML_TIMEOUT=3 $MPIRUN -x MPIML_TIMEOUT -n "$R" \
        python3 tests/comm/gpu_timeout.py ipc stall
    step "peer killed (nccl, $R ranks)" 25 env MPIML_TIMEOUT=3 OMPI_MCA_orte_allowed_exit_without_sync=1 \
        $MPIRUN -x MPIML_TIMEOUT -n "$R" python3 tests/comm/gpu_timeout.py nccl kill
    export MPIML_TUNING_FILE="$RES/comm_tuning_$MACHINE.json"
    local sweep="--ops allreduce,bcast,allgather,reduce --min-bytes 4 --max-bytes 256MiB --step 8 --rounds 3 \
--target-ms 3 --quiet --series nccl/*,ipc/*,mpi/native"
    step "mpiml tune --device gpu ($R ranks)" 75 $MPIRUN -x MPIML_TUNING_FILE -n "$R" python3 -m mpiml tune \
        --device gpu $sweep
    step "mpiml bench comm --device gpu ($R ranks)" 75 $MPIRUN -x MPIML_TUNING_FILE -n "$R" python3 -m mpiml bench \
        comm --device gpu $sweep --json "$RES/comm_gpu_$MACHINE.json" --plot "$RES/comm_gpu_$MACHINE.png"
    unset MPIML_TUNING_FILE
    step "vs_nccl.py: raw NCCL vs mpiml's paths, eager and graph ($R ranks)" 120 $MPIRUN -n "$R" \
        python3 benchmarks/gpu/vs_nccl.py --rounds 3 --out "$RES/vs_nccl_$MACHINE.json" --plot "$RES/vs_nccl_$MACHINE.png"
    step "bench_gpu.py --quick ($R ranks)" 80 $MPIRUN -n "$R" python3 benchmarks/gpu/bench_gpu.py --quick \
        --out "$RES/gpu_bench_$MACHINE.json"
    step "staged MPI for device buffers (2 ranks)" 80 $MPIRUN -n 2 python3 benchmarks/gpu/staged_mpi.py \
        --out "$RES/staged_mpi_$MACHINE.json" --budget 60
    step "targets report" 20 python3 benchmarks/gpu/report.py "$RES" "$RES/gpu_bench_$MACHINE.json"
}

part_kmeans() {   # most important first: the budget skips what does not fit (the shapes took ~250 s on 4 x H200)
    step "whole fit 4e7 x 64, k=64, k-means|| (GPUs $RANKS; scikit-learn on the host cores)" 150 python3 -m mpiml \
        bench ml --algo kmeans --device gpu --ranks "$RANKS" --no-heat --shapes 4e7x64x64 --fit-init "k-means||" \
        --out "$RES" --tag "fit_$MACHINE"
    keep "ml_kmeans_fit_$MACHINE" "kmeans_fit_$MACHINE"
    step "the four benchmark shapes (GPUs $RANKS; plain CuPy and scikit-learn)" 270 python3 -m mpiml bench ml \
        --algo kmeans --device gpu --ranks "$RANKS" --no-heat --shapes 1e7x64x64,1e7x16x16,1e6x256x1024,2e6x1024x64 \
        --out "$RES" --tag "shapes_$MACHINE"
    keep "ml_kmeans_shapes_$MACHINE" "kmeans_shapes_$MACHINE"
    step "kernel benchmark (one GPU)" 150 python3 benchmarks/ml/kernels_bench.py "$RES/kernels" --quick --all-shapes
    [ -f "$RES/kernels/kernels_bench.json" ] && mv "$RES/kernels/kernels_bench.json" "$RES/kernels_1x${MODEL:-gpu}.json"
    [ -f "$RES/kernels/kernels_bench.png" ] && mv "$RES/kernels/kernels_bench.png" "$RES/kernels_1x${MODEL:-gpu}.png"
    rmdir "$RES/kernels" 2>/dev/null
    step "strong and weak scaling (GPUs $RANKS; scikit-learn, Heat when it imports)" 150 python3 -m mpiml bench ml \
        --algo kmeans --device gpu --ranks "$RANKS" --out "$RES" --tag "scaling_$MACHINE"
    keep "ml_kmeans_scaling_$MACHINE" "kmeans_scaling_$MACHINE"
}

part_knn() {
    step "k-nearest neighbours against the peers and scaling (GPUs $RANKS)" 240 python3 -m mpiml bench ml --algo knn \
        --device gpu --ranks "$RANKS" --out "$RES" --tag "$MACHINE"
    keep "ml_knn_$MACHINE" "knn_$MACHINE"
    step "sparse k-means and neighbours, 10^6 x 10^6 (1 rank)" 200 $MPIRUN -n 1 python3 benchmarks/sparse/sparse_gpu.py \
        --out "$RES/sparse_one_rank.json"
    step "sparse, 2 ranks (scale 0.1)" 60 $MPIRUN -n 2 python3 benchmarks/sparse/sparse_gpu.py --scale 0.1 \
        --out "$RES/sparse_two_ranks.json"
    step "sparse: both runs as keys of one result file" 20 python3 benchmarks/fold.py "$RES/sparse_$MACHINE.json" \
        one_rank="$RES/sparse_one_rank.json" two_ranks="$RES/sparse_two_ranks.json" --replace \
        --what "sparse k-means and neighbours at 1 rank (10^6 x 10^6) and 2 ranks (scale 0.1)"
    [ -f "$RES/sparse_one_rank.png" ] && mv "$RES/sparse_one_rank.png" "$RES/sparse_$MACHINE.png"
    rm -f "$RES"/sparse_one_rank.* "$RES"/sparse_two_ranks.*
}

spmd_fits() {  # spmd_fits ALGO...: mpiml.bench.ml_decomp at its defaults (mpiml, plain CuPy, scikit-learn, floor)
    local algo n                            # on the same global data at FIT_RANKS (default 1, 2, 4) ranks,
    for algo in "$@"; do                    # FIT_SECS (default 120) each
        for n in ${FIT_RANKS:-${RANKS//,/ }}; do
            step "$algo at the defaults, $n rank(s) (plain CuPy, scikit-learn scaled, floor)" "${FIT_SECS:-120}" \
                $MPIRUN -n "$n" \
                python3 -m mpiml.bench.ml_decomp --algo "$algo" --json "$RES/${algo}_n${n}_$MACHINE.json"
        done
    done
}

part_linear() {   # the GPU tests of the one-pass path are in part tests (tests/linear_model/test_gpu_fused.py)
    spmd_fits linreg ridge logreg
}

part_pca() {
    spmd_fits pca tsvd
}

part_linear_scale() {   # the one-GPU runs at scale that README.md cites
    step "LinearRegression 1e8 x 64 float64 (1 GPU; scikit-learn on 1e6 rows, scaled)" 150 python3 -m mpiml bench ml \
        --algo linreg --device gpu --ranks 1 --rows 1e8 --repeats 3 --sklearn-rows 1e6 --out "$RES" --tag "$MACHINE"
    keep "ml_linreg_$MACHINE" "linreg_$MACHINE"
    step "LogisticRegression 1e7 x 128 (1 GPU; scikit-learn on 1e6 rows)" 150 python3 -m mpiml bench ml --algo logreg \
        --device gpu --ranks 1 --rows 1e7 --repeats 2 --sklearn-rows 1e6 --out "$RES" --tag "$MACHINE"
    keep "ml_logreg_$MACHINE" "logreg_$MACHINE"
    step "sparse Ridge, CSR 1e6 x 1e5, 1e8 values (1 GPU)" 100 python3 -m mpiml.bench.ml_linear --algo ridge \
        --device gpu --ranks 1 --sparse 0.001 --rows 1e6 --features 100000 --dtype float32 --sklearn-rows 2e5 \
        --out "$RES" --tag "$MACHINE"
    keep "ml_ridge_sparse_$MACHINE" "ridge_sparse_$MACHINE"
}

part_forest() {   # the multi-GPU run first (the target is on 4 GPUs), then the one-GPU runs the docs cite
    step "random forests at the defaults (GPUs $RANKS)" 200 python3 -m mpiml bench ml --algo rf --device gpu \
        --ranks "$RANKS" --out "$RES" --tag "ranks_$MACHINE"
    keep "ml_rf_ranks_$MACHINE" "rf_ranks_$MACHINE"
    step "random forest 1e7 x 32, 100 trees, depth 12 (1 GPU)" 200 python3 -m mpiml bench ml --algo rf --device gpu \
        --ranks 1 --rows 1e7 --trees 100 --depth 12 --sklearn-rows 1e5 --training global,local --out "$RES" \
        --tag "1e7_$MACHINE"
    keep "ml_rf_1e7_$MACHINE" "rf_$MACHINE"
    step "random forest 1e6 x 32, 20 trees, depth 10 (1 GPU)" 150 python3 -m mpiml bench ml --algo rf --device gpu \
        --ranks 1 --rows 1e6 --trees 20 --depth 10 --sklearn-rows 2e5 --out "$RES" --tag "1e6_$MACHINE"
    keep "ml_rf_1e6_$MACHINE" "rf_1e6_$MACHINE"
}

part_pca_scale() {   # the one-GPU runs at scale that README.md and docs/decomposition.md cite
    step "PCA 1e7 x 512 -> 32 components (1 GPU)" 90 python3 -m mpiml run pca --np 1 --device gpu --dtype float32 \
        --data lowrank:n=10000000,d=512,rank=32 --components 32 --json "$RES/pca_1e7_$MACHINE.json"
    step "PCA 1e6 x 512 -> 32 components (1 GPU) with scikit-learn on the host cores" 90 python3 -m mpiml run pca \
        --np 1 --device gpu --dtype float32 --data lowrank:n=1000000,d=512,rank=32 --components 32 --compare-sklearn \
        --json "$RES/pca_$MACHINE.json"
    step "sparse TruncatedSVD, CSR 1e6 x 1e5, 1e8 values (1 GPU)" 100 python3 -m mpiml.bench.ml_linear --algo tsvd \
        --components 16 --device gpu --ranks 1 --sparse 0.001 --rows 1e6 --features 100000 --dtype float32 \
        --sklearn-rows 2e5 --out "$RES" --tag "$MACHINE"
    keep "ml_tsvd_sparse_$MACHINE" "tsvd_sparse_$MACHINE"
}

part_firstfit() {
    step "first fit on a fresh machine (compilation included; mpiml run kmeans on $R ranks)" 300 python3 \
        benchmarks/gpu/first_fit.py --out "$RES/firstfit_$MACHINE.json" --np "$R"
}

part_dask() {
    python3 -c "import distributed" 2>/dev/null || { SUMMARY+=("dask: distributed does not import (carry its wheels \
in .whl/)"); return; }
    step "Dask comm and estimator tests (CuPy frames staged and by CUDA IPC)" 150 python3 -m pytest -q \
        -p no:cacheprovider --timeout=140 -o addopts= tests/dask/test_comm.py tests/dask/test_estimators.py
    step "Dask comm sweep, CuPy payloads, mpi:// vs tcp:// (2 ranks)" 60 $MPIRUN -n 2 python3 \
        benchmarks/dask/bench_comm.py --device gpu --iters 30 --budget 67108864 --out "$RES/dask_gpu_comm_$MACHINE.json"
    for p in mpi tcp; do
        step "Dask CuPy (x + x.T).sum() over $p://, 2 workers" 90 $MPIRUN -n 4 python3 benchmarks/dask/gpu_rank.py \
            --protocol $p benchmarks/dask/bench_apps.py --device gpu -n 8000 --chunk 2000 --repeat 5 \
            --layouts scheduler,rows --out "$RES/dask_gpu_apps_${p}_$MACHINE.json"
    done
    step "Dask KMeans on CuPy chunks = the SPMD KMeans (2 workers)" 120 $MPIRUN -n 4 python3 \
        benchmarks/dask/gpu_rank.py --protocol mpi tests/dask/_estimator_app.py "$RES/dask_gpu_kmeans_$MACHINE.json" cupy
}

part_seeds() {   # the five documents (benchmarks/seeds/README.md) at the host's GPU count: ~4 min, at most 340 s
                 # (with part seeds_ranks at most 530 s: one call); the unmeasured first (000, 001), the cells measured
                 # before (004, 002, 003 on 4 x H100) next, 000's HPO last (it only takes what time is left)
    local BUDGET=$(( BUDGET < 340 ? BUDGET : 340 ))
    seed000_at "$R" 80 30
    step "seed 001: Dask mpi:// vs tcp:// (CuPy frames, GPUs 0-1); (x + x.T).sum(), x.sum() on workers $RANKS" 120 \
        python3 benchmarks/seeds/seed001_dask.py --device gpu --workers "$RANKS" --mpiexec "$MPIRUN" -n 8000 \
        --chunk 2000 --repeat 3 --max-bytes 16777216 --timeout 40 --json "$RES/seed001_$MACHINE.json" \
        --plot "$RES/seed001_$MACHINE.png"
    seeds_at "$R" 45 60 40
    step "seed 000 HPO: Hyperband over KMeans, Higgs-shaped 1.1e7 x 28, one Dask worker per GPU ($R), SPMD refit" 90 \
        $MPIRUN -n $((R + 2)) python3 benchmarks/dask/gpu_rank.py --protocol mpi benchmarks/dask/hpo_higgs.py \
        --device gpu --n-samples 11000000 --out "$RES/seed000_hpo_n${R}_$MACHINE.json"
}

part_seeds_ranks() {   # 000 on 1 GPU (fit times: no collective to compare) and the 2-GPU column of 000, 004, 003,
                       # 002 (~2.5 min, at most 190 s; 001 covers its worker counts itself; 002-004 have nothing to
                       # measure on one GPU)
    local BUDGET=$(( BUDGET < 190 ? BUDGET : 190 )) tag="n2_$MACHINE"
    [ "$R" -gt 2 ] && seed000_at 2 50 25
    seed000_at 1 50
    [ "$R" -le 2 ] && return 0
    step "seed 004: reduction designs by size vs the cost model; the device path vs MPI's own (2 GPUs)" 35 \
        $MPIRUN -n 2 python3 benchmarks/seeds/seed004_reductions.py --device gpu --rounds 3 \
        --json "$RES/seed004_$tag.json" --plot "$RES/seed004_$tag.png"
    step "seed 003: k-NN ring blocking / overlap / onesided on KDD shapes (2 GPUs)" 35 $MPIRUN -n 2 python3 \
        benchmarks/seeds/seed003_knn.py --device gpu --json "$RES/seed003_$tag.json" --plot "$RES/seed003_$tag.png"
    step "seed 002: bcast 4 B-256 MiB, IPC / pipelined vs raw NCCL; all-to-all; AlexNet, VGG-16 streaming (2 GPUs)" 50 \
        $MPIRUN -n 2 python3 benchmarks/seeds/seed002_bcast.py --device gpu --json "$RES/seed002_$tag.json" \
        --plot "$RES/seed002_$tag.png"
}

seed000_at() {   # seed000_at N LIMIT [LIMIT]: 000's Figs. 10/11 on N GPUs, then Fig. 1 (given a limit and N > 1)
    local n=$1 tag="n${1}_$MACHINE"
    step "seed 000 Figs. 10/11: KMeans, NearestNeighbors, LinearRegression, TruncatedSVD, forest; auto vs every \
collective on NCCL ($n GPU(s); on 1: fit times only)" "$2" $MPIRUN -n "$n" python3 benchmarks/seeds/seed000_estimators.py \
        --device gpu --json "$RES/seed000_$tag.json" --plot "$RES/seed000_$tag.png"
    [ $# -ge 3 ] && [ "$n" -gt 1 ] || return 0
    step "seed 000 Fig. 1: allreduce / reduce / bcast 4 B-16 KiB vs raw NCCL ($n GPUs)" "$3" $MPIRUN -n "$n" python3 \
        benchmarks/gpu/vs_nccl.py --sizes 4,16,64,256,1024,4096,16384 --ops allreduce,reduce,bcast --modes eager \
        --rounds 2 --out "$RES/seed000_fig1_$tag.json"
}

seeds_at() {   # seeds_at N LIMIT LIMIT LIMIT: 004, 002, 003 on N GPUs
    local n=$1 tag="n${1}_$MACHINE"
    step "seed 004: reduction designs by size vs the cost model; the device path vs MPI's own ($n GPUs)" "$2" \
        $MPIRUN -n "$n" python3 benchmarks/seeds/seed004_reductions.py --device gpu --rounds 3 \
        --json "$RES/seed004_$tag.json" --plot "$RES/seed004_$tag.png"
    step "seed 002: bcast 4 B-256 MiB, IPC / pipelined / two-level vs raw NCCL; all-to-all; AlexNet, VGG-16 \
streaming ($n GPUs)" "$3" $MPIRUN -n "$n" python3 benchmarks/seeds/seed002_bcast.py --device gpu \
        --json "$RES/seed002_$tag.json" --plot "$RES/seed002_$tag.png"
    step "seed 003: k-NN ring blocking / overlap / onesided on KDD shapes ($n GPUs)" "$4" $MPIRUN -n "$n" python3 \
        benchmarks/seeds/seed003_knn.py --device gpu --json "$RES/seed003_$tag.json" --plot "$RES/seed003_$tag.png"
}

part_wave() {   # the headline of each performance target in one call (~590 s on 4 GPUs), most important first
    step "k-NN: mpiml vs the PyTorch user, CuPy, scikit-learn, floor (1 GPU); ring vs local at GPUs $RANKS" 230 \
        python3 -m mpiml bench ml --algo knn --device gpu --ranks "$RANKS" --out "$RES" --tag "$MACHINE"
    keep "ml_knn_$MACHINE" "knn_$MACHINE"
    FIT_RANKS="1 $R" FIT_SECS=60 spmd_fits linreg logreg
    step "RandomForestClassifier 100 trees depth 12 (GPUs 1,$R)" 150 python3 -m mpiml bench ml --algo rf --device gpu \
        --ranks "1,$R" --estimators classifier --out "$RES/rf_ranks_$MACHINE.json"
    step "vs_nccl.py: every op, default and MPIML_CHECK=0 beside raw NCCL ($R ranks)" 100 $MPIRUN -n "$R" \
        python3 benchmarks/gpu/vs_nccl.py --rounds 2 --max-bytes 67108864 --paths raw,auto,auto0 \
        --out "$RES/vs_nccl_$MACHINE.json" --plot "$RES/vs_nccl_$MACHINE.png"
}

part_wave2() {   # the first fit on a fresh machine, then PCA and Ridge on every GPU (~300 s)
    step "first fit on a fresh machine (compilation included; mpiml run kmeans on $R ranks)" 200 python3 \
        benchmarks/gpu/first_fit.py --out "$RES/firstfit_$MACHINE.json" --np "$R"
    step "PCA 1e7 x 512 -> 32 at the defaults, $R GPUs" 50 $MPIRUN -n "$R" python3 -m mpiml.bench.ml_decomp \
        --algo pca --json "$RES/pca_n${R}_$MACHINE.json"
    step "Ridge 4e7 x 64 at the defaults, $R GPUs" 50 $MPIRUN -n "$R" python3 -m mpiml.bench.ml_decomp \
        --algo ridge --json "$RES/ridge_n${R}_$MACHINE.json"
}

part_wave3_one() {   # one GPU: every family's GPU tests, the new scikit-learn parameters on CuPy, the CuPy warm-up test
    step "GPU tests of the linear models, decomposition, forests" 200 $PYTEST --timeout=190 tests/linear_model \
        tests/decomposition tests/ensemble
    step "the new scikit-learn parameters of the linear models and PCA on CuPy" 100 python3 -m pytest -v \
        -p no:cacheprovider -o addopts= --timeout=90 tests/linear_model/test_gpu_suite_params.py \
        "tests/decomposition/test_gpu_decomposition.py::test_pca_arpack_many_components_cupyx_sparse_equals_dense"
    step "a recorded CuPy manifest replayed into an empty CuPy cache leaves nothing to compile" 100 python3 -m pytest \
        -v -p no:cacheprovider -o addopts= --timeout=90 tests/kernels/test_cupy_warm.py
    step "LinearRegression / LogisticRegression: where one GPU fit's time goes" 60 sh -c \
        "python3 scripts/profile_fit.py linreg --kernels --top 25; python3 scripts/profile_fit.py logreg --kernels --top 25"
}

part_wave3() {   # all GPUs: the linear models at 1 and all GPUs, the new collectives (correctness, then vs NCCL),
                 # the CuPy kernels' manifest and the first fit, the k-NN ring over device-direct point-to-point
    FIT_RANKS="1 $R" FIT_SECS=60 spmd_fits linreg logreg ridge
    step "every collective x dtype x size on ipc and nccl, every IPC algorithm, graphs ($R ranks)" 150 $MPIRUN -n "$R" \
        python3 tests/comm/gpu_collectives.py ipc,nccl --graph
    step "device-direct isendrecv rings ($R ranks)" 60 $MPIRUN -n "$R" python3 tests/comm/gpu_sendrecv.py
    step "vs_nccl.py: every op, default and MPIML_CHECK=0 beside raw NCCL ($R ranks)" 120 $MPIRUN -n "$R" \
        python3 benchmarks/gpu/vs_nccl.py --rounds 2 --max-bytes 67108864 --out "$RES/vs_nccl_$MACHINE.json" \
        --plot "$RES/vs_nccl_$MACHINE.png"
    step "record the CuPy kernels the estimators and mpiml run compile" 170 python3 -m mpiml.cli._cupy_record \
        --out "$RES/cupy_kernels.json.gz" --jobs 17 --timeout 150
    [ -f "$RES/cupy_kernels.json.gz" ] && cp "$RES/cupy_kernels.json.gz" src/mpiml/kernels/cupy_kernels.json.gz
    step "first fit from empty caches with the warm-up on; mpiexec -n $R mpiml run kmeans" 200 python3 \
        benchmarks/gpu/first_fit.py --out "$RES/firstfit_$MACHINE.json" --states cold --np "$R"
    step "k-NN ring vs local at GPUs $RANKS (device-direct ring)" 150 python3 -m mpiml bench ml --algo knn --device gpu \
        --part scaling --ranks "$RANKS" --repeats 2 --out "$RES" --tag "scaling_$MACHINE"
}

part_wave4() {   # what the wave still has to measure: k-NN at d = 960, the forest regressor on 1 and all GPUs,
                 # the first fit with init waiting for its CuPy kernels, CPU ranks 1 -> 8 on the host's cores
    step "k-NN d = 960 against the PyTorch user (1 GPU)" 150 python3 -m mpiml bench ml --algo knn --device gpu \
        --part peers --cases 960:float32:10 --ranks 1 --out "$RES" --tag "d960_$MACHINE"
    step "RandomForestRegressor 100 trees depth 12 (GPUs 1,$R)" 150 python3 -m mpiml bench ml --algo rf --device gpu \
        --ranks "1,$R" --estimators regressor --out "$RES/rf_regressor_ranks_$MACHINE.json"
    step "first fit, mpiml.init waiting for the fit's CuPy kernels (cold_wait)" 200 python3 benchmarks/gpu/first_fit.py \
        --out "$RES/firstfit_wait_$MACHINE.json" --states cold_wait --np "$R"
    step "CPU ranks 1 -> 8 of cores/8 threads: KMeans, forest, k-NN vs scikit-learn(-intelex)" 300 env -u OMP_NUM_THREADS \
        python3 -m mpiml bench ml --device cpu --estimators kmeans,rf,knn --ranks 1,8 \
        --threads-per-rank "$(( $(getconf _NPROCESSORS_ONLN) / 8 ))" --rows 2e6 --features 32 --k 16 --iters 20 --rf-rows 2e5 --trees 32 \
        --max-depth 0 --knn-rows 2e5 --queries 20000 --neighbors 10 --repeat 2 --out "$RES" --tag "64core_$MACHINE"
}

part_wave5() {   # every op against raw NCCL at the defaults users get, the forest regressor on 1 and all GPUs, CPU ranks
                 # 1 -> 8 of 8 threads on the host's cores, then 1 and 2 ranks on 2 cores (taskset) with the peers
    step "vs_nccl.py: every op, default and MPIML_CHECK=0 beside raw NCCL ($R ranks)" 100 $MPIRUN -n "$R" \
        python3 benchmarks/gpu/vs_nccl.py --rounds 2 --max-bytes 67108864 --paths raw,auto,auto0 \
        --out "$RES/vs_nccl_$MACHINE.json" --plot "$RES/vs_nccl_$MACHINE.png"
    step "RandomForestRegressor 100 trees depth 12 (GPUs 1,$R)" 150 python3 -m mpiml bench ml --algo rf --device gpu \
        --ranks "1,$R" --estimators regressor --out "$RES/rf_regressor_ranks_$MACHINE.json"
    step "CPU ranks 1 -> 8 of cores/8 threads: KMeans, forest, k-NN vs scikit-learn(-intelex)" 240 env -u OMP_NUM_THREADS \
        python3 -m mpiml bench ml --device cpu --estimators kmeans,rf,knn --ranks 1,8 \
        --threads-per-rank "$(( $(getconf _NPROCESSORS_ONLN) / 8 ))" --rows 2e6 --features 32 --k 16 --iters 20 --rf-rows 2e5 --trees 32 \
        --max-depth 0 --knn-rows 2e5 --queries 20000 --neighbors 10 --repeat 1 --out "$RES" --tag "64core_$MACHINE"
    step "CPU, 2 cores (taskset 0,1): every estimator at 1 and 2 ranks vs scikit-learn(-intelex)" 120 env -u OMP_NUM_THREADS \
        taskset -c 0,1 python3 -m mpiml bench ml --device cpu --ranks 1,2 --repeat 2 --out "$RES" --tag "2core_$MACHINE"
}

part_profile() {   # profiles the next optimisations start from (no result file: the log is the product)
    local a n
    for a in linreg logreg; do
        for n in 1 "$R"; do
            step "$a: one fit traced ($n rank(s); Gram variant picked, kernel times)" 60 $MPIRUN -n "$n" python3 \
                scripts/profile_fit.py "$a" --kernels --trace --no-cprofile --top 30
        done
    done
    for hb in 268435456 1073741824; do
        step "RandomForestRegressor 100 trees depth 12 (GPUs 1,$R), MPIML_RF_HIST_BYTES=$hb" 120 env \
            MPIML_RF_HIST_BYTES=$hb python3 -m mpiml bench ml --algo rf --device gpu --ranks "1,$R" \
            --estimators regressor --out "$RES/rf_regressor_hist${hb}_$MACHINE.json"
    done
    step "sparse TruncatedSVD: its products each way and a profiled fit (1 GPU)" 90 python3 benchmarks/sparse/spmm_gpu.py \
        --fits kernels --profile 30 --out "$RES/spmm_gpu_$MACHINE.json"
}

part_check() {
    bg_step "GPU tests of the linear models" 220 $PYTEST --timeout=210 tests/linear_model
    bg_step "GPU tests of decomposition" 220 $PYTEST --timeout=210 tests/decomposition
    bg_step "GPU tests of the forests" 220 $PYTEST --timeout=210 tests/ensemble
    bg_wait
    local M="$MPIRUN -x MPIML_IPC_LL_SLOT_BYTES"
    step "IPC two-shot in LL lines, NCCL watchdog events: exact over dtypes, roots, graphs (4 and 3 ranks)" 60 sh -c \
        "$M -n 4 python3 tests/comm/gpu_variants.py && $M -n 3 python3 tests/comm/gpu_variants.py"
    step "bcast / reduce / allreduce 64 KiB-4 MiB: default, NCCL, two-shot, LL two-shot beside raw NCCL" 60 $M -n "$R" \
        python3 benchmarks/gpu/vs_nccl.py --ops bcast,reduce,allreduce --sizes 65536,262144,1048576,4194304 \
        --paths raw,auto,nccl,ipc/twoshot,ipc/lltwoshot --rounds 2 --no-micro --out "$RES/vs_nccl_lltwoshot_$MACHINE.json"
    step "allreduce 4 B and 1 MiB: host cost a call, first calls of new shapes" 45 $M -n "$R" python3 \
        benchmarks/gpu/vs_nccl.py --ops allreduce --sizes 4,1048576 --paths raw,auto,nccl --rounds 2 --first-calls \
        --out "$RES/vs_nccl_micro_$MACHINE.json"
    FIT_RANKS="1 $R" FIT_SECS=40 spmd_fits linreg ridge logreg
    step "sparse products each way, sparse TruncatedSVD and Ridge fits vs cupyx CG, a profile (1 GPU)" 60 python3 \
        benchmarks/sparse/spmm_gpu.py --fits kernels --profile 30 --out "$RES/spmm_gpu_$MACHINE.json"
    step "sparse TruncatedSVD, CSR 1e6 x 1e5, 1e8 values (1 GPU)" 60 python3 -m mpiml.bench.ml_linear --algo tsvd \
        --components 16 --device gpu --ranks 1 --sparse 0.001 --rows 1e6 --features 100000 --dtype float32 \
        --sklearn-rows 2e5 --out "$RES" --tag "$MACHINE"
    keep "ml_tsvd_sparse_$MACHINE" "tsvd_sparse_$MACHINE"
    step "LinearRegression / LogisticRegression traced at 1 and $R GPUs" 40 sh -c "for n in 1 $R; do $MPIRUN -n \$n \
        python3 scripts/profile_fit.py linreg --kernels --trace --no-cprofile --top 20; $MPIRUN -n \$n python3 \
        scripts/profile_fit.py logreg --kernels --trace --no-cprofile --top 20; done"
}

part_soak() {   # five minutes of random collectives on every GPU, every result checked, memory sampled
    step "soak: random ops, 4 B-64 MiB, dtypes, eager and graphs ($R ranks, 300 s)" 340 $MPIRUN -n "$R" python3 \
        benchmarks/gpu/soak.py --seconds 300 --out "$RES/soak_$MACHINE.json" --plot "$RES/soak_$MACHINE.png"
}

# ---------------------------------------------------------------------- run
for PART in "$@"; do
    if ! declare -F "part_$PART" >/dev/null; then
        echo "scripts/device_pass.sh: unknown part '$PART' (tests tests2 tests3 wave3 wave3_one wave4 wave5 soak comm kmeans knn linear linear_scale forest pca pca_scale firstfit dask seeds seeds_ranks wave wave2 profile check)"
        exit 2
    fi
    LOG="$OUT/device_pass_$PART.log"
    RES=$(mktemp -d)
    SUMMARY=()
    T0=$SECONDS
    { echo "device_pass $PART on $(hostname), $(date -u +%FT%TZ), commit $(cat .git-commit 2>/dev/null || git rev-parse \
--short HEAD 2>/dev/null), machine $MACHINE"
      nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader
      python3 -c "import numpy, scipy, sklearn, cupy, mpi4py; print('numpy', numpy.__version__, 'scipy', \
scipy.__version__, 'sklearn', sklearn.__version__, 'cupy', cupy.__version__, 'mpi4py', mpi4py.__version__)"
    } >>"$LOG" 2>&1
    "part_$PART"
    { echo "=== summary ($PART, $((SECONDS - T0))s, $MACHINE)"; for s in "${SUMMARY[@]}"; do echo "  $s"; done; } \
        | tee -a "$LOG"
    tar -C "$RES" -czf "$OUT/results_$PART.tar.gz" . && rm -rf "$RES"
done
ls -la "$OUT"
