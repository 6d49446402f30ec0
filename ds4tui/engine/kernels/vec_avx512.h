/* vec_avx512.h: the vector parts of the step's, the decode attention's and finite.c's loops in
 * the AVX-512 build (DS4K_ISA 2): 16-lane loops where there are, then vec_x86.h's 8-lane
 * ones from where they stopped; the decode attention's V path for all heads of a group.
 */
#ifndef DS4K_VEC_AVX512_H
#define DS4K_VEC_AVX512_H

#include "vec_x86.h"

/* Lane j = sum of a[j]'s 16 lanes, for 16 rows at once: four levels of shuffle-and-add
 * (512 -> 256 -> 128 -> 64 -> 32-bit halves) instead of 16 separate reductions. The levels
 * leave row r in lane PERM16[r] (PERM16 is its own inverse), so callers pass accumulators
 * in that order and get the sums in row order. */
static const int PERM16[16] = {0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15};
static inline __m512 reduce16(const __m512 *a) {
    __m512 b[8], c[4], d[2];
    for (int i = 0; i < 8; i++)
        b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[i], a[i + 8], 0x44), _mm512_shuffle_f32x4(a[i], a[i + 8], 0xEE));
    for (int i = 0; i < 4; i++)
        c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[i], b[i + 4], 0x88), _mm512_shuffle_f32x4(b[i], b[i + 4], 0xDD));
    for (int i = 0; i < 2; i++)
        d[i] = _mm512_add_ps(_mm512_shuffle_ps(c[i], c[i + 2], 0x44), _mm512_shuffle_ps(c[i], c[i + 2], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], 0x88), _mm512_shuffle_ps(d[0], d[1], 0xDD));
}

static inline int exp_shift_sum_vec(float *p, int n, float m, float *s) {
    int i = 0;
    __m256 acc;
    __m512 acc16 = _mm512_setzero_ps(), mv16 = _mm512_set1_ps(m);
    for (; i + 16 <= n; i += 16) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(p + i), mv16));
        _mm512_storeu_ps(p + i, e);
        acc16 = _mm512_add_ps(acc16, e);
    }
    acc = _mm256_add_ps(_mm512_castps512_ps256(acc16),
                        _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc16), 1)));
    i = exp_shift_sum8(p, n, m, i, &acc);
    *s = hsum8(acc);
    return i;
}

static inline int scores_vec(float *s, const float *q, const float *k, int nt, int d) {
    int t = 0;
    if (d % 16 == 0) {
        for (; t + 16 <= nt; t += 16) {
            __m512 a[16];
            for (int j = 0; j < 16; j++) a[j] = _mm512_setzero_ps();
            for (int i = 0; i < d; i += 16) {
                __m512 qv = _mm512_loadu_ps(q + i);
                for (int j = 0; j < 16; j++)
                    a[j] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k + (int64_t)(t + PERM16[j]) * d + i), a[j]);
            }
            _mm512_storeu_ps(s + t, reduce16(a));
        }
    }
    return scores8(s, q, k, nt, d, t);
}

static inline int weighted_sum_vec(float *out, const float *p, const float *v, int nt, int d) {
    int i0 = 0;
    for (; i0 + 64 <= d; i0 += 64) {
        __m512 a[4], b[4];
        for (int j = 0; j < 4; j++) a[j] = _mm512_loadu_ps(out + i0 + 16 * j), b[j] = _mm512_setzero_ps();
        int t = 0;
        for (; t + 2 <= nt; t += 2) {
            const __m512 pa = _mm512_set1_ps(p[t]), pb = _mm512_set1_ps(p[t + 1]);
            const float *va = v + (int64_t)t * d + i0, *vb = va + d;
            for (int j = 0; j < 4; j++) {
                a[j] = _mm512_fmadd_ps(pa, _mm512_loadu_ps(va + 16 * j), a[j]);
                b[j] = _mm512_fmadd_ps(pb, _mm512_loadu_ps(vb + 16 * j), b[j]);
            }
        }
        if (t < nt) {
            const __m512 pa = _mm512_set1_ps(p[t]);
            for (int j = 0; j < 4; j++) a[j] = _mm512_fmadd_ps(pa, _mm512_loadu_ps(v + (int64_t)t * d + i0 + 16 * j), a[j]);
        }
        for (int j = 0; j < 4; j++) _mm512_storeu_ps(out + i0 + 16 * j, _mm512_add_ps(a[j], b[j]));
    }
    return weighted_sum32(out, p, v, nt, d, i0);
}

static inline int64_t f16_to_f32_vec(float *dst, const uint16_t *src, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
    return f16_to_f32_8(dst, src, n, i);
}

