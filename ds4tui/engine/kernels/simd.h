/* simd.h: the small vector vocabulary the kernels are written in, one definition per ISA.
 *
 * vf is 16 floats: one __m512 (DS4K_ISA 2), two __m256 (1) or a plain array (0, portable C
 * the compiler may vectorize itself). vb is 16 bytes: __m128i, or an array. A block kernel
 * written once against these (unpack nibbles into a vb, widen to a vf, FMA against x) runs
 * on every ISA; only the lane count per instruction differs. Every ISA computes the same
 * products up to float summation order.
 */
#ifndef DS4K_SIMD_H
#define DS4K_SIMD_H

#include "ds4k.h"

#ifndef DS4K_ISA
#define DS4K_ISA 0
#endif

#if DS4K_ISA >= 1
#include <immintrin.h>
#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "DS4K_ISA >= 1 needs -mavx2 -mfma -mf16c"
#endif
#endif
#if DS4K_ISA >= 2 && (!defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__))
#error "DS4K_ISA 2 needs -mavx512f -mavx512bw -mavx512vl"
#endif

/* AVX2 helpers used by llama_step.c, qgemm.c and attn.c in both vector builds. */
#if DS4K_ISA >= 1
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
#if DS4K_ISA >= 2
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
#endif
#else
#define DS4K_AVX2 0
#endif

/* ---------------------------------------------------------------- vb: 16 bytes */
#if DS4K_ISA >= 1
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
/* byte j = bit j of `bits` ? 16 : 0 */
static inline vb vb_from_bits16(uint32_t bits) {
#if DS4K_ISA >= 2
    return _mm_and_si128(_mm_movm_epi8((__mmask16)(bits & 0xffff)), _mm_set1_epi8(16)); /* AVX512BW+VL */
#endif
    const __m128i sel = _mm_set_epi8(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m128i bit = _mm_set_epi8((char)128, 64, 32, 16, 8, 4, 2, 1, (char)128, 64, 32, 16, 8, 4, 2, 1);
    __m128i b = _mm_shuffle_epi8(_mm_cvtsi32_si128((int)(bits & 0xffff)), sel);
    return _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(b, bit), bit), _mm_set1_epi8(16));
}
#else
typedef struct { uint8_t b[16]; } vb;
static inline vb vb_load(const uint8_t *p) { vb v; memcpy(v.b, p, 16); return v; }
static inline vb vb_lo4(vb v) { for (int i = 0; i < 16; i++) v.b[i] &= 15; return v; }
static inline vb vb_hi4(vb v) { for (int i = 0; i < 16; i++) v.b[i] >>= 4; return v; }
static inline vb vb_or(vb a, vb b) { for (int i = 0; i < 16; i++) a.b[i] |= b.b[i]; return a; }
static inline vb vb_sub(vb v, int8_t k) { for (int i = 0; i < 16; i++) v.b[i] = (uint8_t)(v.b[i] - k); return v; }
static inline vb vb_bits_hi(vb v, int s, int mask) {
    for (int i = 0; i < 16; i++) v.b[i] = (uint8_t)(((v.b[i] >> s) & mask) << 4);
    return v;
}
static inline vb vb_bits(vb v, int s, int mask) {
    for (int i = 0; i < 16; i++) v.b[i] = (uint8_t)((v.b[i] >> s) & mask);
    return v;
}
static inline vb vb_from_bits16(uint32_t bits) {
    vb v;
    for (int i = 0; i < 16; i++) v.b[i] = (uint8_t)(((bits >> i) & 1) << 4);
    return v;
}
#endif

/* lo byte j = bit j of `bits` ? 16 : 0, hi byte j = bit 16 + j ? 16 : 0 (Q5_0/Q5_1 high bits) */
static inline void vb_from_bits32(uint32_t bits, vb *lo, vb *hi) {
#if DS4K_ISA == 1 /* one 256-bit expansion instead of two 128-bit ones */
    const __m256i sel = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                         2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), sel);
    __m256i r = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(b, bit), bit), _mm256_set1_epi8(16));
    *lo = _mm256_castsi256_si128(r), *hi = _mm256_extracti128_si256(r, 1);
#else
    *lo = vb_from_bits16(bits), *hi = vb_from_bits16(bits >> 16);
#endif
}

