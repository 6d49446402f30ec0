/* simd_x86.h: what both x86 vector builds (simd_avx2.h, simd_avx512.h) share: AVX2 helpers
 * (a horizontal sum, exp), the 16-byte vb and the f16 conversions, all on the -mavx2 -mfma
 * -mf16c that both are compiled with. Included by those two files only.
 */
#ifndef DS4K_SIMD_X86_H
#define DS4K_SIMD_X86_H

#include <immintrin.h>

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "the vector builds need -mavx2 -mfma -mf16c"
#endif

#define DS4K_AVX2 1
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
/* exp for x <= 88 (Cephes expf polynomial, ~1 ulp): softmax and SiLU call it ~10^6 times
 * per token at 4K context, where libm's scalar expf would cost several ms. */
static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
/* ---------------------------------------------------------------- vb: 16 bytes */
typedef __m128i vb;
static inline vb vb_load(const uint8_t *p) { return _mm_loadu_si128((const __m128i *)p); }
static inline vb vb_lo4(vb v) { return _mm_and_si128(v, _mm_set1_epi8(0x0f)); }
static inline vb vb_hi4(vb v) { return _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(0x0f)); }
static inline vb vb_or(vb a, vb b) { return _mm_or_si128(a, b); }
static inline vb vb_sub(vb v, int8_t k) { return _mm_sub_epi8(v, _mm_set1_epi8(k)); }
/* byte j = ((v_j >> s) & mask) << 4, for the high bits of 5- and 6-bit quants */
static inline vb vb_bits_hi(vb v, int s, int mask) {
    return _mm_slli_epi16(_mm_and_si128(_mm_srl_epi16(v, _mm_cvtsi32_si128(s)), _mm_set1_epi8((char)mask)), 4);
}
/* byte j = (v_j >> s) & mask, for the 2-bit quants of Q2_K (s + bits of mask <= 8) */
static inline vb vb_bits(vb v, int s, int mask) {
    return _mm_and_si128(_mm_srl_epi16(v, _mm_cvtsi32_si128(s)), _mm_set1_epi8((char)mask));
}
/* ---------------------------------------------------------------- f4, h2f */
/* The f16 pairs at p and q (d and m of two blocks) as {d_p, m_p, d_q, m_q}: one conversion
 * for both rows of a row pair. */
typedef __m128 f4;
static inline f4 f16x4(const uint8_t *p, const uint8_t *q) {
    uint32_t a, b;
    memcpy(&a, p, 4);
    memcpy(&b, q, 4);
    return _mm_cvtph_ps(_mm_set_epi32(0, 0, (int)b, (int)a));
}
static inline float f4_at(f4 v, int k) {
    return _mm_cvtss_f32(k == 0 ? v : k == 1 ? _mm_movehdup_ps(v) : k == 2 ? _mm_movehl_ps(v, v) : _mm_shuffle_ps(v, v, 3));
}

/* f16 -> f32 of one value with the F16C instruction where the build has it (same result). */
static inline float h2f(const uint8_t *p) { return _cvtsh_ss(ds4k_rd16(p)); }

#endif
