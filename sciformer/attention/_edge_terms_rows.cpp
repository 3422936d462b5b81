// The edge sums of _edge_terms.cpp over their rows split between OpenMP threads (float32,
// CPU; linked into the _vector_attention library). The threads are those of the runtime
// torch's own operations use; each takes one equal range of rows and calls the function of
// _edge_terms.cpp on it, so a row's result does not depend on the split. Sums over all
// rows (moments, weight gradients) and scatters to source rows go to one zeroed buffer per
// range, added into the output in range order afterwards: the same result for the same
// number of ranges, which `workers` sets, however many threads ran them (one range: the
// function itself). Shapes as in _edge_terms.cpp.
#include <algorithm>
#include <vector>

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
void sf_et_position_sums(i64 m, i64 k, i64 d, const i64* idx, const float* P, const float* mP,
                         float* pscat, float* psum, double* gram, double* total);
void sf_et_rel_moments(i64 m, i64 k, i64 D, i64 i0, const i64* idx, const float* pos,
                       const double* shift, double* sum, double* cross);
void sf_et_rel_linear_relu(i64 m, i64 k, i64 D, i64 H, i64 i0, const i64* idx,
                           const float* pos, const float* WT, const float* b, float* out);
void sf_et_rel_grad_params(i64 m, i64 k, i64 D, i64 H, i64 i0, const i64* idx,
                           const float* pos, const float* out, const float* gout, double* gWT,
                           double* gb);
void sf_et_rel_grad_pos(i64 m, i64 k, i64 D, i64 H, i64 i0, const i64* idx, const float* pos,
                        const float* out, const float* gout, const float* W, const float* gm,
                        const float* Gs, const float* mean, float* gpos);
}