/* ---------------------------------------------------------------- vf: 16 floats */
#if DS4K_ISA >= 2
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
#elif DS4K_ISA == 1
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
#else
typedef struct { float v[16]; } vf;
static inline vf vf_zero(void) { vf r; for (int i = 0; i < 16; i++) r.v[i] = 0.0f; return r; }
static inline vf vf_set1(float a) { vf r; for (int i = 0; i < 16; i++) r.v[i] = a; return r; }
static inline vf vf_load(const float *p) { vf r; memcpy(r.v, p, sizeof r.v); return r; }
static inline vf vf_fma(vf a, vf b, vf c) { for (int i = 0; i < 16; i++) c.v[i] += a.v[i] * b.v[i]; return c; }
static inline vf vf_mul(vf a, vf b) { for (int i = 0; i < 16; i++) a.v[i] *= b.v[i]; return a; }
static inline vf vf_add(vf a, vf b) { for (int i = 0; i < 16; i++) a.v[i] += b.v[i]; return a; }
static inline float vf_sum(vf a) {
    for (int w = 8; w >= 1; w /= 2)
        for (int i = 0; i < w; i++) a.v[i] += a.v[i + w];
    return a.v[0];
}
static inline vf vf_u8(vb q) { vf r; for (int i = 0; i < 16; i++) r.v[i] = (float)q.b[i]; return r; }
static inline vf vf_i8(vb q) { vf r; for (int i = 0; i < 16; i++) r.v[i] = (float)(int8_t)q.b[i]; return r; }
static inline vf vf_f16(const uint16_t *p) {
    vf r;
    for (int i = 0; i < 16; i++) r.v[i] = ds4k_f16_to_f32(p[i]);
    return r;
}
static inline vf vf_bf16(const uint16_t *p) {
    vf r;
    for (int i = 0; i < 16; i++) r.v[i] = ds4k_bf16_to_f32(p[i]);
    return r;
}
#endif

/* ---------------------------------------------------------------- va: a native-width sum
 * Block kernels reduce a 32-weight dot product to one register (__m512 or __m256) before
 * scaling it: on AVX2 that is one scale FMA per block instead of two. */
#if DS4K_ISA >= 2
typedef __m512 va;
static inline va va_zero(void) { return _mm512_setzero_ps(); }
static inline float va_sum(va a) { return _mm512_reduce_add_ps(a); }
static inline va va_scale_add(float d, va s, va acc) { return _mm512_fmadd_ps(_mm512_set1_ps(d), s, acc); }
/* sum of q_j x_j over 32 (or 16) weights: lo/hi are quants 0..15 / 16..31, x0/x1 the x halves */
static inline va va_dot32(vf lo, vf hi, vf x0, vf x1) { return _mm512_fmadd_ps(hi, x1, _mm512_mul_ps(lo, x0)); }
static inline va va_dot16(vf q, vf x) { return _mm512_mul_ps(q, x); }
#elif DS4K_ISA == 1
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
#else
typedef vf va;
static inline va va_zero(void) { return vf_zero(); }
static inline float va_sum(va a) { return vf_sum(a); }
static inline va va_scale_add(float d, va s, va acc) { return vf_fma(vf_set1(d), s, acc); }
static inline va va_dot32(vf lo, vf hi, vf x0, vf x1) { return vf_fma(hi, x1, vf_mul(lo, x0)); }
static inline va va_dot16(vf q, vf x) { return vf_mul(q, x); }
#endif

/* The f16 pairs at p and q (d and m of two blocks) as {d_p, m_p, d_q, m_q}: one conversion
 * for both rows of a row pair. */
#if DS4K_ISA >= 1
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
#else
typedef struct { float v[4]; } f4;
static inline f4 f16x4(const uint8_t *p, const uint8_t *q) {
    f4 r = {{ds4k_h2f(p), ds4k_h2f(p + 2), ds4k_h2f(q), ds4k_h2f(q + 2)}};
    return r;
}
static inline float f4_at(f4 v, int k) { return v.v[k]; }
#endif

/* 16 int8 at p as floats, widened straight from memory. */
static inline vf vf_i8_mem(const uint8_t *p) {
#if DS4K_ISA >= 2
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
#elif DS4K_ISA == 1
    vf r = {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p))),
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8))))};
    return r;
#else
    return vf_i8(vb_load(p));
#endif
}

/* f16 -> f32 of one value with the F16C instruction where the build has it (same result). */
static inline float h2f(const uint8_t *p) {
#if DS4K_ISA >= 1
    return _cvtsh_ss(ds4k_rd16(p));
#else
    return ds4k_h2f(p);
#endif
}

#endif
