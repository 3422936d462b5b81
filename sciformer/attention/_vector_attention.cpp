// Fused per-chunk passes of the Point Transformer v1 vector attention (float32, CPU).
//
// One call per chunk of m points runs a whole stage of the weight MLP (the four entry
// points mirror VectorStage1 / VectorStage2 of _neighborhood_fused.py, forward and
// backward): the chunk is cut into tiles of a few hundred edge rows, and each tile goes
// through the elementwise passes (_vector_attention_passes.h) and the matrix products
// (_vector_attention_gemm.h) while its edge tensors stay in L2. Only the (N, k, G) tensors
// u, p and their gradients leave a tile. Pointers are offset to the chunk, except those
// indexed by `idx` (A, V and their gradients) and the weights, which are whole; null
// outputs are skipped; gradients of sources and weights accumulate (per-worker buffers),
// per-row ones are set. Denormals are flushed for the duration of each call.
//
// Shapes: idx (m*k,); A, V, gA, gV (M, C); B, gB (m, C); P, gP (m*k, d); WaT, WpT and
// their gradients (d, C); W1 (G, C), W1t (C, G); W2, W2t (G, G); u, p, grad, gu (m*k, G);
// y, gy (m, C); s2, t2, cv, cst (G,).
//
// The *_chunks entry points run a stage over all n points, chunk by chunk, on up to
// `threads` OpenMP threads (the runtime torch's own intra-op operations use, so no other
// threads compete with them for the cores; a pool of threads of our own left torch's idle
// OpenMP threads spinning beside it). The backward passes run `workers` workers: worker w
// takes chunks w, w + workers, ... in order and accumulates into its own slice of each
// accumulated output (workers x its size), which the caller adds in worker order. The
// forward passes accumulate nothing across chunks, so their threads take the next chunk
// as they finish one: a thread slowed down (by another process on its core) leaves no
// other thread idle at the end of the call, and the result is the same.
#include <omp.h>

#include "_vector_attention_passes.h"

namespace {

// Points per tile: about 32k floats (128 KB) of the widest per-edge tensor (C channels).
i64 tile_points(i64 k, i64 C) { return std::max<i64>(1, 32768 / std::max<i64>(1, C * k)); }

// body(c, s, e) for each chunk c = [s, e) of [0, n), on up to `threads` OpenMP threads that
// each take the next chunk left (for bodies that write only their chunk's rows).
template <class F>
void over_chunks_dynamic(i64 n, i64 chunk, i64 threads, F body) {
    const i64 chunks = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(dynamic, 1) num_threads(static_cast<int>(std::max<i64>(1, std::min(threads, chunks))))
    for (i64 c = 0; c < chunks; ++c) body(c, c * chunk, std::min(n, (c + 1) * chunk));
}

// body(w, c, s, e) for each chunk c = [s, e) of [0, n) (`chunk` points each) that worker w
// owns: chunks w, w + workers, ... in order, on up to `threads` OpenMP threads. Where fewer
// threads run than workers (fewer asked for, or granted), a thread runs the shares of
// several workers one after another, so every worker's result is the same however many
// threads ran.
template <class F>
void over_chunks(i64 n, i64 chunk, i64 workers, i64 threads, F body) {
    const i64 chunks = (n + chunk - 1) / chunk;
#pragma omp parallel num_threads(static_cast<int>(std::max<i64>(1, std::min(threads, workers))))
    {
        const i64 got = omp_get_num_threads();
        for (i64 w = omp_get_thread_num(); w < workers; w += got)
            for (i64 c = w; c < chunks; c += workers) body(w, c, c * chunk, std::min(n, (c + 1) * chunk));
    }
}

// p + offset, or null for a null p (outputs the caller does not want).
template <class T>
T* at(T* p, i64 offset) { return p == nullptr ? nullptr : p + offset; }

}  // namespace

