/* vec_avx2.h: the vector parts of the step's, the decode attention's and finite.c's loops in
 * the AVX2 build (DS4K_ISA 1): vec_x86.h's 8-lane loops from the start.
 */
#ifndef DS4K_VEC_AVX2_H
#define DS4K_VEC_AVX2_H

#include "vec_x86.h"

static inline int exp_shift_sum_vec(float *p, int n, float m, float *s) {
    __m256 acc = _mm256_setzero_ps();
    const int i = exp_shift_sum8(p, n, m, 0, &acc);
    *s = hsum8(acc);
    return i;
}

static inline int scores_vec(float *s, const float *q, const float *k, int nt, int d) {
    return scores8(s, q, k, nt, d, 0);
}

static inline int weighted_sum_vec(float *out, const float *p, const float *v, int nt, int d) {
    return weighted_sum32(out, p, v, nt, d, 0);
}

static inline int64_t f16_to_f32_vec(float *dst, const uint16_t *src, int64_t n) { return f16_to_f32_8(dst, src, n, 0); }

/* The decode attention's outputs of a block for all heads at once: the AVX-512 build's only. */
static inline int weighted_sums_vec(float *const *out, int off, float (*p)[ATT_BLOCK_MAX], const void *v, int f16, int nt,
                                    int d, int G, int pf) {
    (void)out, (void)off, (void)p, (void)v, (void)f16, (void)nt, (void)d, (void)G, (void)pf;
    return 0;
}

/* finite.c's checks: 0 when the vector part (its end in *at) holds a NaN or infinity. */
static inline int finite16_vec(const uint16_t *h, int64_t n, int64_t *at) {
    int64_t i = 0;
    const __m256i e = _mm256_set1_epi16(0x7c00);
    __m256i bad = _mm256_setzero_si256();
    for (; i + 16 <= n; i += 16)
        bad = _mm256_or_si256(bad, _mm256_cmpeq_epi16(_mm256_and_si256(_mm256_loadu_si256((const __m256i *)(h + i)), e), e));
    if (!_mm256_testz_si256(bad, bad)) return 0;
    *at = i;
    return 1;
}

static inline int finite32_vec(const uint32_t *f, int64_t n, int64_t *at) {
    int64_t i = 0;
    const __m256i e = _mm256_set1_epi32(0x7f800000);
    __m256i bad = _mm256_setzero_si256();
    for (; i + 8 <= n; i += 8)
        bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_loadu_si256((const __m256i *)(f + i)), e), e));
    if (!_mm256_testz_si256(bad, bad)) return 0;
    *at = i;
    return 1;
}

#endif
