// Small float32 matrix products for the fused v1 vector attention (internal).
//
// The weight MLP's products run on tiles of a few hundred edge rows that stay in L2:
// C (R x N) = or += A (R x K) B (K x N), B and C row-major, A addressed by strides so
// that the same kernel computes A B (A row-major) and X^T Y (A = X^T, for the weight
// gradients, which accumulate). Register blocks of 6 rows x 16 columns: per step of the
// inner dimension, two 8-float loads of B and six broadcasts of A feed twelve fused
// multiply-adds (GCC vector extensions: AVX2 + FMA in the x86-64-v3 clone, SSE pairs in
// the baseline). A remainder of 4-7 columns runs the same blocks on a copy padded to 8
// columns; the last 1-3 columns run a scalar loop.
#pragma once

#include <algorithm>
#include <vector>

#include "../_kernels.h"

#define SF_INLINE inline __attribute__((always_inline))

// The vector helpers are always inlined: no vector crosses a call boundary.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace {

typedef float v8 __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4), may_alias));

SF_INLINE v8 load8(const float* p) { return *reinterpret_cast<const v8u*>(p); }
SF_INLINE void store8(float* p, const v8& v) { *reinterpret_cast<v8u*>(p) = v; }

// Rows [0, RB) x columns [0, 8 NV) of C, from A (element (r, t) at A[r * ars + t * aks]).
template <int RB, int NV>
SF_INLINE void gemm_block(i64 K, const float* A, i64 ars, i64 aks, const float* B, i64 ldb,
                          float* C, i64 ldc, bool acc) {
    v8 c[RB][NV];
#pragma GCC unroll 8
    for (int r = 0; r < RB; ++r)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) c[r][v] = v8{};
    for (i64 t = 0; t < K; ++t) {
        v8 b[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) b[v] = load8(B + t * ldb + 8 * v);
        const float* a = A + t * aks;
#pragma GCC unroll 8
        for (int r = 0; r < RB; ++r) {
            const float x = a[r * ars];
            const v8 ar = {x, x, x, x, x, x, x, x};  // one broadcast load
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) c[r][v] += ar * b[v];
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < RB; ++r)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
            float* o = C + r * ldc + 8 * v;
            store8(o, acc ? load8(o) + c[r][v] : c[r][v]);
        }
}

template <int NV>
SF_INLINE void gemm_panel(i64 R, i64 K, const float* A, i64 ars, i64 aks, const float* B,
                          i64 ldb, float* C, i64 ldc, bool acc) {
    i64 r = 0;
    for (; r + 6 <= R; r += 6) gemm_block<6, NV>(K, A + r * ars, ars, aks, B, ldb, C + r * ldc, ldc, acc);
    const float* Ar = A + r * ars;
    float* Cr = C + r * ldc;
    switch (R - r) {
        case 5: gemm_block<5, NV>(K, Ar, ars, aks, B, ldb, Cr, ldc, acc); break;
        case 4: gemm_block<4, NV>(K, Ar, ars, aks, B, ldb, Cr, ldc, acc); break;
        case 3: gemm_block<3, NV>(K, Ar, ars, aks, B, ldb, Cr, ldc, acc); break;
        case 2: gemm_block<2, NV>(K, Ar, ars, aks, B, ldb, Cr, ldc, acc); break;
        case 1: gemm_block<1, NV>(K, Ar, ars, aks, B, ldb, Cr, ldc, acc); break;
        default: break;
    }
}

// C (R x N) = A B, or += when acc; A(r, t) = A[r * ars + t * aks], B (K x N) row-major with
// leading dimension ldb, C with ldc.
SF_INLINE void gemm(i64 R, i64 K, i64 N, const float* A, i64 ars, i64 aks, const float* B,
                    i64 ldb, float* C, i64 ldc, bool acc) {
    i64 j = 0;
    for (; j + 16 <= N; j += 16) gemm_panel<2>(R, K, A, ars, aks, B + j, ldb, C + j, ldc, acc);
    for (; j + 8 <= N; j += 8) gemm_panel<1>(R, K, A, ars, aks, B + j, ldb, C + j, ldc, acc);
    if (N - j >= 4) {  // 4-7 columns: B's and C's padded to 8 (G = 4 in PTv1's first stage)
        const i64 w = N - j;
        std::vector<float> Bp(K * 8, 0.0f), Cp(R * 8, 0.0f);
        for (i64 t = 0; t < K; ++t)
            for (i64 q = 0; q < w; ++q) Bp[t * 8 + q] = B[t * ldb + j + q];
        if (acc)
            for (i64 r = 0; r < R; ++r)
                for (i64 q = 0; q < w; ++q) Cp[r * 8 + q] = C[r * ldc + j + q];
        gemm_panel<1>(R, K, A, ars, aks, Bp.data(), 8, Cp.data(), 8, acc);
        for (i64 r = 0; r < R; ++r)
            for (i64 q = 0; q < w; ++q) C[r * ldc + j + q] = Cp[r * 8 + q];
        j = N;
    }
    for (; j < N; ++j)
        for (i64 r = 0; r < R; ++r) {
            float s = 0.0f;
            for (i64 t = 0; t < K; ++t) s += A[r * ars + t * aks] * B[t * ldb + j];
            C[r * ldc + j] = acc ? C[r * ldc + j] + s : s;
        }
}

// C (R x N) = A (R x K) B (K x N), all row-major and dense.
SF_INLINE void matmul(i64 R, i64 K, i64 N, const float* A, const float* B, float* C) {
    gemm(R, K, N, A, K, 1, B, N, C, N, false);
}

// G (K x N) += X^T Y for X (R x K), Y (R x N), all row-major and dense. The rows go in
// blocks of 64, so that X's block and a 16-column panel of Y stay in L1 across G's row
// blocks (64 K-wide rows of X are 16 KB at K = 64; blocks of 128 ran about 15 % slower).
SF_INLINE void matmul_tn_acc(i64 R, i64 K, i64 N, const float* X, const float* Y, float* G) {
    for (i64 r = 0; r < R; r += 64)
        gemm(K, std::min<i64>(64, R - r), N, X + r * K, 1, K, Y + r * N, N, G, N, true);
}

}  // namespace