namespace {

// Ranges for m rows of `values` values in all: up to `threads`, one below 2^18 values.
i64 ranges_for(i64 m, i64 values, i64 threads) {
    return values >= (i64{1} << 18) ? std::max<i64>(1, std::min(threads, m)) : 1;
}

// call(w, s, e) for the t equal ranges w = [s, e) of [0, m) on up to `threads` OpenMP
// threads (the runtime torch's own operations use; a thread runs several ranges in turn
// where fewer run); one range runs in the calling thread.
template <class F>
void over_ranges(i64 m, i64 t, i64 threads, F call) {
    if (t == 1) {
        call(0, 0, m);
        return;
    }
#pragma omp parallel for num_threads(static_cast<int>(std::max<i64>(1, std::min(threads, t)))) schedule(static, 1)
    for (i64 w = 0; w < t; ++w) call(w, m * w / t, m * (w + 1) / t);
}

// call(s, e) for rows [0, m) split into ranges_for(m, values, threads) ranges, one per thread.
template <class F>
void by_rows(i64 m, i64 values, i64 threads, F call) {
    over_ranges(m, ranges_for(m, values, threads), threads, [&](i64, i64 s, i64 e) { call(s, e); });
}

template <class T>
T* at(T* p, i64 offset) { return p == nullptr ? nullptr : p + offset; }

// Ranges of the functions that scatter into one (M x d) buffer per range: at most 8, so that
// the buffers stay small beside the layer's own (N x k) tensors on machines of many threads.
i64 scatter_ranges(i64 m, i64 values, i64 workers) {
    return std::min<i64>(8, ranges_for(m, values, workers));
}

// call(w, s, e, part) for the t ranges of over_ranges, part: range w's zeroed buffer of
// `size` values; the t buffers, in range order.
template <class T, class F>
std::vector<T> partial_sums(i64 m, i64 t, i64 threads, i64 size, F call) {
    std::vector<T> parts(t * size, T{0});
    over_ranges(m, t, threads, [&](i64 w, i64 s, i64 e) { call(w, s, e, parts.data() + w * size); });
    return parts;
}

// out[x] += part_w[offset + x] for x < count, w = 0, 1, ... in order (null out: nothing).
template <class T>
void add_parts(const std::vector<T>& parts, i64 size, i64 offset, i64 count, T* out) {
    if (out == nullptr) return;
    const i64 t = static_cast<i64>(parts.size()) / size;
    for (i64 w = 0; w < t; ++w)
        for (i64 x = 0; x < count; ++x) out[x] += parts[w * size + offset + x];
}

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

void sf_et_rel_linear_relu_mt(i64 threads, i64 m, i64 k, i64 D, i64 H, const i64* idx,
                              const float* pos, const float* WT, const float* b, float* out) {
    by_rows(m, m * k * H, threads, [&](i64 s, i64 e) {
        sf_et_rel_linear_relu(e - s, k, D, H, s, idx + s * k, pos, WT, b, out + s * k * H);
    });
}

void sf_et_rel_moments_mt(i64 workers, i64 threads, i64 m, i64 k, i64 D, const i64* idx,
                          const float* pos, const double* shift, double* sum, double* cross) {
    const i64 t = ranges_for(m, m * k * D, workers), size = D + D * D;  // sum, cross
    if (t == 1) return sf_et_rel_moments(m, k, D, 0, idx, pos, shift, sum, cross);
    const auto parts = partial_sums<double>(m, t, threads, size, [&](i64, i64 s, i64 e, double* p) {
        sf_et_rel_moments(e - s, k, D, s, idx + s * k, pos, shift, p, cross == nullptr ? nullptr : p + D);
    });
    add_parts(parts, size, 0, D, sum);
    add_parts(parts, size, D, D * D, cross);
}

void sf_et_rel_grad_params_mt(i64 workers, i64 threads, i64 m, i64 k, i64 D, i64 H,
                              const i64* idx, const float* pos, const float* out,
                              const float* gout, double* gWT, double* gb) {
    const i64 t = ranges_for(m, m * k * H, workers), size = D * H + H;  // gWT, gb
    if (t == 1) return sf_et_rel_grad_params(m, k, D, H, 0, idx, pos, out, gout, gWT, gb);
    const auto parts = partial_sums<double>(m, t, threads, size, [&](i64, i64 s, i64 e, double* p) {
        sf_et_rel_grad_params(e - s, k, D, H, s, idx + s * k, pos, out + s * k * H,
                              gout + s * k * H, p, p + D * H);
    });
    add_parts(parts, size, 0, D * H, gWT);
    add_parts(parts, size, D * H, H, gb);
}

// M rows of pos and gpos.
void sf_et_rel_grad_pos_mt(i64 workers, i64 threads, i64 m, i64 k, i64 D, i64 H, i64 M,
                           const i64* idx, const float* pos, const float* out,
                           const float* gout, const float* W, const float* gm, const float* Gs,
                           const float* mean, float* gpos) {
    const i64 t = scatter_ranges(m, m * k * H, workers);
    if (t == 1) return sf_et_rel_grad_pos(m, k, D, H, 0, idx, pos, out, gout, W, gm, Gs, mean, gpos);
    const auto parts = partial_sums<float>(m, t, threads, M * D, [&](i64, i64 s, i64 e, float* p) {
        sf_et_rel_grad_pos(e - s, k, D, H, s, idx + s * k, pos, out + s * k * H, gout + s * k * H,
                           W, gm, Gs, mean, p);
    });
    add_parts(parts, M * D, 0, M * D, gpos);
}

// M rows of pscat.
void sf_et_position_sums_mt(i64 workers, i64 threads, i64 m, i64 k, i64 d, i64 M,
                            const i64* idx, const float* P, const float* mP, float* pscat,
                            float* psum, double* gram, double* total) {
    const i64 t = scatter_ranges(m, m * k * d, workers);
    if (t == 1) return sf_et_position_sums(m, k, d, idx, P, mP, pscat, psum, gram, total);
    const i64 size = d * d + d;  // gram, total
    std::vector<float> scat(t * M * d, 0.0f);  // pscat per range
    const auto parts = partial_sums<double>(m, t, threads, size, [&](i64 w, i64 s, i64 e, double* p) {
        sf_et_position_sums(e - s, k, d, idx + s * k, P + s * k * d, mP, scat.data() + w * M * d,
                            psum + s * d, p, p + d * d);
    });
    add_parts(parts, size, 0, d * d, gram);
    add_parts(parts, size, d * d, d, total);
    add_parts(scat, M * d, 0, M * d, pscat);
}

}  // extern "C"
