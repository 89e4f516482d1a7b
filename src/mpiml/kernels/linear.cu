// One-pass reductions of the linear models (mpiml.linear_model): each kernel reads X once.
//
// mpiml_linear_gram<T, W>: partial augmented Gram matrices.  Row i of the virtual matrix Z is
// [x_i (d values), y_i (t values), 1], padded with zeros to kp = 4 * nt columns; the kernel sums
// (w_i) z_i z_iᵀ over the rows, so one k x k matrix (k = d + t + 1) holds XᵀWX, XᵀWY, YᵀWY, the
// weighted column sums of X and Y and the weight total.  Every product of two float32 values is
// exact in double and every sum is a double: the result is the float64 Gram of the data, whatever
// T is.  A block owns a contiguous range of rows, staged STAGE rows at a time in shared memory
// (converted to double once); thread j < ntiles owns the 4 x 4 tile (a, b), a <= b, of the upper
// triangle of tiles, in registers.  Block g writes its tiles to partial[g * kp * kp ...]; entries
// of tiles below the diagonal are not written (the caller reads the upper triangle).
//
// mpiml_linear_logistic<T, MODE, CPL>: one pass of the binary logistic objective.  A warp takes a
// row at a time (lane l holds columns l, l + 32, ... : CPL of them), forms the margin
// m = x·coef + b by a warp reduction, then
//   MODE 0:  loss += sw·(softplus(m) - y m),  g = sw·(expit(m) - y),  grad += g x,  gsum += g;
//   MODE 1:  u = x·vec + vb,  q = sw·p(1 - p)·u  (p = expit(m)),  grad += q x,  gsum += q
// (the Hessian-vector product at coef).  Block g writes [loss, gsum, grad (d)] to
// partial[g * (d + 2) ...].
//
// mpiml_linear_sum_blocks: out[j] = Σ_g partial[g * m + j] in block order (deterministic).

#define MPIML_LINEAR_STAGE 32
#define MPIML_LINEAR_LOGISTIC_THREADS 256

template <typename T, bool W>
__global__ void __launch_bounds__(512)
mpiml_linear_gram(const T* __restrict__ X, const long long n, const int d, const T* __restrict__ Y, const int t,
                  const T* __restrict__ w, const long long rows_per_block, const int kp, const int ntiles,
                  double* __restrict__ partial) {
    extern __shared__ double zs[];                  // MPIML_LINEAR_STAGE x kp, then MPIML_LINEAR_STAGE weights
    double* ws = zs + MPIML_LINEAR_STAGE * kp;
    const int tid = threadIdx.x;
    const int nt = kp / 4;
    const int extra = kp - d;                       // y columns, the ones column, the padding
    const bool active = tid < ntiles;
    int a = 0, b = 0;
    if (active) {                                   // tid -> (a, b): row a of the tile triangle holds nt - a tiles
        int rem = tid;
        while (rem >= nt - a) {
            rem -= nt - a;
            ++a;
        }
        b = a + rem;
    }
    double acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0;

    const long long r0 = (long long)blockIdx.x * rows_per_block;
    const long long r1 = min(n, r0 + rows_per_block);
    for (long long s = r0; s < r1; s += MPIML_LINEAR_STAGE) {
        const int m = (int)min((long long)MPIML_LINEAR_STAGE, r1 - s);
        __syncthreads();                            // the previous stage is consumed
        const T* xs = X + s * d;                    // m * d contiguous values
        for (int e = tid; e < MPIML_LINEAR_STAGE * d; e += blockDim.x) {
            const int r = e / d;
            zs[r * kp + (e - r * d)] = (r < m) ? (double)xs[e] : 0.0;
        }
        for (int e = tid; e < MPIML_LINEAR_STAGE * extra; e += blockDim.x) {
            const int r = e / extra;
            const int c = e - r * extra;            // column d + c of Z
            double v = 0.0;
            if (r < m) {
                if (c < t) v = (double)Y[(s + r) * t + c];
                else if (c == t) v = 1.0;
            }
            zs[r * kp + d + c] = v;
        }
        if (W) {
            for (int e = tid; e < MPIML_LINEAR_STAGE; e += blockDim.x) ws[e] = (e < m) ? (double)w[s + e] : 0.0;
        }
        __syncthreads();
        if (active) {
            for (int r = 0; r < m; ++r) {
                const double2* za2 = reinterpret_cast<const double2*>(zs + r * kp + 4 * a);
                const double2* zb2 = reinterpret_cast<const double2*>(zs + r * kp + 4 * b);
                const double2 p0 = za2[0], p1 = za2[1], q0 = zb2[0], q1 = zb2[1];
                double za[4] = {p0.x, p0.y, p1.x, p1.y};
                const double zb[4] = {q0.x, q0.y, q1.x, q1.y};
                if (W) {
                    const double wr = ws[r];
#pragma unroll
                    for (int i = 0; i < 4; ++i) za[i] *= wr;
                }
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int j = 0; j < 4; ++j) acc[i][j] = fma(za[i], zb[j], acc[i][j]);
            }
        }
    }
    if (active) {
        double* out = partial + (long long)blockIdx.x * kp * kp;
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) out[(4 * a + i) * kp + 4 * b + j] = acc[i][j];
    }
}