/* out[g][0..d) = sum_t p[g][t] v_t for GN heads at once over 64 dims from dc: each V vector
 * is loaded (and converted from f16) once for all the heads, in registers, with no f32 tile.
 * One or two heads alternate two accumulator sets over even and odd rows (one set alone would
 * be a chain of dependent FMAs). */
static inline __attribute__((always_inline)) void wsum_heads(float *const *out, const float *const *p, const void *v,
                                                             int f16, int nt, int d, int dc, const int GN, int pf) {
    const int NS = GN <= 2 ? 2 : 1;
    __m512 acc[2][4][4];
    for (int s = 0; s < NS; s++)
        for (int g = 0; g < GN; g++)
            for (int k = 0; k < 4; k++) acc[s][g][k] = _mm512_setzero_ps();
    const int64_t rowb = (int64_t)d * (f16 ? 2 : 4);
    const char *base = (const char *)v + (int64_t)dc * (f16 ? 2 : 4);
    for (int t = 0; t < nt; t += NS) {
        for (int s = 0; s < NS && t + s < nt; s++) {
            const char *row = base + (int64_t)(t + s) * rowb;
            if (pf) /* the first pass over the block fetches whole rows ahead of use */
                for (int64_t b = 0; b < rowb; b += 64) __builtin_prefetch(row + pf * rowb + b, 0, 3);
            __m512 vv[4];
            for (int k = 0; k < 4; k++)
                vv[k] = f16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 32 * k)))
                            : _mm512_loadu_ps((const float *)row + 16 * k);
            for (int g = 0; g < GN; g++) {
                const __m512 pb = _mm512_set1_ps(p[g][t + s]);
                for (int k = 0; k < 4; k++) acc[s][g][k] = _mm512_fmadd_ps(pb, vv[k], acc[s][g][k]);
            }
        }
    }
    for (int g = 0; g < GN; g++)
        for (int k = 0; k < 4; k++)
            _mm512_storeu_ps(out[g] + dc + 16 * k, NS == 2 ? _mm512_add_ps(acc[0][g][k], acc[1][g][k]) : acc[0][g][k]);
}

static void weighted_sums(float *const *out, float (*p)[ATT_BLOCK_MAX], const void *v, int f16, int nt, int d, int G, int pf) {
    for (int dc = 0; dc < d; dc += 64)
        for (int g0 = 0; g0 < G; g0 += 4) {
            const float *pg[4] = {p[g0], p[g0 + 1 < G ? g0 + 1 : g0], p[g0 + 2 < G ? g0 + 2 : g0], p[g0 + 3 < G ? g0 + 3 : g0]};
            const int first = dc == 0 && g0 == 0 ? pf : 0;
            switch (G - g0 < 4 ? G - g0 : 4) {
            case 1: wsum_heads(out + g0, pg, v, f16, nt, d, dc, 1, first); break;
            case 2: wsum_heads(out + g0, pg, v, f16, nt, d, dc, 2, first); break;
            case 3: wsum_heads(out + g0, pg, v, f16, nt, d, dc, 3, first); break;
            default: wsum_heads(out + g0, pg, v, f16, nt, d, dc, 4, first); break;
            }
        }
}

/* weighted_sums for a block's G heads (outputs `off` floats into each out[g]) when the shape
 * takes it (D a multiple of 64, two heads or more: one alone gains nothing from sharing its V
 * loads); 0 when the caller's loop over V tiles runs instead. */
static inline int weighted_sums_vec(float *const *out, int off, float (*p)[ATT_BLOCK_MAX], const void *v, int f16, int nt,
                                    int d, int G, int pf) {
    if (d % 64 != 0 || G < 2) return 0;
    float *o2[MAX_GROUP];
    for (int g = 0; g < G; g++) o2[g] = out[g] + off;
    weighted_sums(o2, p, v, f16, nt, d, G, pf);
    return 1;
}

/* finite.c's checks: 0 when the vector part (its end in *at) holds a NaN or infinity. */
static inline int finite16_vec(const uint16_t *h, int64_t n, int64_t *at) {
    int64_t i = 0;
    const __m512i e = _mm512_set1_epi16(0x7c00);
    __mmask32 bad = 0;
    for (; i + 32 <= n; i += 32)
        bad |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(_mm512_loadu_si512(h + i), e), e);
    if (bad) return 0;
    *at = i;
    return 1;
}

static inline int finite32_vec(const uint32_t *f, int64_t n, int64_t *at) {
    int64_t i = 0;
    const __m512i e = _mm512_set1_epi32(0x7f800000);
    __mmask16 bad = 0;
    for (; i + 16 <= n; i += 16)
        bad |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_loadu_si512(f + i), e), e);
    if (bad) return 0;
    *at = i;
    return 1;
}

#endif