extern "C" {

// u = ReLU(A[idx] - B_i + P WaT) W1^T per edge; mean and m2 (sum of squared deviations) of
// u's columns over the chunk's rows, in double (skipped when mean is null).
SF_CLONES void sf_va_stage1_forward(i64 m, i64 k, i64 C, i64 G, i64 d, const i64* idx,
                                    const float* A, const float* B, const float* P,
                                    const float* WaT, const float* W1t, float* u,
                                    double* mean, double* m2) {
    FlushDenormals flush;
    const i64 T = tile_points(k, C);
    std::vector<float> z(T * k * C);
    std::vector<double> tm(G), tq(G);
    i64 count = 0;
    if (mean != nullptr)
        for (i64 g = 0; g < G; ++g) mean[g] = m2[g] = 0.0;
    for (i64 s = 0; s < m; s += T) {
        const i64 t = std::min(T, m - s), rows = t * k;
        float* ut = u + s * k * G;
        pre(t, k, C, d, idx + s * k, A, B + s * C, P + s * k * d, WaT, z.data());
        matmul(rows, C, G, z.data(), W1t, ut);
        if (mean == nullptr) continue;
        moments(rows, G, ut, tm.data(), tq.data());  // this tile's, combined (Chan et al.)
        const double na = static_cast<double>(count), nb = static_cast<double>(rows);
        for (i64 g = 0; g < G; ++g) {
            const double delta = tm[g] - mean[g];
            mean[g] += delta * nb / (na + nb);
            m2[g] += tq[g] + delta * delta * na * nb / (na + nb);
        }
        count += rows;
    }
}

// p = softmax_j(ReLU(s2 u + t2) W2^T); y_i = sum_j p (V[idx] + P WpT) (set).
SF_CLONES void sf_va_stage2_forward(i64 m, i64 k, i64 C, i64 G, i64 d, const i64* idx,
                                    const float* u, const float* s2, const float* t2,
                                    const float* W2t, const float* V, const float* P,
                                    const float* WpT, float* p, float* y) {
    FlushDenormals flush;
    const i64 T = tile_points(k, C);
    std::vector<float> z(T * k * G), w(T * k * G);
    for (i64 s = 0; s < m; s += T) {
        const i64 t = std::min(T, m - s), rows = t * k;
        affine_relu(rows, G, u + s * k * G, s2, t2, z.data());
        matmul(rows, G, G, z.data(), W2t, w.data());
        softmax_aggregate(t, k, C, G, d, idx + s * k, w.data(), V, P + s * k * d, WpT,
                          p + s * k * G, y + s * C);
    }
}

// Backward of stage 2 from gy: gV, gWpT, gW2, gs2, gt2 accumulate; gP and gu are set.
SF_CLONES void sf_va_stage2_backward(i64 m, i64 k, i64 C, i64 G, i64 d, const i64* idx,
                                     const float* gy, const float* p, const float* V,
                                     const float* P, const float* WpT, const float* u,
                                     const float* s2, const float* t2, const float* W2,
                                     float* gV, float* gWpT, float* gP, float* gu,
                                     float* gs2, float* gt2, float* gW2) {
    FlushDenormals flush;
    const bool need_w = gu != nullptr || gs2 != nullptr || gt2 != nullptr || gW2 != nullptr;
    const i64 T = tile_points(k, C);
    std::vector<float> gw(need_w ? T * k * G : 0), z(gw.size()), gz(gw.size());
    for (i64 s = 0; s < m; s += T) {
        const i64 t = std::min(T, m - s), rows = t * k;
        const float* ut = u + s * k * G;
        aggregate_backward(t, k, C, G, d, idx + s * k, gy + s * C, p + s * k * G, V,
                           P + s * k * d, WpT, gV, gWpT, gP == nullptr ? nullptr : gP + s * k * d,
                           need_w ? gw.data() : nullptr);
        if (!need_w) continue;
        affine_relu(rows, G, ut, s2, t2, z.data());
        if (gW2 != nullptr) matmul_tn_acc(rows, G, G, gw.data(), z.data(), gW2);
        matmul(rows, G, G, gw.data(), W2, gz.data());
        affine_relu_backward(rows, G, gz.data(), z.data(), ut, s2,
                             gu == nullptr ? nullptr : gu + s * k * G, gs2, gt2);
    }
}

// Backward of stage 1 from the gradient of u, grad + cv * u + cst (grad, cv, cst may be
// null): gW1, gA, gWaT accumulate; gB and gP are set.
SF_CLONES void sf_va_stage1_backward(i64 m, i64 k, i64 C, i64 G, i64 d, const i64* idx,
                                     const float* grad, const float* u, const float* cv,
                                     const float* cst, const float* A, const float* B,
                                     const float* P, const float* WaT, const float* W1,
                                     float* gW1, float* gA, float* gB, float* gWaT, float* gP) {
    FlushDenormals flush;
    const bool need_gz = gA != nullptr || gB != nullptr || gWaT != nullptr || gP != nullptr;
    const i64 T = tile_points(k, C);
    std::vector<float> gu(T * k * G), z(T * k * C), gz(need_gz ? T * k * C : 0);
    for (i64 s = 0; s < m; s += T) {
        const i64 t = std::min(T, m - s), rows = t * k;
        grad_u(rows, G, grad == nullptr ? nullptr : grad + s * k * G, u + s * k * G, cv, cst, gu.data());
        pre(t, k, C, d, idx + s * k, A, B + s * C, P + s * k * d, WaT, z.data());
        if (gW1 != nullptr) matmul_tn_acc(rows, G, C, gu.data(), z.data(), gW1);
        if (!need_gz) continue;
        matmul(rows, G, C, gu.data(), W1, gz.data());
        pre_backward(t, k, C, d, idx + s * k, gz.data(), z.data(), WaT, gA,
                     gB == nullptr ? nullptr : gB + s * C, gP == nullptr ? nullptr : gP + s * k * d);
        if (gWaT != nullptr) matmul_tn_acc(rows, d, C, P + s * k * d, gz.data(), gWaT);  // gz masked
    }
}

// sf_va_stage1_forward over all n points on up to min(workers, threads) threads; the
// moments of chunk c in row c of mean, m2 (chunks x G; skipped when mean is null).
void sf_va_stage1_forward_chunks(i64 n, i64 k, i64 C, i64 G, i64 d, i64 chunk, i64 workers,
                                 i64 threads, const i64* idx, const float* A, const float* B,
                                 const float* P, const float* WaT, const float* W1t, float* u,
                                 double* mean, double* m2) {
    over_chunks_dynamic(n, chunk, std::min(workers, threads), [&](i64 c, i64 s, i64 e) {
        sf_va_stage1_forward(e - s, k, C, G, d, idx + s * k, A, B + s * C, P + s * k * d, WaT,
                             W1t, u + s * k * G, at(mean, c * G), at(m2, c * G));
    });
}

// sf_va_stage2_forward over all n points on up to min(workers, threads) threads; a null p
// (no backward pass to come) keeps each chunk's softmax in a buffer of its own.
void sf_va_stage2_forward_chunks(i64 n, i64 k, i64 C, i64 G, i64 d, i64 chunk, i64 workers,
                                 i64 threads, const i64* idx, const float* u, const float* s2,
                                 const float* t2, const float* W2t, const float* V,
                                 const float* P, const float* WpT, float* p, float* y) {
    over_chunks_dynamic(n, chunk, std::min(workers, threads), [&](i64, i64 s, i64 e) {
        std::vector<float> own(p == nullptr ? (e - s) * k * G : 0);
        sf_va_stage2_forward(e - s, k, C, G, d, idx + s * k, u + s * k * G, s2, t2, W2t, V,
                             P + s * k * d, WpT, p == nullptr ? own.data() : p + s * k * G,
                             y + s * C);
    });
}

// sf_va_stage2_backward over all n points (M source rows); gV, gWpT, gs2, gt2, gW2 per
// worker (workers x their size).
void sf_va_stage2_backward_chunks(i64 n, i64 k, i64 C, i64 G, i64 d, i64 M, i64 chunk,
                                  i64 workers, i64 threads, const i64* idx, const float* gy,
                                  const float* p, const float* V, const float* P, const float* WpT,
                                  const float* u, const float* s2, const float* t2,
                                  const float* W2, float* gV, float* gWpT, float* gP, float* gu,
                                  float* gs2, float* gt2, float* gW2) {
    over_chunks(n, chunk, workers, threads, [&](i64 w, i64, i64 s, i64 e) {
        sf_va_stage2_backward(e - s, k, C, G, d, idx + s * k, gy + s * C, p + s * k * G, V,
                              P + s * k * d, WpT, u + s * k * G, s2, t2, W2, at(gV, w * M * C),
                              at(gWpT, w * d * C), at(gP, s * k * d), at(gu, s * k * G),
                              at(gs2, w * G), at(gt2, w * G), at(gW2, w * G * G));
    });
}

// sf_va_stage1_backward over all n points (M source rows); gW1, gA, gWaT per worker
// (workers x their size).
void sf_va_stage1_backward_chunks(i64 n, i64 k, i64 C, i64 G, i64 d, i64 M, i64 chunk,
                                  i64 workers, i64 threads, const i64* idx, const float* grad,
                                  const float* u, const float* cv, const float* cst,
                                  const float* A, const float* B, const float* P,
                                  const float* WaT, const float* W1, float* gW1, float* gA,
                                  float* gB, float* gWaT, float* gP) {
    over_chunks(n, chunk, workers, threads, [&](i64 w, i64, i64 s, i64 e) {
        sf_va_stage1_backward(e - s, k, C, G, d, idx + s * k, at(grad, s * k * G), u + s * k * G,
                              cv, cst, A, B + s * C, P + s * k * d, WaT, W1, at(gW1, w * G * C),
                              at(gA, w * M * C), at(gB, s * C), at(gWaT, w * d * C),
                              at(gP, s * k * d));
    });
}

// Tile products on 16-lane blocks (1, the default, where the CPU is x86-64-v4) or never (0);
// another mode leaves the setting. *active: whether they are used now.
void sf_va_wide_products(i64 mode, i64* active) {
    if (mode == 0 || mode == 1) wide_products = static_cast<int>(mode);
    *active = use_wide() ? 1 : 0;
}

// C (R x N) = A (R x K) B (K x N), or G += X^T Y (transpose_a: A is X, R x K -> C is K x N);
// the products above, exposed for tests against torch.
SF_CLONES void sf_va_matmul(i64 R, i64 K, i64 N, i64 transpose_a, const float* A,
                            const float* B, float* C) {
    if (transpose_a != 0)
        matmul_tn_acc(R, K, N, A, B, C);
    else
        matmul(R, K, N, A, B, C);
}

}  // extern "C"
