// Edge-sized elementwise passes of the fused v1 vector attention, float32 (internal).
//
// Included by _vector_attention.cpp, whose per-chunk entry points call them tile by tile
// between the weight MLP's matrix products. Each pass works on m points whose k neighbour
// rows are contiguous; pointers are already offset to the rows at hand, except those
// indexed by `idx` (the source arrays A, V and their gradients), which are whole. Null
// output pointers skip that output. Loops run over channels innermost so that the
// compiler vectorises them; the passes are inlined into the cloned entry points.
//
// Channel c of a group-shared weight uses group c % G (c = s * G + g), G = C / share.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "_vector_attention_gemm.h"

namespace {

// exp(x) for float, vectorisable: x = n ln2 + r, |r| <= ln2/2, e^r by a degree-6
// polynomial (relative error ~2e-7), 2^n by exponent bits. Below -87 it returns 0 (the
// float result would be denormal, flushed anyway), above 88 e^88; NaN stays NaN (the
// integer conversion only ever sees the clamped, finite value).
SF_INLINE float fast_exp(float x0) {
    float x = x0 > -87.0f ? x0 : -87.0f;  // NaN -> -87 here, restored at the end
    x = x < 88.0f ? x : 88.0f;
    const float magic = 12582912.0f;  // 1.5 * 2^23: adding and subtracting it rounds to an integer
    float n = (x * 1.44269504088896341f + magic) - magic;
    float r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, sizeof(scale));
    const float result = x0 < -87.0f ? 0.0f : p * scale;
    return x0 == x0 ? result : x0;
}

// Flushes denormal inputs and results to zero for the duration of one call (the
// caller's floating-point mode is restored). Softmax weights near zero otherwise make
// products of gradients denormal, which costs about 100x per operation on x86.
struct FlushDenormals {
#if defined(__SSE__) || defined(__x86_64__)
    unsigned saved = _mm_getcsr();
    FlushDenormals() { _mm_setcsr(saved | 0x8040u); }  // FTZ | DAZ
    ~FlushDenormals() { _mm_setcsr(saved); }
#endif
};

}  // namespace

