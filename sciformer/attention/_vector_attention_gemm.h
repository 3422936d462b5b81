// Small float32 matrix products for the fused v1 vector attention (internal).
//
// The weight MLP's products run on tiles of a few hundred edge rows that stay in L2:
// C (R x N) = or += A (R x K) B (K x N), B and C row-major, A addressed by strides so
// that the same kernel computes A B (A row-major) and X^T Y (A = X^T, for the weight
// gradients, which accumulate). Register blocks of 6 rows x NV vectors of B's columns: per
// step of the inner dimension, NV vector loads of B and six broadcasts of A feed 6 NV fused
// multiply-adds (GCC vector extensions). Two block widths:
// - `v8` (8 floats; AVX2 + FMA in the x86-64-v3 clone, SSE pairs in the baseline): 16- and
//   8-column panels; a remainder of 4-7 columns runs on a copy padded to 8 columns, the
//   last 1-3 columns in a scalar loop. Inlined into the caller.
// - `v16` (16 floats, AVX-512) in `gemm_wide`, compiled for x86-64-v4 and called where the
//   CPU has it (`wide_products`) for 64 or more columns: 64-column panels in 24 of the 32
//   vector registers, the rest of the columns by the `v8` blocks. Narrower 16-lane panels
//   lose to the `v8` ones (one load of B per six broadcasts of A).
#pragma once

#include <algorithm>
#include <vector>

#include "../_kernels.h"

#define SF_INLINE inline __attribute__((always_inline))

// The vector helpers are always inlined: no vector crosses a call boundary.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace {

typedef float v8 __attribute__((vector_size(32)));
typedef float v16 __attribute__((vector_size(64)));

template <class V>
constexpr int lanes = sizeof(V) / sizeof(float);

template <class V>
SF_INLINE V load(const float* p) {
    typedef float U __attribute__((vector_size(sizeof(V)), aligned(4), may_alias));
    return *reinterpret_cast<const U*>(p);
}

template <class V>
SF_INLINE void store(float* p, const V& v) {
    typedef float U __attribute__((vector_size(sizeof(V)), aligned(4), may_alias));
    *reinterpret_cast<U*>(p) = v;
}

// Rows [0, RB) x columns [0, W NV) of C (W = lanes of V), from A (element (r, t) at
// A[r * ars + t * aks]).
template <int RB, int NV, class V>
SF_INLINE void gemm_block(i64 K, const float* A, i64 ars, i64 aks, const float* B, i64 ldb,
                          float* C, i64 ldc, bool acc) {
    constexpr int W = lanes<V>;
    V c[RB][NV];
#pragma GCC unroll 8
    for (int r = 0; r < RB; ++r)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) c[r][v] = V{};
    for (i64 t = 0; t < K; ++t) {
        V b[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) b[v] = load<V>(B + t * ldb + W * v);
        const float* a = A + t * aks;
#pragma GCC unroll 8
        for (int r = 0; r < RB; ++r) {
            const float x = a[r * ars];
            V ar;  // x in every lane: one broadcast load
            if constexpr (W == 8)
                ar = V{x, x, x, x, x, x, x, x};
            else
                ar = x * V{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) c[r][v] += ar * b[v];
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < RB; ++r)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
            float* o = C + r * ldc + W * v;
            store<V>(o, acc ? load<V>(o) + c[r][v] : c[r][v]);
        }
}

template <int NV, class V>
SF_INLINE void gemm_panel(i64 R, i64 K, const float* A, i64 ars, i64 aks, const float* B,
                          i64 ldb, float* C, i64 ldc, bool acc) {
    i64 r = 0;
    for (; r + 6 <= R; r += 6) gemm_block<6, NV, V>(K, A + r * ars, ars, aks, B, ldb, C + r * ldc, ldc, acc);
    const float* Ar = A + r * ars;
    float* Cr = C + r * ldc;
    switch (R - r) {
        case 5: gemm_block<5, NV, V>(K, Ar, ars, aks, B, ldb, Cr, ldc, acc); break;
        case 4: gemm_block<4, NV, V>(K, Ar, ars, aks, B, ldb, Cr, ldc, acc); break;
        case 3: gemm_block<3, NV, V>(K, Ar, ars, aks, B, ldb, Cr, ldc, acc); break;
        case 2: gemm_block<2, NV, V>(K, Ar, ars, aks, B, ldb, Cr, ldc, acc); break;
        case 1: gemm_block<1, NV, V>(K, Ar, ars, aks, B, ldb, Cr, ldc, acc); break;
        default: break;
    }
}

