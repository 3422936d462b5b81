// Per-point sums over neighbour edges for the PTv1 layer's BatchNorm statistics and its
// position MLP (float32, CPU; linked into the _vector_attention library).
//
// Every function runs over m query rows of a neighbour index `idx` (m, k) into M source
// rows, without forming an (m*k, C) tensor:
// - gather_sum / scatter_rows: the edge sums of _neighborhood_moments (keys summed per
//   query, queries summed per source);
// - position_sums / edge_affine: the low-rank (d-dimensional) position terms of those
//   statistics and their gradient;
// - rel_*: the first Linear of the position MLP, BatchNorm folded in, applied to the
//   offsets r_ij = pos[idx_ij] - pos[i] recomputed on the fly (forward, moments,
//   backward), for _neighborhood_position.
// Reductions accumulate in double into the caller's buffers (zeroed by the caller); "acc"
// outputs add, "set" outputs overwrite. Loops over channels are innermost.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "../_kernels.h"

namespace {

constexpr i64 kAhead = 4;  // edges ahead whose source row is prefetched

// Prefetch the C floats of row `row` of X (one cache line at a time).
inline void prefetch_row(const float* X, i64 row, i64 C, bool write) {
    const char* p = reinterpret_cast<const char*>(X + row * C);
    for (i64 off = 0; off < C * 4; off += 64) {
        if (write)
            __builtin_prefetch(p + off, 1);
        else
            __builtin_prefetch(p + off, 0);
    }
}

// Offsets and position terms have d <= 16 channels; d = 3 (points in space) is compiled
// with a fixed size, other sizes with a runtime loop bound (FD = 0).
#define SF_DIM(FD, d) ((FD) > 0 ? (FD) : (d))

}  // namespace

extern "C" {

// out[i] = sum_j X[idx[i, j]]  (set). Shapes: X (M, C); out (m, C).
SF_CLONES void sf_et_gather_sum(i64 m, i64 k, i64 C, const i64* idx, const float* X,
                                float* out) {
    for (i64 i = 0; i < m; ++i) {
        float* __restrict o = out + i * C;
#pragma omp simd
        for (i64 c = 0; c < C; ++c) o[c] = 0.0f;
        for (i64 j = 0; j < k; ++j) {
            const i64 e = i * k + j;
            if (e + kAhead < m * k) prefetch_row(X, idx[e + kAhead], C, false);
            const float* __restrict x = X + idx[e] * C;
#pragma omp simd
            for (i64 c = 0; c < C; ++c) o[c] += x[c];
        }
    }
}

// out[idx[i, j]] += Y[i]  (acc). Shapes: Y (m, C); out (M, C).
SF_CLONES void sf_et_scatter_rows(i64 m, i64 k, i64 C, const i64* idx, const float* Y,
                                  float* out) {
    for (i64 i = 0; i < m; ++i) {
        const float* __restrict y = Y + i * C;
        for (i64 j = 0; j < k; ++j) {
            const i64 e = i * k + j;
            if (e + kAhead < m * k) prefetch_row(out, idx[e + kAhead], C, true);
            float* __restrict o = out + idx[e] * C;
#pragma omp simd
            for (i64 c = 0; c < C; ++c) o[c] += y[c];
        }
    }
}

}  // extern "C"

