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
#include "_vector_attention_passes.h"

namespace {

// Points per tile: about 32k floats (128 KB) of the widest per-edge tensor (C channels).
i64 tile_points(i64 k, i64 C) { return std::max<i64>(1, 32768 / std::max<i64>(1, C * k)); }

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
