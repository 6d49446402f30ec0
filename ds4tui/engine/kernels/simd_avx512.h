/* simd_avx512.h: the vocabulary of simd.h for the AVX-512 build (DS4K_ISA 2: AVX-512 F/BW/VL
 * on top of the AVX2 flags): vf, va and av as one __m512.
 */
#ifndef DS4K_SIMD_AVX512_H
#define DS4K_SIMD_AVX512_H

#include "simd_x86.h"

#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__)
#error "the AVX-512 build needs -mavx512f -mavx512bw -mavx512vl"
#endif

/* exp8's polynomial and steps on 16 lanes (the same result per lane). */
static inline __m512 exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.3f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

/* byte j = bit j of `bits` ? 16 : 0 */
static inline vb vb_from_bits16(uint32_t bits) {
    return _mm_and_si128(_mm_movm_epi8((__mmask16)(bits & 0xffff)), _mm_set1_epi8(16)); /* AVX512BW+VL */
}

/* lo byte j = bit j of `bits` ? 16 : 0, hi byte j = bit 16 + j ? 16 : 0 (Q5_0/Q5_1 high bits) */
static inline void vb_from_bits32(uint32_t bits, vb *lo, vb *hi) {
    *lo = vb_from_bits16(bits), *hi = vb_from_bits16(bits >> 16);
}

/* ---------------------------------------------------------------- vf: 16 floats */
typedef __m512 vf;
static inline vf vf_zero(void) { return _mm512_setzero_ps(); }
static inline vf vf_set1(float a) { return _mm512_set1_ps(a); }
static inline vf vf_load(const float *p) { return _mm512_loadu_ps(p); }
static inline vf vf_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf vf_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf vf_add(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline float vf_sum(vf a) { return _mm512_reduce_add_ps(a); }
static inline vf vf_u8(vb q) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q)); }
static inline vf vf_i8(vb q) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)); }
static inline vf vf_f16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
static inline vf vf_bf16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
/* ---------------------------------------------------------------- va: a native-width sum
 * Block kernels reduce a 32-weight dot product to one register (__m512 or __m256) before
 * scaling it: on AVX2 that is one scale FMA per block instead of two. */
typedef __m512 va;
static inline va va_zero(void) { return _mm512_setzero_ps(); }
static inline float va_sum(va a) { return _mm512_reduce_add_ps(a); }
static inline va va_scale_add(float d, va s, va acc) { return _mm512_fmadd_ps(_mm512_set1_ps(d), s, acc); }
/* sum of q_j x_j over 32 (or 16) weights: lo/hi are quants 0..15 / 16..31, x0/x1 the x halves */
static inline va va_dot32(vf lo, vf hi, vf x0, vf x1) { return _mm512_fmadd_ps(hi, x1, _mm512_mul_ps(lo, x0)); }
static inline va va_dot16(vf q, vf x) { return _mm512_mul_ps(q, x); }

/* 16 int8 at p as floats, widened straight from memory. */
static inline vf vf_i8_mem(const uint8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

/* ---------------------------------------------------------------- av: attention's native vector (attn.c, rows.c) */
typedef __m512 av;
#define AW 16  /* lanes */
#define AR 6   /* rows per tile: AR x AKV (or ADV) accumulators of 32 registers */
#define AKV 4  /* key vectors per score tile */
#define ADV 4  /* dim vectors per output tile */
static inline av av_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void av_store(float *p, av v) { _mm512_storeu_ps(p, v); }
static inline av av_set1(float a) { return _mm512_set1_ps(a); }
static inline av av_fma(av a, av b, av c) { return _mm512_fmadd_ps(a, b, c); }
static inline av av_mul(av a, av b) { return _mm512_mul_ps(a, b); }
static inline av av_add(av a, av b) { return _mm512_add_ps(a, b); }
static inline av av_sub(av a, av b) { return _mm512_sub_ps(a, b); }
static inline av av_max(av a, av b) { return _mm512_max_ps(a, b); }
static inline av av_div(av a, av b) { return _mm512_div_ps(a, b); }
static inline float av_hmax(av a) { return _mm512_reduce_max_ps(a); }
static inline int av_any_gt(av a, av b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ) != 0; }
static inline float av_hsum(av a) { return _mm512_reduce_add_ps(a); }
static inline float av_first(av a) { return _mm512_cvtss_f32(a); }
/* a where lane t0 + l lies in [lo, hi), else -inf */
static inline av av_keep(av a, int t0, int lo, int hi) {
    const int a0 = lo - t0 > 0 ? lo - t0 : 0, a1 = hi - t0 < AW ? hi - t0 : AW;
    const __mmask16 k = a1 > a0 ? (__mmask16)(((1u << a1) - 1) & ~((1u << a0) - 1)) : 0;
    return _mm512_mask_blend_ps(k, _mm512_set1_ps(-INFINITY), a);
}
/* exp16 (simd.h), but exactly 0 below -87.3, so -inf gives 0 */
static inline av av_exp(av x) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_NLT_UQ), exp16(x));
}
/* 2^x for x <= 0; -inf (a masked key) gives exactly 0 (2^-200 underflows). */
static inline av av_exp2(av x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-200.0f));
    const av n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), f = _mm512_sub_ps(x, n);
    av p = _mm512_fmadd_ps(_mm512_set1_ps(EXP2_C6), f, _mm512_set1_ps(EXP2_C5));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP2_C4));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP2_C3));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP2_C2));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP2_C1));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}
#endif