namespace {

#define SF_AI inline __attribute__((always_inline))

// Branch-free ReLU and its gradient mask (the signs of BatchNorm-centred values are random,
// so branches would mispredict half the time): relu keeps NaN; the gradient is dropped
// where out <= 0 only (it passes at a NaN out), as torch's threshold_backward.
SF_AI float relu(float v) { return v < 0.0f ? 0.0f : v; }
SF_AI float relu_grad(float out, float g) {
    uint32_t bits;
    std::memcpy(&bits, &g, 4);
    bits &= 0u - static_cast<uint32_t>(!(out <= 0.0f));
    std::memcpy(&g, &bits, 4);
    return g;
}

template <int FD>
SF_AI void position_sums(i64 m, i64 k, i64 d_rt, const i64* idx, const float* P, const float* mP,
                         float* pscat, float* psum, double* gram, double* total) {
    const i64 d = SF_DIM(FD, d_rt);
    float pc[16];
    double g[256] = {}, tot[16] = {};
    for (i64 i = 0; i < m; ++i) {
        float ps[16] = {};
        for (i64 j = 0; j < k; ++j) {
            const i64 e = i * k + j;
            float* sc = pscat + idx[e] * d;
            for (i64 t = 0; t < d; ++t) {
                pc[t] = P[e * d + t] - mP[t];
                sc[t] += pc[t];
                ps[t] += pc[t];
            }
            for (i64 t = 0; t < d; ++t) {
                tot[t] += pc[t];
                for (i64 u = 0; u < d; ++u) g[t * d + u] += double(pc[t]) * pc[u];
            }
        }
        for (i64 t = 0; t < d; ++t) psum[i * d + t] = ps[t];
    }
    for (i64 t = 0; t < d; ++t) {
        total[t] += tot[t];
        for (i64 u = 0; u < d; ++u) gram[t * d + u] += g[t * d + u];
    }
}

template <int FD>
SF_AI void edge_affine(i64 m, i64 k, i64 d_rt, const i64* idx, const float* P, const float* KW,
                       const float* QW, const float* D, const float* c, float* out) {
    const i64 d = SF_DIM(FD, d_rt);
    for (i64 i = 0; i < m; ++i) {
        float base[16];
        for (i64 u = 0; u < d; ++u) base[u] = c[u] - (QW != nullptr ? QW[i * d + u] : 0.0f);
        for (i64 j = 0; j < k; ++j) {
            const i64 e = i * k + j;
            const float* kw = KW + idx[e] * d;
            for (i64 u = 0; u < d; ++u) {
                float v = base[u] + kw[u];
                for (i64 t = 0; t < d; ++t) v += P[e * d + t] * D[t * d + u];
                out[e * d + u] = v;
            }
        }
    }
}

template <int FD>
SF_AI void rel_moments(i64 m, i64 k, i64 d_rt, i64 i0, const i64* idx, const float* pos,
                       const double* shift, double* sum, double* cross) {
    const i64 D = SF_DIM(FD, d_rt);
    double r[16], s[16] = {}, x[256] = {};
    for (i64 i = 0; i < m; ++i) {
        const float* q = pos + (i0 + i) * D;
        for (i64 j = 0; j < k; ++j) {
            const float* p = pos + idx[i * k + j] * D;
            for (i64 t = 0; t < D; ++t) {
                r[t] = double(p[t] - q[t]) - shift[t];
                s[t] += r[t];
            }
            if (cross != nullptr)
                for (i64 t = 0; t < D; ++t)
                    for (i64 u = 0; u < D; ++u) x[t * D + u] += r[t] * r[u];
        }
    }
    for (i64 t = 0; t < D; ++t) {
        sum[t] += s[t];
        if (cross != nullptr)
            for (i64 u = 0; u < D; ++u) cross[t * D + u] += x[t * D + u];
    }
}

// r = p - q, the offset of an edge. Shapes: p, q, r (D,).
SF_AI void offset(i64 D, const float* p, const float* q, float* r) {
    for (i64 t = 0; t < D; ++t) r[t] = p[t] - q[t];
}

template <int FD, int FH>
SF_AI void rel_linear_relu(i64 m, i64 k, i64 d_rt, i64 h_rt, i64 i0, const i64* idx,
                           const float* pos, const float* WT, const float* b, float* out) {
    const i64 D = SF_DIM(FD, d_rt), H = SF_DIM(FH, h_rt);
    for (i64 i = 0; i < m; ++i) {
        const float* q = pos + (i0 + i) * D;
        for (i64 j = 0; j < k; ++j) {
            const i64 e = i * k + j;
            float r[16];
            offset(D, pos + idx[e] * D, q, r);
            for (i64 o = 0; o < H; ++o) {
                float v = b[o];
                for (i64 t = 0; t < D; ++t) v += r[t] * WT[t * H + o];
                out[e * H + o] = relu(v);
            }
        }
    }
}

template <int FD, int FH>
SF_AI void rel_grad_params(i64 m, i64 k, i64 d_rt, i64 h_rt, i64 i0, const i64* idx,
                           const float* pos, const float* out, const float* gout, double* gWT,
                           double* gb) {
    const i64 D = SF_DIM(FD, d_rt), H = SF_DIM(FH, h_rt);
    for (i64 i = 0; i < m; ++i) {
        const float* q = pos + (i0 + i) * D;
        float gw[256] = {}, gbi[16] = {};  // this point's k edges in float, then double
        for (i64 j = 0; j < k; ++j) {
            const i64 e = i * k + j;
            float r[16];
            offset(D, pos + idx[e] * D, q, r);
            for (i64 o = 0; o < H; ++o) {
                const float gh = relu_grad(out[e * H + o], gout[e * H + o]);
                gbi[o] += gh;
                for (i64 t = 0; t < D; ++t) gw[t * H + o] += r[t] * gh;
            }
        }
        for (i64 o = 0; o < H; ++o) {
            gb[o] += gbi[o];
            for (i64 t = 0; t < D; ++t) gWT[t * H + o] += gw[t * H + o];
        }
    }
}

template <int FD, int FH>
SF_AI void rel_grad_pos(i64 m, i64 k, i64 d_rt, i64 h_rt, i64 i0, const i64* idx,
                        const float* pos, const float* out, const float* gout, const float* W,
                        const float* gm, const float* Gs, const float* mean, float* gpos) {
    const i64 D = SF_DIM(FD, d_rt), H = SF_DIM(FH, h_rt);
    for (i64 i = 0; i < m; ++i) {
        const float* q = pos + (i0 + i) * D;
        float gq[16] = {};
        for (i64 j = 0; j < k; ++j) {
            const i64 e = i * k + j;
            const float* p = pos + idx[e] * D;
            float r[16], gr[16];
            for (i64 t = 0; t < D; ++t) gr[t] = 0.0f;
            if (Gs != nullptr) {
                for (i64 t = 0; t < D; ++t) {
                    r[t] = p[t] - q[t] - mean[t];
                    gr[t] = gm[t];
                }
                for (i64 t = 0; t < D; ++t)
                    for (i64 u = 0; u < D; ++u) gr[t] += Gs[t * D + u] * r[u];
            }
            for (i64 o = 0; o < H; ++o) {
                const float gh = relu_grad(out[e * H + o], gout[e * H + o]);
                for (i64 t = 0; t < D; ++t) gr[t] += gh * W[o * D + t];
            }
            float* gp = gpos + idx[e] * D;
            for (i64 t = 0; t < D; ++t) {
                gp[t] += gr[t];
                gq[t] += gr[t];
            }
        }
        float* gqr = gpos + (i0 + i) * D;
        for (i64 t = 0; t < D; ++t) gqr[t] -= gq[t];
    }
}

}  // namespace