// C (R x N) = A B, or += when acc, with `v8` blocks; A(r, t) = A[r * ars + t * aks], B (K x N)
// row-major with leading dimension ldb, C with ldc.
SF_INLINE void gemm(i64 R, i64 K, i64 N, const float* A, i64 ars, i64 aks, const float* B,
                    i64 ldb, float* C, i64 ldc, bool acc) {
    i64 j = 0;
    for (; j + 16 <= N; j += 16) gemm_panel<2, v8>(R, K, A, ars, aks, B + j, ldb, C + j, ldc, acc);
    for (; j + 8 <= N; j += 8) gemm_panel<1, v8>(R, K, A, ars, aks, B + j, ldb, C + j, ldc, acc);
    if (N - j >= 4) {  // 4-7 columns: B's and C's padded to 8 (G = 4 in PTv1's first stage)
        const i64 w = N - j;
        std::vector<float> Bp(K * 8, 0.0f), Cp(R * 8, 0.0f);
        for (i64 t = 0; t < K; ++t)
            for (i64 q = 0; q < w; ++q) Bp[t * 8 + q] = B[t * ldb + j + q];
        if (acc)
            for (i64 r = 0; r < R; ++r)
                for (i64 q = 0; q < w; ++q) Cp[r * 8 + q] = C[r * ldc + j + q];
        gemm_panel<1, v8>(R, K, A, ars, aks, Bp.data(), 8, Cp.data(), 8, acc);
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

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SF_WIDE_PRODUCTS 1
// gemm with `v16` blocks on 64-column panels, the rest of the columns by gemm (AVX-512;
// x86-64-v4 CPUs only).
__attribute__((target("arch=x86-64-v4"), noinline)) inline void gemm_wide(
    i64 R, i64 K, i64 N, const float* A, i64 ars, i64 aks, const float* B, i64 ldb, float* C,
    i64 ldc, bool acc) {
    i64 j = 0;
    for (; j + 64 <= N; j += 64) gemm_panel<4, v16>(R, K, A, ars, aks, B + j, ldb, C + j, ldc, acc);
    if (j < N) gemm(R, K, N - j, A, ars, aks, B + j, ldb, C + j, ldc, acc);
}
#endif

// Whether the tile products use `gemm_wide`: 1 (default) where the CPU is x86-64-v4, 0 never
// (sf_va_wide_products sets it, for tests of both).
int wide_products = 1;

SF_INLINE bool use_wide() {
#ifdef SF_WIDE_PRODUCTS
    static const bool cpu = (__builtin_cpu_init(), __builtin_cpu_supports("x86-64-v4") != 0);
    return wide_products != 0 && cpu;
#else
    return false;
#endif
}

// gemm, on `gemm_wide` where use_wide().
SF_INLINE void tile_gemm(i64 R, i64 K, i64 N, const float* A, i64 ars, i64 aks, const float* B,
                         i64 ldb, float* C, i64 ldc, bool acc) {
#ifdef SF_WIDE_PRODUCTS
    if (N >= 64 && use_wide()) {
        gemm_wide(R, K, N, A, ars, aks, B, ldb, C, ldc, acc);
        return;
    }
#endif
    gemm(R, K, N, A, ars, aks, B, ldb, C, ldc, acc);
}

// C (R x N) = A (R x K) B (K x N), all row-major and dense.
SF_INLINE void matmul(i64 R, i64 K, i64 N, const float* A, const float* B, float* C) {
    tile_gemm(R, K, N, A, K, 1, B, N, C, N, false);
}

// G (K x N) += X^T Y for X (R x K), Y (R x N), all row-major and dense. The rows go in
// blocks of 64, so that X's block and a 16-column panel of Y stay in L1 across G's row
// blocks (64 K-wide rows of X are 16 KB at K = 64; blocks of 128 ran about 15 % slower).
SF_INLINE void matmul_tn_acc(i64 R, i64 K, i64 N, const float* X, const float* Y, float* G) {
    for (i64 r = 0; r < R; r += 64)
        tile_gemm(K, std::min<i64>(64, R - r), N, X + r * K, 1, K, Y + r * N, N, G, N, true);
}

}  // namespace
