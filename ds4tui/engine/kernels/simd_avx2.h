/* simd_avx2.h: the vocabulary of simd.h for the AVX2 build (DS4K_ISA 1: -mavx2 -mfma -mf16c):
 * vf as two __m256, va and av as one.
 */
#ifndef DS4K_SIMD_AVX2_H
#define DS4K_SIMD_AVX2_H

#include "simd_x86.h"

/* byte j = bit j of `bits` ? 16 : 0 */
/* byte j = bit j of `bits` ? 16 : 0 */
static inline vb vb_from_bits16(uint32_t bits) {
    const __m128i sel = _mm_set_epi8(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m128i bit = _mm_set_epi8((char)128, 64, 32, 16, 8, 4, 2, 1, (char)128, 64, 32, 16, 8, 4, 2, 1);
    __m128i b = _mm_shuffle_epi8(_mm_cvtsi32_si128((int)(bits & 0xffff)), sel);
    return _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(b, bit), bit), _mm_set1_epi8(16));
}

/* lo byte j = bit j of `bits` ? 16 : 0, hi byte j = bit 16 + j ? 16 : 0 (Q5_0/Q5_1 high bits) */
static inline void vb_from_bits32(uint32_t bits, vb *lo, vb *hi) { /* one 256-bit expansion instead of two 128-bit ones */
    const __m256i sel = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                         2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), sel);
    __m256i r = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(b, bit), bit), _mm256_set1_epi8(16));
    *lo = _mm256_castsi256_si128(r), *hi = _mm256_extracti128_si256(r, 1);
}

/* ---------------------------------------------------------------- vf: 16 floats */
typedef struct { __m256 a, b; } vf;
static inline vf vf_zero(void) { vf r = {_mm256_setzero_ps(), _mm256_setzero_ps()}; return r; }
static inline vf vf_set1(float x) { vf r = {_mm256_set1_ps(x), _mm256_set1_ps(x)}; return r; }
static inline vf vf_load(const float *p) { vf r = {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; return r; }
static inline vf vf_fma(vf x, vf y, vf c) {
    vf r = {_mm256_fmadd_ps(x.a, y.a, c.a), _mm256_fmadd_ps(x.b, y.b, c.b)};
    return r;
}
static inline vf vf_mul(vf x, vf y) { vf r = {_mm256_mul_ps(x.a, y.a), _mm256_mul_ps(x.b, y.b)}; return r; }
static inline vf vf_add(vf x, vf y) { vf r = {_mm256_add_ps(x.a, y.a), _mm256_add_ps(x.b, y.b)}; return r; }
static inline float vf_sum(vf x) { return hsum8(_mm256_add_ps(x.a, x.b)); }
static inline vf vf_u8(vb q) {
    vf r = {_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(q, q)))};
    return r;
}
static inline vf vf_i8(vb q) {
    vf r = {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(q, q)))};
    return r;
}
static inline vf vf_f16(const uint16_t *p) {
    vf r = {_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8)))};
    return r;
}
static inline __m256 bf16x8(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
static inline vf vf_bf16(const uint16_t *p) { vf r = {bf16x8(p), bf16x8(p + 8)}; return r; }
/* ---------------------------------------------------------------- va: a native-width sum
 * Block kernels reduce a 32-weight dot product to one register (__m512 or __m256) before
 * scaling it: on AVX2 that is one scale FMA per block instead of two. */
typedef __m256 va;
static inline va va_zero(void) { return _mm256_setzero_ps(); }
static inline float va_sum(va a) { return hsum8(a); }
static inline va va_scale_add(float d, va s, va acc) { return _mm256_fmadd_ps(_mm256_set1_ps(d), s, acc); }
static inline va va_dot32(vf lo, vf hi, vf x0, vf x1) {
    __m256 s = _mm256_mul_ps(lo.a, x0.a);
    s = _mm256_fmadd_ps(lo.b, x0.b, s);
    s = _mm256_fmadd_ps(hi.a, x1.a, s);
    return _mm256_fmadd_ps(hi.b, x1.b, s);
}
static inline va va_dot16(vf q, vf x) { return _mm256_fmadd_ps(q.b, x.b, _mm256_mul_ps(q.a, x.a)); }

/* 16 int8 at p as floats, widened straight from memory. */
static inline vf vf_i8_mem(const uint8_t *p) {
    vf r = {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p))),
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8))))};
    return r;
}

/* ---------------------------------------------------------------- av: attention's native vector (attn.c, rows.c) */
typedef __m256 av;
#define AW 8
#define AR 3   /* 16 registers: 12 accumulators, the rest loads and a broadcast */
#define AKV 4
#define ADV 4
static inline av av_load(const float *p) { return _mm256_loadu_ps(p); }
static inline void av_store(float *p, av v) { _mm256_storeu_ps(p, v); }
static inline av av_set1(float a) { return _mm256_set1_ps(a); }
static inline av av_fma(av a, av b, av c) { return _mm256_fmadd_ps(a, b, c); }
static inline av av_mul(av a, av b) { return _mm256_mul_ps(a, b); }
static inline av av_add(av a, av b) { return _mm256_add_ps(a, b); }
static inline av av_sub(av a, av b) { return _mm256_sub_ps(a, b); }
static inline av av_max(av a, av b) { return _mm256_max_ps(a, b); }
static inline av av_div(av a, av b) { return _mm256_div_ps(a, b); }
static inline float av_hmax(av a) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}
static inline float av_hsum(av a) { return hsum8(a); }
static inline int av_any_gt(av a, av b) { return _mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_GT_OQ)) != 0; }
static inline float av_first(av a) { return _mm256_cvtss_f32(a); }
static inline av av_keep(av a, int t0, int lo, int hi) {
    const __m256 t = _mm256_add_ps(_mm256_set1_ps((float)t0), _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256 k = _mm256_and_ps(_mm256_cmp_ps(t, _mm256_set1_ps((float)lo), _CMP_GE_OQ),
                                   _mm256_cmp_ps(t, _mm256_set1_ps((float)hi), _CMP_LT_OQ));
    return _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), a, k);
}
/* exp8 (simd.h), but exactly 0 below -87.3, so -inf gives 0 */
static inline av av_exp(av x) {
    return _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ), exp8(x));
}
/* 2^x for x <= 0; exactly 0 below -126 (so -inf, a masked key, gives 0). */
static inline av av_exp2(av x) {
    const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-126.0f), _CMP_LT_OQ);
    x = _mm256_max_ps(x, _mm256_set1_ps(-126.0f));
    const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), f = _mm256_sub_ps(x, n);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(EXP2_C6), f, _mm256_set1_ps(EXP2_C5));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_C4));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_C3));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_C2));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_C1));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(tiny, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}
#endif