// Dispatch: d (and H) = 3 compiled with fixed sizes, anything else (<= 16) generic.
#define SF_D3(FN, d, ...) ((d) == 3 ? FN<3>(__VA_ARGS__) : FN<0>(__VA_ARGS__))
#define SF_DH3(FN, d, H, ...) \
    ((d) == 3 && (H) == 3 ? FN<3, 3>(__VA_ARGS__) : FN<0, 0>(__VA_ARGS__))

extern "C" {

// out[r, t] = sum_c (X[r, c] - mX[c]) WT[t, c]  (set; mX may be null): rows of X times a
// narrow matrix (d <= 16 columns), where BLAS runs slowly. Shapes: X (R, C); mX (C,);
// WT (d, C); out (R, d).
SF_CLONES void sf_et_rows_dot(i64 R, i64 C, i64 d, const float* X, const float* mX,
                              const float* WT, float* out) {
    for (i64 r = 0; r < R; ++r) {
        const float* __restrict x = X + r * C;
        for (i64 t = 0; t < d; ++t) {
            const float* __restrict w = WT + t * C;
            float acc = 0.0f;
            if (mX != nullptr) {
#pragma omp simd reduction(+ : acc)
                for (i64 c = 0; c < C; ++c) acc += (x[c] - mX[c]) * w[c];
            } else {
#pragma omp simd reduction(+ : acc)
                for (i64 c = 0; c < C; ++c) acc += x[c] * w[c];
            }
            out[r * d + t] = acc;
        }
    }
}

// out[r] = sign (beta * (wx_r (X[r] - mX) + Pr[r] WpT + ysign Y[r]) + wa_r alpha)  (set),
// the gradient of the BatchNorm statistics in the keys (per source) or queries (per query).
// wx, wa: per-row weights, or the constants wxc, wac where null; Y may be null.
// Shapes: X, Y, out (R, C); mX, alpha, beta (C,); wx, wa (R,); Pr (R, d); WpT (d, C).
SF_CLONES void sf_et_row_affine(i64 R, i64 C, i64 d, const float* X, const float* mX,
                                const float* wx, const float* wa, const float* Pr,
                                const float* WpT, const float* Y, const float* alpha,
                                const float* beta, const float* consts, float* out) {
    const float wxc = consts[0], wac = consts[1], ysign = consts[2], sign = consts[3];
    for (i64 r = 0; r < R; ++r) {
        const float a = wx != nullptr ? wx[r] : wxc, b = wa != nullptr ? wa[r] : wac;
        const float* __restrict x = X + r * C;
        const float* __restrict pr = Pr + r * d;
        const float* __restrict y = Y != nullptr ? Y + r * C : nullptr;
        float* __restrict o = out + r * C;
#pragma omp simd
        for (i64 c = 0; c < C; ++c) o[c] = a * (x[c] - mX[c]);
        for (i64 t = 0; t < d; ++t) {
            const float p = pr[t];
            const float* __restrict w = WpT + t * C;
#pragma omp simd
            for (i64 c = 0; c < C; ++c) o[c] += p * w[c];
        }
        if (y != nullptr) {
#pragma omp simd
            for (i64 c = 0; c < C; ++c) o[c] += ysign * y[c];
        }
#pragma omp simd
        for (i64 c = 0; c < C; ++c) o[c] = sign * (beta[c] * o[c] + b * alpha[c]);
    }
}

// With Pc = P - mP per edge: pscat[idx[i, j]] += Pc_ij (acc), psum[i] = sum_j Pc_ij (set),
// gram += Pc_ij Pc_ij^T and total += Pc_ij (double, acc).
// Shapes: P (m*k, d); mP (d,); pscat (M, d); psum (m, d); gram (d, d); total (d,).
SF_CLONES void sf_et_position_sums(i64 m, i64 k, i64 d, const i64* idx, const float* P,
                                   const float* mP, float* pscat, float* psum, double* gram,
                                   double* total) {
    SF_D3(position_sums, d, m, k, d, idx, P, mP, pscat, psum, gram, total);
}

// out_ij = c + KW[idx[i, j]] - QW[i] + P_ij D  (set; QW may be null).
// Shapes: P, out (m*k, d); KW (M, d); QW (m, d); D (d, d); c (d,).
SF_CLONES void sf_et_edge_affine(i64 m, i64 k, i64 d, const i64* idx, const float* P,
                                 const float* KW, const float* QW, const float* D,
                                 const float* c, float* out) {
    SF_D3(edge_affine, d, m, k, d, idx, P, KW, QW, D, c, out);
}

// The rel_* functions take the queries i0, ..., i0 + m - 1 (rows of pos; idx, out and gout
// start at query i0, pos and gpos are whole), so that threads can split the queries.

// With r = pos[idx[i, j]] - pos[i] - shift: sum += r and cross += r r^T (double, acc;
// cross may be null). Shapes: pos (M, D); shift, sum (D,); cross (D, D).
SF_CLONES void sf_et_rel_moments(i64 m, i64 k, i64 D, i64 i0, const i64* idx,
                                 const float* pos, const double* shift, double* sum,
                                 double* cross) {
    SF_D3(rel_moments, D, m, k, D, i0, idx, pos, shift, sum, cross);
}

// out_ij = ReLU(r_ij WT + b) (set) with r_ij = pos[idx[i, j]] - pos[i].
// Shapes: pos (M, D); WT (D, H); b (H,); out (m*k, H).
SF_CLONES void sf_et_rel_linear_relu(i64 m, i64 k, i64 D, i64 H, i64 i0, const i64* idx,
                                     const float* pos, const float* WT, const float* b,
                                     float* out) {
    SF_DH3(rel_linear_relu, D, H, m, k, D, H, i0, idx, pos, WT, b, out);
}

// Weight gradients of out = ReLU(r WT + b): with gh = gout where out > 0 (else 0),
// gWT += r^T gh and gb += sum of gh (double, acc). Shapes: out, gout (m*k, H); gWT (D, H).
SF_CLONES void sf_et_rel_grad_params(i64 m, i64 k, i64 D, i64 H, i64 i0, const i64* idx,
                                     const float* pos, const float* out, const float* gout,
                                     double* gWT, double* gb) {
    SF_DH3(rel_grad_params, D, H, m, k, D, H, i0, idx, pos, out, gout, gWT, gb);
}

// Gradient of the offsets, scattered to positions: gr = gh W + gm + Gs (r - mean) with gh
// as above (gm, Gs, mean null: no moments term); gpos[idx[i, j]] += gr and
// gpos[i] -= gr (acc).
// Shapes: pos, gpos (M, D); W (H, D); gm, mean (D,); Gs (D, D).
SF_CLONES void sf_et_rel_grad_pos(i64 m, i64 k, i64 D, i64 H, i64 i0, const i64* idx,
                                  const float* pos, const float* out, const float* gout,
                                  const float* W, const float* gm, const float* Gs,
                                  const float* mean, float* gpos) {
    SF_DH3(rel_grad_pos, D, H, m, k, D, H, i0, idx, pos, out, gout, W, gm, Gs, mean, gpos);
}

}  // extern "C"

