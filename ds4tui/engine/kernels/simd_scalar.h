/* simd_scalar.h: the vocabulary of simd.h in portable C (DS4K_ISA 0, no vector flags): arrays
 * the compiler may vectorize itself, av a plain float.
 */
#ifndef DS4K_SIMD_SCALAR_H
#define DS4K_SIMD_SCALAR_H

#define DS4K_AVX2 0

/* ---------------------------------------------------------------- vb: 16 bytes */
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

/* lo byte j = bit j of `bits` ? 16 : 0, hi byte j = bit 16 + j ? 16 : 0 (Q5_0/Q5_1 high bits) */
static inline void vb_from_bits32(uint32_t bits, vb *lo, vb *hi) {
    *lo = vb_from_bits16(bits), *hi = vb_from_bits16(bits >> 16);
}

/* ---------------------------------------------------------------- vf: 16 floats */
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
/* ---------------------------------------------------------------- va: a native-width sum
 * Block kernels reduce a 32-weight dot product to one register (__m512 or __m256) before
 * scaling it: on AVX2 that is one scale FMA per block instead of two. */
typedef vf va;
static inline va va_zero(void) { return vf_zero(); }
static inline float va_sum(va a) { return vf_sum(a); }
static inline va va_scale_add(float d, va s, va acc) { return vf_fma(vf_set1(d), s, acc); }
static inline va va_dot32(vf lo, vf hi, vf x0, vf x1) { return vf_fma(hi, x1, vf_mul(lo, x0)); }
static inline va va_dot16(vf q, vf x) { return vf_mul(q, x); }

/* The f16 pairs at p and q (d and m of two blocks) as {d_p, m_p, d_q, m_q}: one conversion
 * for both rows of a row pair. */
typedef struct { float v[4]; } f4;
static inline f4 f16x4(const uint8_t *p, const uint8_t *q) {
    f4 r = {{ds4k_h2f(p), ds4k_h2f(p + 2), ds4k_h2f(q), ds4k_h2f(q + 2)}};
    return r;
}
static inline float f4_at(f4 v, int k) { return v.v[k]; }

/* 16 int8 at p as floats, widened straight from memory. */
static inline vf vf_i8_mem(const uint8_t *p) { return vf_i8(vb_load(p)); }

/* f16 -> f32 of one value with the F16C instruction where the build has it (same result). */
static inline float h2f(const uint8_t *p) { return ds4k_h2f(p); }

/* ---------------------------------------------------------------- av: attention's native vector (attn.c, rows.c) */
typedef float av;
#define AW 1
#define AR 4
#define AKV 4
#define ADV 4
static inline av av_load(const float *p) { return *p; }
static inline void av_store(float *p, av v) { *p = v; }
static inline av av_set1(float a) { return a; }
static inline av av_fma(av a, av b, av c) { return a * b + c; }
static inline av av_mul(av a, av b) { return a * b; }
static inline av av_add(av a, av b) { return a + b; }
static inline av av_sub(av a, av b) { return a - b; }
static inline av av_max(av a, av b) { return a > b ? a : b; }
static inline av av_div(av a, av b) { return a / b; }
static inline float av_hmax(av a) { return a; }
static inline float av_hsum(av a) { return a; }
static inline int av_any_gt(av a, av b) { return a > b; }
static inline float av_first(av a) { return a; }
static inline av av_keep(av a, int t0, int lo, int hi) { return t0 >= lo && t0 < hi ? a : -INFINITY; }
static inline av av_exp(av x) { return expf(x); }
static inline av av_exp2(av x) { return exp2f(x); }
#endif