namespace {


// z[e, c] = ReLU(A[idx[e], c] - B[i, c] + sum_t P[e, t] WaT[t, c]) for the m*k edges e of
// the chunk (i = e / k). Shapes: idx (m*k,), A (M, C), B (m, C), P (m*k, d), WaT (d, C),
// z (m*k, C).
// Requests the k source rows (C floats each) of the next point into cache, so that their
// random-row reads (and read-modify-writes of gradients, `write`) overlap the current point.
SF_INLINE void prefetch_rows(const float* base, const i64* next, i64 k, i64 C, bool write) {
    for (i64 j = 0; j < k; ++j) {
        const char* row = reinterpret_cast<const char*>(base + next[j] * C);
        for (i64 b = 0; b < C * static_cast<i64>(sizeof(float)); b += 64) {
            if (write)
                __builtin_prefetch(row + b, 1);
            else
                __builtin_prefetch(row + b, 0);
        }
    }
}

SF_INLINE void pre(i64 m, i64 k, i64 C, i64 d, const i64* idx, const float* A,
                         const float* B, const float* P, const float* WaT, float* z) {
    for (i64 i = 0; i < m; ++i) {
        if (i + 1 < m) prefetch_rows(A, idx + (i + 1) * k, k, C, false);
        const float* __restrict b = B + i * C;
        for (i64 j = 0; j < k; ++j) {
            const i64 e = i * k + j;
            const float* __restrict a = A + idx[e] * C;
            const float* __restrict p = P + e * d;
            float* __restrict zr = z + e * C;
            for (i64 c = 0; c < C; ++c) zr[c] = a[c] - b[c];
            for (i64 t = 0; t < d; ++t) {
                const float pt = p[t];
                const float* __restrict w = WaT + t * C;
                for (i64 c = 0; c < C; ++c) zr[c] += pt * w[c];
            }
            for (i64 c = 0; c < C; ++c) zr[c] = std::max(zr[c], 0.0f);
        }
    }
}

// Dot products of one edge's row r (C,) with the d rows of W (d, C): out[t] = r . W[t].
// d = 3 (PTv1's position MLP) keeps three independent sums (no chain of dependent adds
// through one accumulator).
SF_INLINE void row_dots(i64 C, i64 d, const float* r, const float* W, float* out) {
    if (d == 3) {
        const float* __restrict w0 = W;
        const float* __restrict w1 = W + C;
        const float* __restrict w2 = W + 2 * C;
        float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f;
#pragma omp simd reduction(+ : a0, a1, a2)
        for (i64 c = 0; c < C; ++c) {
            a0 += r[c] * w0[c];
            a1 += r[c] * w1[c];
            a2 += r[c] * w2[c];
        }
        out[0] = a0, out[1] = a1, out[2] = a2;
        return;
    }
    for (i64 t = 0; t < d; ++t) {
        const float* __restrict w = W + t * C;
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (i64 c = 0; c < C; ++c) acc += r[c] * w[c];
        out[t] = acc;
    }
}

// Backward of sf_va_pre given the gradient gz of z (m*k, C) and z itself (for the ReLU):
// g = gz where z > 0 or z is NaN, else 0 (torch's threshold_backward), written over gz;
// gA[idx[e]] += g, gB[i] = -sum_j g, gP[e, t] = g . WaT[t]. gA (M, C) accumulates; gB
// (m, C), gP (m*k, d) are set. The weight gradient gWaT += P^T g is a matrix product of the
// caller on the masked gz.
SF_INLINE void pre_backward(i64 m, i64 k, i64 C, i64 d, const i64* idx, float* gz,
                            const float* z, const float* WaT, float* gA, float* gB,
                            float* gP) {
    std::vector<float> gb(C);
    float* __restrict gbr = gb.data();
    for (i64 i = 0; i < m; ++i) {
        if (gA != nullptr && i + 1 < m) prefetch_rows(gA, idx + (i + 1) * k, k, C, true);
        std::fill(gb.begin(), gb.end(), 0.0f);
        for (i64 j = 0; j < k; ++j) {
            const i64 e = i * k + j;
            float* __restrict gr = gz + e * C;
            const float* __restrict zr = z + e * C;
            for (i64 c = 0; c < C; ++c) gr[c] = zr[c] <= 0.0f ? 0.0f : gr[c];  // NaN passes, as in torch
            if (gA != nullptr) {
                float* __restrict ga = gA + idx[e] * C;
                for (i64 c = 0; c < C; ++c) ga[c] += gr[c];
            }
            for (i64 c = 0; c < C; ++c) gbr[c] += gr[c];
            if (gP != nullptr) row_dots(C, d, gr, WaT, gP + e * d);
        }
        if (gB != nullptr) {
            float* __restrict gbo = gB + i * C;
            for (i64 c = 0; c < C; ++c) gbo[c] = -gbr[c];
        }
    }
}

// Per-column mean and sum of squared deviations of u (rows, G), in double.
SF_INLINE void moments(i64 rows, i64 G, const float* u, double* mean, double* m2) {
    std::vector<double> s(G, 0.0), q(G, 0.0);
    double* __restrict sr = s.data();
    double* __restrict qr = q.data();
    for (i64 r = 0; r < rows; ++r) {
        const float* __restrict ur = u + r * G;
        for (i64 g = 0; g < G; ++g) sr[g] += ur[g];
    }
    for (i64 g = 0; g < G; ++g) sr[g] /= static_cast<double>(rows);
    for (i64 r = 0; r < rows; ++r) {
        const float* __restrict ur = u + r * G;
        for (i64 g = 0; g < G; ++g) {
            const double dv = ur[g] - sr[g];
            qr[g] += dv * dv;
        }
    }
    for (i64 g = 0; g < G; ++g) {
        mean[g] = sr[g];
        m2[g] = qr[g];
    }
}

// out = grad (or 0) + cv * u + cst (cv, cst per column; either may be null).
SF_INLINE void grad_u(i64 rows, i64 G, const float* grad, const float* u,
                            const float* cv, const float* cst, float* out) {
    for (i64 r = 0; r < rows; ++r) {
        const float* __restrict ur = u + r * G;
        float* __restrict o = out + r * G;
        if (grad != nullptr) {
            const float* __restrict gr = grad + r * G;
            for (i64 g = 0; g < G; ++g) o[g] = gr[g];
        } else {
            for (i64 g = 0; g < G; ++g) o[g] = 0.0f;
        }
        if (cv != nullptr)
            for (i64 g = 0; g < G; ++g) o[g] += cv[g] * ur[g];
        if (cst != nullptr)
            for (i64 g = 0; g < G; ++g) o[g] += cst[g];
    }
}

// z = ReLU(s * u + t) per column. Shapes: u, z (rows, G); s, t (G,).
SF_INLINE void affine_relu(i64 rows, i64 G, const float* u, const float* s,
                                 const float* t, float* z) {
    for (i64 r = 0; r < rows; ++r) {
        const float* __restrict ur = u + r * G;
        float* __restrict zr = z + r * G;
        for (i64 g = 0; g < G; ++g) zr[g] = std::max(s[g] * ur[g] + t[g], 0.0f);
    }
}

// Backward of sf_va_affine_relu: g = gz unless z <= 0; gu = g * s (set), gs += sum g * u,
// gt += sum g (accumulate). Shapes: gz, z, u, gu (rows, G); s, gs, gt (G,).
SF_INLINE void affine_relu_backward(i64 rows, i64 G, const float* gz, const float* z,
                                          const float* u, const float* s, float* gu,
                                          float* gs, float* gt) {
    std::vector<float> as(G, 0.0f), at(G, 0.0f);
    float* __restrict asr = as.data();
    float* __restrict atr = at.data();
    for (i64 r = 0; r < rows; ++r) {
        const float* __restrict gzr = gz + r * G;
        const float* __restrict zr = z + r * G;
        const float* __restrict ur = u + r * G;
        for (i64 g = 0; g < G; ++g) {
            const float v = zr[g] <= 0.0f ? 0.0f : gzr[g];  // NaN passes, as in torch
            asr[g] += v * ur[g];
            atr[g] += v;
            if (gu != nullptr) gu[r * G + g] = v * s[g];
        }
    }
    for (i64 g = 0; g < G; ++g) {
        if (gs != nullptr) gs[g] += asr[g];
        if (gt != nullptr) gt[g] += atr[g];
    }
}

// out (d, G) = P^T p for one point: out[t, g] = sum_j P[j, t] p[j, g] (P (k, d), p (k, G)).
// A matrix product when G is a multiple of 8 (its register blocks), else a plain loop.
SF_INLINE void position_weights(i64 k, i64 G, i64 d, const float* P, const float* p, float* out) {
    if (G % 8 == 0) {
        gemm(d, k, G, P, 1, d, p, G, out, G, false);
        return;
    }
    for (i64 x = 0; x < d * G; ++x) out[x] = 0.0f;
    for (i64 j = 0; j < k; ++j)
        for (i64 t = 0; t < d; ++t)
            for (i64 g = 0; g < G; ++g) out[t * G + g] += p[j * G + g] * P[j * d + t];
}

// Softmax over the k neighbours of each point and aggregation:
// p[i, j, g] = softmax_j w[i, j, g];
// y[i, c] = sum_j p[i, j, c % G] (V[idx[i, j], c] + sum_t P[i, j, t] WpT[t, c]).
// Shapes: idx (m*k,), w, p (m*k, G), V (M, C), P (m*k, d), WpT (d, C), y (m, C).
SF_INLINE void softmax_aggregate(i64 m, i64 k, i64 C, i64 G, i64 d, const i64* idx,
                                       const float* w, const float* V, const float* P,
                                       const float* WpT, float* p, float* y) {
    const i64 S = C / G;
    std::vector<float> mx(G), sum(G), pp(d * G);
    float* __restrict mxr = mx.data();
    float* __restrict sr = sum.data();
    float* __restrict ppr = pp.data();
    for (i64 i = 0; i < m; ++i) {
        if (i + 1 < m) prefetch_rows(V, idx + (i + 1) * k, k, C, false);
        const float* __restrict wi = w + i * k * G;
        float* __restrict pi = p + i * k * G;
        for (i64 g = 0; g < G; ++g) mxr[g] = wi[g];
        for (i64 j = 1; j < k; ++j)
            for (i64 g = 0; g < G; ++g) mxr[g] = std::max(mxr[g], wi[j * G + g]);
        for (i64 g = 0; g < G; ++g) sr[g] = 0.0f;
        for (i64 j = 0; j < k; ++j)
            for (i64 g = 0; g < G; ++g) {
                const float ex = fast_exp(wi[j * G + g] - mxr[g]);
                pi[j * G + g] = ex;
                sr[g] += ex;
            }
        for (i64 g = 0; g < G; ++g) sr[g] = 1.0f / sr[g];
        for (i64 j = 0; j < k; ++j)
            for (i64 g = 0; g < G; ++g) pi[j * G + g] *= sr[g];
        // y = sum_j p V[idx] + sum_t WpT[t] * (sum_j p[j] P[j, t])
        float* __restrict yi = y + i * C;
        for (i64 c = 0; c < C; ++c) yi[c] = 0.0f;
        for (i64 j = 0; j < k; ++j) {
            const float* __restrict pj = pi + j * G;
            const float* __restrict v = V + idx[i * k + j] * C;
            for (i64 s = 0; s < S; ++s)
                for (i64 g = 0; g < G; ++g) yi[s * G + g] += pj[g] * v[s * G + g];
        }
        position_weights(k, G, d, P + i * k * d, pi, ppr);
        for (i64 t = 0; t < d; ++t) {
            const float* __restrict wt = WpT + t * C;
            for (i64 s = 0; s < S; ++s)
                for (i64 g = 0; g < G; ++g) yi[s * G + g] += wt[s * G + g] * ppr[t * G + g];
        }
    }
}

// Backward of the aggregation and the softmax for upstream gradient gy (m, C):
// gV[idx[i, j], c] += p[i, j, c % G] gy[i, c] (accumulate); gWpT[t, c] += gy[i, c] *
// sum_j P[i, j, t] p[i, j, c % G] (accumulate); gP[i, j, t] = sum_c p gy WpT[t, c] (set);
// gw[i, j, g] = p (gp - sum_j p gp) (set) with gp[i, j, g] = sum_{c % G = g} gy[i, c] *
// (V[idx[i, j], c] + sum_t P[i, j, t] WpT[t, c]).
SF_INLINE void aggregate_backward(i64 m, i64 k, i64 C, i64 G, i64 d, const i64* idx,
                                        const float* gy, const float* p, const float* V,
                                        const float* P, const float* WpT, float* gV,
                                        float* gWpT, float* gP, float* gw) {
    const i64 S = C / G;
    std::vector<float> h(d * G), pp(d * G), gp(k * G), pg(G);
    float* __restrict hr = h.data();
    float* __restrict ppr = pp.data();
    float* __restrict gpr = gp.data();
    float* __restrict pgr = pg.data();
    for (i64 i = 0; i < m; ++i) {
        if (i + 1 < m) {
            if (gw != nullptr) prefetch_rows(V, idx + (i + 1) * k, k, C, false);
            if (gV != nullptr) prefetch_rows(gV, idx + (i + 1) * k, k, C, true);
        }
        const float* __restrict gyi = gy + i * C;
        const float* __restrict pi = p + i * k * G;
        // h[t, g] = sum_s gy[s G + g] WpT[t, s G + g]
        for (i64 x = 0; x < d * G; ++x) hr[x] = 0.0f;
        for (i64 t = 0; t < d; ++t)
            for (i64 s = 0; s < S; ++s)
                for (i64 g = 0; g < G; ++g) hr[t * G + g] += gyi[s * G + g] * WpT[t * C + s * G + g];
        if (gWpT != nullptr) {
            position_weights(k, G, d, P + i * k * d, pi, ppr);
            for (i64 t = 0; t < d; ++t)
                for (i64 s = 0; s < S; ++s)
                    for (i64 g = 0; g < G; ++g)
                        gWpT[t * C + s * G + g] += gyi[s * G + g] * ppr[t * G + g];
        }
        for (i64 j = 0; j < k; ++j) {
            const i64 e = i * k + j;
            const float* __restrict pj = pi + j * G;
            const float* __restrict pt = P + e * d;
            if (gV != nullptr) {
                float* __restrict gv = gV + idx[e] * C;
                for (i64 s = 0; s < S; ++s)
                    for (i64 g = 0; g < G; ++g) gv[s * G + g] += pj[g] * gyi[s * G + g];
            }
            if (gP != nullptr) row_dots(G, d, pj, hr, gP + e * d);
            if (gw != nullptr) {
                const float* __restrict v = V + idx[e] * C;
                float* __restrict gpj = gpr + j * G;
                for (i64 g = 0; g < G; ++g) gpj[g] = 0.0f;
                for (i64 s = 0; s < S; ++s)
                    for (i64 g = 0; g < G; ++g) gpj[g] += gyi[s * G + g] * v[s * G + g];
                for (i64 t = 0; t < d; ++t)
                    for (i64 g = 0; g < G; ++g) gpj[g] += pt[t] * hr[t * G + g];
            }
        }
        if (gw != nullptr) {
            for (i64 g = 0; g < G; ++g) pgr[g] = 0.0f;
            for (i64 j = 0; j < k; ++j)
                for (i64 g = 0; g < G; ++g) pgr[g] += pi[j * G + g] * gpr[j * G + g];
            float* __restrict gwi = gw + i * k * G;
            for (i64 j = 0; j < k; ++j)
                for (i64 g = 0; g < G; ++g)
                    gwi[j * G + g] = pi[j * G + g] * (gpr[j * G + g] - pgr[g]);
        }
    }
}

}  // namespace
