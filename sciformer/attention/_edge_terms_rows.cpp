// The row-wise edge sums of _edge_terms.cpp over their rows split between OpenMP threads
// (float32, CPU; linked into the _vector_attention library). The threads are those of the
// runtime torch's own operations use; each takes one equal range of rows and calls the
// function of _edge_terms.cpp on it, so a row's result does not depend on the split.
// Shapes as in _edge_terms.cpp.
#include <algorithm>

#include "../_kernels.h"

extern "C" {
void sf_et_gather_sum(i64 m, i64 k, i64 C, const i64* idx, const float* X, float* out);
void sf_et_rows_dot(i64 R, i64 C, i64 d, const float* X, const float* mX, const float* WT,
                    float* out);
void sf_et_row_affine(i64 R, i64 C, i64 d, const float* X, const float* mX, const float* wx,
                      const float* wa, const float* Pr, const float* WpT, const float* Y,
                      const float* alpha, const float* beta, const float* consts, float* out);
void sf_et_edge_affine(i64 m, i64 k, i64 d, const i64* idx, const float* P, const float* KW,
                       const float* QW, const float* D, const float* c, float* out);
}

namespace {

// call(s, e) for rows [0, m) split into `threads` equal ranges, one per OpenMP thread (the
// runtime torch's own operations use); one range in the calling thread below 2^18 values.
template <class F>
void by_rows(i64 m, i64 values, i64 threads, F call) {
    const i64 t = values >= (i64{1} << 18) ? std::max<i64>(1, std::min(threads, m)) : 1;
    if (t == 1) {
        call(0, m);
        return;
    }
#pragma omp parallel for num_threads(static_cast<int>(t)) schedule(static, 1)
    for (i64 w = 0; w < t; ++w) call(m * w / t, m * (w + 1) / t);
}

template <class T>
T* at(T* p, i64 offset) { return p == nullptr ? nullptr : p + offset; }

}  // namespace

extern "C" {

void sf_et_gather_sum_mt(i64 threads, i64 m, i64 k, i64 C, const i64* idx, const float* X,
                         float* out) {
    by_rows(m, m * k * C, threads, [&](i64 s, i64 e) {
        sf_et_gather_sum(e - s, k, C, idx + s * k, X, out + s * C);
    });
}

void sf_et_rows_dot_mt(i64 threads, i64 R, i64 C, i64 d, const float* X, const float* mX,
                       const float* WT, float* out) {
    by_rows(R, R * C, threads, [&](i64 s, i64 e) {
        sf_et_rows_dot(e - s, C, d, X + s * C, mX, WT, out + s * d);
    });
}

void sf_et_row_affine_mt(i64 threads, i64 R, i64 C, i64 d, const float* X, const float* mX,
                         const float* wx, const float* wa, const float* Pr, const float* WpT,
                         const float* Y, const float* alpha, const float* beta,
                         const float* consts, float* out) {
    by_rows(R, R * C, threads, [&](i64 s, i64 e) {
        sf_et_row_affine(e - s, C, d, X + s * C, mX, at(wx, s), at(wa, s), Pr + s * d, WpT,
                         at(Y, s * C), alpha, beta, consts, out + s * C);
    });
}

void sf_et_edge_affine_mt(i64 threads, i64 m, i64 k, i64 d, const i64* idx, const float* P,
                          const float* KW, const float* QW, const float* D, const float* c,
                          float* out) {
    by_rows(m, m * k * d, threads, [&](i64 s, i64 e) {
        sf_et_edge_affine(e - s, k, d, idx + s * k, P + s * k * d, KW, at(QW, s * d), D, c,
                          out + s * k * d);
    });
}

}  // extern "C"