__device__ __forceinline__ double mpiml_linear_warp_sum(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ double mpiml_linear_softplus(double m) {   // log(1 + exp(m)), overflow-safe
    return m > 0.0 ? m + log1p(exp(-m)) : log1p(exp(m));
}

__device__ __forceinline__ double mpiml_linear_expit(double m) {
    if (m >= 0.0) return 1.0 / (1.0 + exp(-m));
    const double e = exp(m);
    return e / (1.0 + e);
}

template <typename T, int MODE, int CPL>
__global__ void __launch_bounds__(MPIML_LINEAR_LOGISTIC_THREADS)
mpiml_linear_logistic(const T* __restrict__ X, const long long n, const int d, const T* __restrict__ y01,
                      const T* __restrict__ sw, const double* __restrict__ coef, const double bias,
                      const double* __restrict__ vec, const double vbias, double* __restrict__ partial) {
    __shared__ double red[MPIML_LINEAR_LOGISTIC_THREADS / 32][2];
    extern __shared__ double gsh[];                 // (threads / 32) x d
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int warps = blockDim.x >> 5;
    double cw[CPL], cv[CPL], g[CPL];
#pragma unroll
    for (int q = 0; q < CPL; ++q) {
        const int c = lane + 32 * q;
        cw[q] = c < d ? coef[c] : 0.0;
        cv[q] = (MODE == 1 && c < d) ? vec[c] : 0.0;
        g[q] = 0.0;
    }
    double loss = 0.0, gsum = 0.0;
    const long long stride = (long long)gridDim.x * warps;
    for (long long i = (long long)blockIdx.x * warps + warp; i < n; i += stride) {
        const T* row = X + i * d;
        double x[CPL];
        double dot = 0.0, dotv = 0.0;
#pragma unroll
        for (int q = 0; q < CPL; ++q) {
            const int c = lane + 32 * q;
            x[q] = c < d ? (double)row[c] : 0.0;
            dot = fma(x[q], cw[q], dot);
            if (MODE == 1) dotv = fma(x[q], cv[q], dotv);
        }
        const double m = mpiml_linear_warp_sum(dot) + bias;
        const double wi = (double)sw[i];
        double coeff;
        if (MODE == 0) {
            const double yi = (double)y01[i];
            coeff = wi * (mpiml_linear_expit(m) - yi);
            if (lane == 0) loss += wi * (mpiml_linear_softplus(m) - yi * m);
        } else {
            const double u = mpiml_linear_warp_sum(dotv) + vbias;
            const double p = mpiml_linear_expit(m);
            coeff = wi * p * (1.0 - p) * u;
        }
        if (lane == 0) gsum += coeff;
#pragma unroll
        for (int q = 0; q < CPL; ++q) g[q] = fma(coeff, x[q], g[q]);
    }
#pragma unroll
    for (int q = 0; q < CPL; ++q) {
        const int c = lane + 32 * q;
        if (c < d) gsh[warp * d + c] = g[q];
    }
    if (lane == 0) {
        red[warp][0] = loss;
        red[warp][1] = gsum;
    }
    __syncthreads();
    double* out = partial + (long long)blockIdx.x * (d + 2);
    for (int j = threadIdx.x; j < d + 2; j += blockDim.x) {
        double s = 0.0;
        for (int v = 0; v < warps; ++v) s += j < 2 ? red[v][j] : gsh[v * d + (j - 2)];
        out[j] = s;
    }
}

__global__ void mpiml_linear_sum_blocks(const double* __restrict__ partial, const int nblocks, const long long m,
                                        double* __restrict__ out) {
    for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < m; j += (long long)gridDim.x * blockDim.x) {
        double s = 0.0;
        for (int g = 0; g < nblocks; ++g) s += partial[(long long)g * m + j];
        out[j] = s;
    }
}
