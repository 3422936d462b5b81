// Neighbour selection of the PTv1 transition down (see sciformer/pointcloud/_edge_select.py).
//
// For each point i and channel c: the neighbour j (0 <= j < k) maximising
// sign[c] * h_ijc with h_ijc = f[idx[i, j], c] + sum_t rel[i, j, t] wT[t, c], without
// forming the (m, k, C) tensor. The first j wins ties (all tie where sign[c] = 0); the first
// NaN edge wins over any number, so NaN propagates as through torch.max. With `sum` non-null, the same pass
// also accumulates, in double, the per-channel sums over all m*k edges of h - shift and
// (h - shift)^2 (the BatchNorm statistics; `shift` near the mean avoids cancellation).
// `val` receives h at the selected neighbour (its backward: sf_edge_select_backward_*).
// Loops over channels are innermost (vectorised; an AVX2+FMA clone is chosen at load time).
#include <cstdint>
#include <vector>

#include "../_kernels.h"

namespace {

template <typename T, bool STATS>
inline __attribute__((always_inline)) void select(i64 m, i64 k, i64 C, i64 d, const i64* idx, const T* f,
                                                  const T* rel, const T* wT, const T* sign, i64* out,
                                                  const T* shift, double* s1r, double* s2r, T* val) {
    std::vector<T> best(C), h(C), hb(C);
    T* __restrict hbr = hb.data();
    std::vector<int32_t> arg(C);
    T* __restrict br = best.data();
    T* __restrict hr = h.data();
    int32_t* __restrict ar = arg.data();
    for (i64 i = 0; i < m; ++i) {
        for (i64 j = 0; j < k; ++j) {
            const i64 e = i * k + j;
            const T* __restrict fr = f + idx[e] * C;
            const T* __restrict r = rel + e * d;
            for (i64 c = 0; c < C; ++c) hr[c] = fr[c];
            for (i64 t = 0; t < d; ++t) {
                const T rt = r[t];
                const T* __restrict w = wT + t * C;
                for (i64 c = 0; c < C; ++c) hr[c] += rt * w[c];
            }
            if (STATS) {
                for (i64 c = 0; c < C; ++c) {
                    const double dv = static_cast<double>(hr[c]) - static_cast<double>(shift[c]);
                    s1r[c] += dv;
                    s2r[c] += dv * dv;
                }
            }
            if (j == 0) {
                for (i64 c = 0; c < C; ++c) {
                    br[c] = sign[c] * hr[c];
                    hbr[c] = hr[c];
                    ar[c] = 0;
                }
                continue;
            }
            const int32_t jj = static_cast<int32_t>(j);
            for (i64 c = 0; c < C; ++c) {
                const T v = sign[c] * hr[c];
                const bool better = (v > br[c]) | (v != v);  // a NaN edge wins; then nothing beats it, as in torch.max
                br[c] = better ? v : br[c];
                hbr[c] = better ? hr[c] : hbr[c];
                ar[c] = better ? jj : ar[c];
            }
        }
        i64* o = out + i * C;
        T* vo = val + i * C;
        for (i64 c = 0; c < C; ++c) {
            o[c] = ar[c];
            vo[c] = hbr[c];
        }
    }
}

template <typename T>
inline __attribute__((always_inline)) void run(i64 m, i64 k, i64 C, i64 d, const i64* idx, const T* f, const T* rel,
                                               const T* wT, const T* sign, i64* out, const T* shift, double* sum,
                                               double* sumsq, T* val) {
    if (sum == nullptr) {
        select<T, false>(m, k, C, d, idx, f, rel, wT, sign, out, shift, nullptr, nullptr, val);
        return;
    }
    std::vector<double> s1(C, 0.0), s2(C, 0.0);
    select<T, true>(m, k, C, d, idx, f, rel, wT, sign, out, shift, s1.data(), s2.data(), val);
    for (i64 c = 0; c < C; ++c) {
        sum[c] = s1[c];
        sumsq[c] = s2[c];
    }
}

// Backward of the selected values val[i, c] = h_{i, best[i, c], c} for their gradient g
// (m, C): gf[idx[i, j]] += g, grel[i, j] += g wT[:, c], gwT[:, c] += g rel[i, j] at
// j = best[i, c] (all accumulate; null ones are skipped).
template <typename T>
inline __attribute__((always_inline)) void select_backward(i64 m, i64 k, i64 C, i64 d, const i64* idx,
                                                           const i64* best, const T* g, const T* rel,
                                                           const T* wT, T* gf, T* grel, T* gwT) {
    for (i64 i = 0; i < m; ++i) {
        for (i64 c = 0; c < C; ++c) {
            const T gv = g[i * C + c];
            const i64 e = i * k + best[i * C + c];
            if (gf != nullptr) gf[idx[e] * C + c] += gv;
            for (i64 t = 0; t < d; ++t) {
                if (grel != nullptr) grel[e * d + t] += gv * wT[t * C + c];
                if (gwT != nullptr) gwT[t * C + c] += gv * rel[e * d + t];
            }
        }
    }
}

}  // namespace

extern "C" {

SF_CLONES void sf_edge_select_f32(i64 m, i64 k, i64 C, i64 d, const i64* idx, const float* f,
                                  const float* rel, const float* wT, const float* sign, i64* out,
                                  const float* shift, double* sum, double* sumsq, float* val) {
    run<float>(m, k, C, d, idx, f, rel, wT, sign, out, shift, sum, sumsq, val);
}

SF_CLONES void sf_edge_select_f64(i64 m, i64 k, i64 C, i64 d, const i64* idx, const double* f,
                                  const double* rel, const double* wT, const double* sign, i64* out,
                                  const double* shift, double* sum, double* sumsq, double* val) {
    run<double>(m, k, C, d, idx, f, rel, wT, sign, out, shift, sum, sumsq, val);
}

void sf_edge_select_backward_f32(i64 m, i64 k, i64 C, i64 d, const i64* idx, const i64* best,
                                 const float* g, const float* rel, const float* wT, float* gf,
                                 float* grel, float* gwT) {
    select_backward<float>(m, k, C, d, idx, best, g, rel, wT, gf, grel, gwT);
}

void sf_edge_select_backward_f64(i64 m, i64 k, i64 C, i64 d, const i64* idx, const i64* best,
                                 const double* g, const double* rel, const double* wT, double* gf,
                                 double* grel, double* gwT) {
    select_backward<double>(m, k, C, d, idx, best, g, rel, wT, gf, grel, gwT);
}

}  // extern "C"
