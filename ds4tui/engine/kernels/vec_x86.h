/* vec_x86.h: the AVX2 loops both x86 vector builds run (vec_avx2.h, vec_avx512.h include it):
 * the fused step's vector math and the decode attention's, each the vector part of a
 * function whose scalar tail is shared (attn.c, llama_step.c). A loop that the AVX-512 build
 * continues after its 16-lane one takes the index to start from.
 */
#ifndef DS4K_VEC_X86_H
#define DS4K_VEC_X86_H

static inline __m256 load8_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* [sum(a0), ..., sum(a7)]: eight dot products finished with one hadd tree instead of
 * eight horizontal sums. */
static inline __m256 reduce8(const __m256 *a) {
    __m256 h01 = _mm256_hadd_ps(a[0], a[1]), h23 = _mm256_hadd_ps(a[2], a[3]);
    __m256 h45 = _mm256_hadd_ps(a[4], a[5]), h67 = _mm256_hadd_ps(a[6], a[7]);
    __m256 h0123 = _mm256_hadd_ps(h01, h23), h4567 = _mm256_hadd_ps(h45, h67);
    return _mm256_add_ps(_mm256_permute2f128_ps(h0123, h4567, 0x20),
                         _mm256_permute2f128_ps(h0123, h4567, 0x31));
}

/* dot's vector part: *s the sum of the first (returned) elements. */
static inline int dot_vec(const float *a, const float *b, int n, float *s) {
    int i = 0;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    *s = hsum8(_mm256_add_ps(acc0, acc1));
    return i;
}

/* exp_shift_sum's 8-lane loop from i into acc. */
static inline int exp_shift_sum8(float *p, int n, float m, int i, __m256 *acc) {
    const __m256 mv = _mm256_set1_ps(m);
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p + i), mv));
        _mm256_storeu_ps(p + i, e);
        *acc = _mm256_add_ps(*acc, e);
    }
    return i;
}

static inline int axpy_vec(float *y, float a, const float *x, int n) {
    int i = 0;
    __m256 a8 = _mm256_set1_ps(a);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(a8, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    return i;
}

/* scores' 8-key loop from t (rows of k with d a multiple of 8). */
static inline int scores8(float *s, const float *q, const float *k, int nt, int d, int t) {
    if (d % 8 == 0) {
        for (; t + 8 <= nt; t += 8) {
            __m256 a[8];
            for (int j = 0; j < 8; j++) a[j] = _mm256_setzero_ps();
            for (int i = 0; i < d; i += 8) {
                __m256 qv = _mm256_loadu_ps(q + i);
                for (int j = 0; j < 8; j++)
                    a[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + (int64_t)(t + j) * d + i), a[j]);
            }
            _mm256_storeu_ps(s + t, reduce8(a));
        }
    }
    return t;
}

/* weighted_sum's loop over 32 dims at a time from i0. */
static inline int weighted_sum32(float *out, const float *p, const float *v, int nt, int d, int i0) {
    for (; i0 + 32 <= d; i0 += 32) {
        __m256 a[4], b[4];
        for (int j = 0; j < 4; j++) a[j] = _mm256_loadu_ps(out + i0 + 8 * j), b[j] = _mm256_setzero_ps();
        int t = 0;
        for (; t + 2 <= nt; t += 2) {
            const __m256 pa = _mm256_broadcast_ss(p + t), pb = _mm256_broadcast_ss(p + t + 1);
            const float *va = v + (int64_t)t * d + i0, *vb = va + d;
            for (int j = 0; j < 4; j++) {
                a[j] = _mm256_fmadd_ps(pa, _mm256_loadu_ps(va + 8 * j), a[j]);
                b[j] = _mm256_fmadd_ps(pb, _mm256_loadu_ps(vb + 8 * j), b[j]);
            }
        }
        if (t < nt) {
            const __m256 pa = _mm256_broadcast_ss(p + t);
            for (int j = 0; j < 4; j++) a[j] = _mm256_fmadd_ps(pa, _mm256_loadu_ps(v + (int64_t)t * d + i0 + 8 * j), a[j]);
        }
        for (int j = 0; j < 4; j++) _mm256_storeu_ps(out + i0 + 8 * j, _mm256_add_ps(a[j], b[j]));
    }
    return i0;
}

/* max_of's vector part: *m the max of the first (returned) elements, -inf for none. */
static inline int max_of_vec(const float *p, int n, float *m) {
    int i = 0;
    *m = -INFINITY;
    if (n >= 8) {
        __m256 a = _mm256_loadu_ps(p), b = a;
        for (i = 8; i + 16 <= n; i += 16) {
            a = _mm256_max_ps(a, _mm256_loadu_ps(p + i));
            b = _mm256_max_ps(b, _mm256_loadu_ps(p + i + 8));
        }
        a = _mm256_max_ps(a, b);
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        *m = _mm_cvtss_f32(h);
    }
    return i;
}

/* f16 -> f32, 8 at a time from i. */
static inline int64_t f16_to_f32_8(float *dst, const uint16_t *src, int64_t n, int64_t i) {
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8_f16(src + i));
    return i;
}

/* store_f16's vector part (vcvtps2ph, round to nearest even). */
static inline int f32_to_f16_vec(uint16_t *dst, const float *src, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    return i;
}

static inline int swiglu_vec(float *a, const float *g, const float *u, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv));
        __m256 s = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
        _mm256_storeu_ps(a + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
    }
    return i;
}

static inline int geglu_vec(float *a, const float *g, const float *u, int n, float c, float c3) {
    int i = 0;
    const __m256 cv = _mm256_set1_ps(c), c3v = _mm256_set1_ps(c3), one = _mm256_set1_ps(1.0f);
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 z = _mm256_mul_ps(cv, _mm256_fmadd_ps(_mm256_mul_ps(c3v, gv), _mm256_mul_ps(gv, gv), gv));
        __m256 s = _mm256_div_ps(gv, _mm256_add_ps(one, exp8(z)));
        _mm256_storeu_ps(a + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
    }
    return i;
}

static inline int64_t softcap_vec(float *x, int64_t n, float cap, float inv) {
    int64_t i = 0;
    const __m256 two_inv = _mm256_set1_ps(2.0f * inv), one = _mm256_set1_ps(1.0f), two = _mm256_set1_ps(2.0f);
    const __m256 capv = _mm256_set1_ps(cap);
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp8(_mm256_mul_ps(_mm256_loadu_ps(x + i), two_inv));
        __m256 t = _mm256_sub_ps(one, _mm256_div_ps(two, _mm256_add_ps(one, e)));
        _mm256_storeu_ps(x + i, _mm256_mul_ps(capv, t));
    }
    return i;
}

#endif
