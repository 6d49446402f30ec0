/* llama_step.c: one llama-family decode step (batch 1) in a single call: embedding row to logits.
 *
 * Owns: the math of llama/model.py's forward for one token at position pos, for every
 * architecture that forward serves (llama, qwen2, qwen3, gemma3), against the same weights
 * (raw GGUF blocks or fp32, through gemv in qgemv.c), the same RoPE tables (half-split
 * rotation, rows already un-permuted by the loader; sliding layers have their own) and the
 * session's own K/V buffers, one [2 (K, V), Hkv, rows, D] per layer, f32 or f16 (the new K/V
 * rows are written in place, rounded to nearest-even f16 in an f16 buffer; attention converts
 * each row as it reads it, with F16C in the vector builds, so the cache is never converted as
 * a whole). What differs between architectures is a field of the table (ds4k.h), as in the
 * torch forward: an embedding scale, q/k/v biases, per-head q/k RMSNorm, norms after
 * attention and after the FFN, SwiGLU or GeGLU, the query scale, final logit soft-capping,
 * and sliding-window layers, whose K/V is a ring of the last `rows` positions (position p at
 * slot p % rows). Leaves to callers (llama_step.py): building the model table, the per-layer
 * K/V pointers, checks, serializing calls. Compiled once per ISA by isa.c; the vector paths
 * below are AVX2 in both vector builds, except attention's AVX-512 ones.
 *
 * Why one call: the math per token is ~135M multiply-adds on SmolLM2, ~4 ms; the same step
 * as ~600 torch ops costs ~3 ms of dispatch on top (Gemma 3 270M: docs/perf-archive.md). One C call
 * also releases the GIL for the whole token, so the UI thread keeps running.
 *
 * Attention splits each KV head's positions into blocks of ATT_BLOCK positions, doubled up
 * to ATT_BLOCK_MAX while a layer keeps ATT_MIN_CHUNKS of them (one pool chunk each), then
 * merges the blocks' (max, sum, output) with the usual log-sum-exp rescaling. Inside a
 * block, K and V are read in tiles of ATT_TILE rows, converted to f32 once for all G query
 * heads of the group (AVX-512 FMAs in the AVX-512 build, AVX2 in the other); the AVX-512
 * build reads V instead once per row for all G heads, converting in registers
 * (weighted_sums). Block bounds depend only on pos, a ring's size and the head count, so
 * results do not depend on the thread count. A ring's rows are read in slot order, not
 * position order; softmax is order-free, so only the rounding of the sums differs from the
 * torch forward's.
 */

#define ATT_BLOCK 256      /* positions per block: the smallest, and the workspace's sizing */
#define ATT_BLOCK_MAX 1024 /* blocks double while the layer keeps >= ATT_MIN_CHUNKS of them */
#define ATT_MIN_CHUNKS 16
#define MAX_GROUP 16
#define MAX_HEAD_DIM 256
#define ATT_INLINE_WORK 32768 /* query x key multiply-adds below which attention runs on the caller */

/* How many parts a fused matrix has: those before the first empty one. */
static int nparts_of(const ds4k_mat *parts) {
    int n = 0;
    while (n < DS4K_MAX_PARTS && parts[n].rows > 0) n++;
    return n;
}

/* ---------------------------------------------------------------- vector math */


static float dot(const float *a, const float *b, int n) {
    int i = 0;
    float s = 0.0f;
#if DS4K_AVX2
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    s = hsum8(_mm256_add_ps(acc0, acc1));
#endif
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* p[i] = exp(p[i] - m); returns the sum. */
static float exp_shift_sum(float *p, int n, float m) {
    int i = 0;
    float s = 0.0f;
#if DS4K_AVX2
    __m256 acc = _mm256_setzero_ps(), mv = _mm256_set1_ps(m);
#if DS4K_ISA >= 2
    __m512 acc16 = _mm512_setzero_ps(), mv16 = _mm512_set1_ps(m);
    for (; i + 16 <= n; i += 16) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(p + i), mv16));
        _mm512_storeu_ps(p + i, e);
        acc16 = _mm512_add_ps(acc16, e);
    }
    acc = _mm256_add_ps(_mm512_castps512_ps256(acc16),
                        _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc16), 1)));
#endif
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p + i), mv));
        _mm256_storeu_ps(p + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    s = hsum8(acc);
#endif
    for (; i < n; i++) s += (p[i] = expf(p[i] - m));
    return s;
}

/* y += a * x */
static void axpy(float *y, float a, const float *x, int n) {
    int i = 0;
#if DS4K_AVX2
    __m256 av = _mm256_set1_ps(a);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
#endif
    for (; i < n; i++) y[i] += a * x[i];
}

/* out = x * rsqrt(mean(x^2) + eps) * w, like torch's F.rms_norm in fp32. */
static void rms_norm(float *out, const float *x, const float *w, int n, float eps) {
    float ss = dot(x, x, n);
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * r * w[i];
}

/* HF rotate_half on one head: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin). */
static void rope(float *x, const float *cos_row, const float *sin_row, int d) {
    int half = d / 2;
    for (int i = 0; i < half; i++) {
        float a = x[i], b = x[i + half], c = cos_row[i], s = sin_row[i];
        x[i] = a * c - b * s;
        x[i + half] = b * c + a * s;
    }
}

/* a[i] = silu(g[i]) * u[i] */
static void swiglu(float *a, const float *g, const float *u, int n) {
    int i = 0;
#if DS4K_AVX2
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv));
        __m256 s = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
        _mm256_storeu_ps(a + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
    }
#endif
    for (; i < n; i++) a[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* a[i] = gelu_tanh(g[i]) * u[i], through 0.5 (1 + tanh(z)) = 1 / (1 + exp(-2z)):
 * gelu_tanh(g) = g / (1 + exp(-2 sqrt(2/pi) (g + 0.044715 g^3))). */
static void geglu(float *a, const float *g, const float *u, int n) {
    const float c = -2.0f * 0.7978845608028654f, c3 = 0.044715f;
    int i = 0;
#if DS4K_AVX2
    const __m256 cv = _mm256_set1_ps(c), c3v = _mm256_set1_ps(c3), one = _mm256_set1_ps(1.0f);
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 z = _mm256_mul_ps(cv, _mm256_fmadd_ps(_mm256_mul_ps(c3v, gv), _mm256_mul_ps(gv, gv), gv));
        __m256 s = _mm256_div_ps(gv, _mm256_add_ps(one, exp8(z)));
        _mm256_storeu_ps(a + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
    }
#endif
    for (; i < n; i++) a[i] = g[i] / (1.0f + expf(c * (g[i] + c3 * g[i] * g[i] * g[i]))) * u[i];
}

/* x[i] = cap * tanh(x[i] / cap), tanh(y) = 1 - 2 / (1 + exp(2y)) (exp8 clamps: +-1 at the ends). */
static void softcap(float *x, int64_t n, float cap) {
    const float inv = 1.0f / cap;
    int64_t i = 0;
#if DS4K_AVX2
    const __m256 two_inv = _mm256_set1_ps(2.0f * inv), one = _mm256_set1_ps(1.0f), two = _mm256_set1_ps(2.0f);
    const __m256 capv = _mm256_set1_ps(cap);
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp8(_mm256_mul_ps(_mm256_loadu_ps(x + i), two_inv));
        __m256 t = _mm256_sub_ps(one, _mm256_div_ps(two, _mm256_add_ps(one, e)));
        _mm256_storeu_ps(x + i, _mm256_mul_ps(capv, t));
    }
#endif
    for (; i < n; i++) x[i] = cap * tanhf(x[i] * inv);
}

/* ---------------------------------------------------------------- f16 K/V rows */

/* f32 -> f16, round to nearest even (what F16C's vcvtps2ph and torch's .half() do). */
static inline uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds past 65504: infinity */
    if (ax < 0x38800000u) { /* below 2^-14: a subnormal f16; adding 0.5 rounds to its 2^-24 grid */
        float a, r;
        uint32_t ri;
        memcpy(&a, &ax, 4);
        r = a + 0.5f;
        memcpy(&ri, &r, 4);
        return (uint16_t)(sign | (ri - 0x3f000000u));
    }
    /* rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even */
    return (uint16_t)(sign | ((ax + 0xc8000fffu + ((ax >> 13) & 1u)) >> 13));
}

static void store_f16(uint16_t *dst, const float *src, int n) {
    int i = 0;
#if DS4K_AVX2
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
    for (; i < n; i++) dst[i] = f32_to_f16(src[i]);
}

#if DS4K_AVX2
static inline __m256 load8_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
#endif

/* ---------------------------------------------------------------- attention */

#define ATT_TILE 32 /* K rows converted to f32 at once (32 x 256 floats at most: L1-sized); 16 ran ~10% slower at D 64 */

typedef struct {
    const float *q;        /* [Hq, D], roped and scaled */
    const void *k, *v;     /* this layer's [Hkv, ctx, D], float or f16 (uint16_t) */
    int64_t ctx, n, nblk, block; /* n: positions 0..n-1 are live; nblk blocks of `block` */
    int g, d, f16;
    float *part;           /* [Hkv, nblk, G, D + 2]: max, sum, unnormalized output */
} att_job;

#if DS4K_AVX2
/* [sum(a0), ..., sum(a7)]: eight dot products finished with one hadd tree instead of
 * eight horizontal sums. */
static inline __m256 reduce8(const __m256 *a) {
    __m256 h01 = _mm256_hadd_ps(a[0], a[1]), h23 = _mm256_hadd_ps(a[2], a[3]);
    __m256 h45 = _mm256_hadd_ps(a[4], a[5]), h67 = _mm256_hadd_ps(a[6], a[7]);
    __m256 h0123 = _mm256_hadd_ps(h01, h23), h4567 = _mm256_hadd_ps(h45, h67);
    return _mm256_add_ps(_mm256_permute2f128_ps(h0123, h4567, 0x20),
                         _mm256_permute2f128_ps(h0123, h4567, 0x31));
}
#endif

#if DS4K_ISA >= 2
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
#endif

/* s[t] = q . k_t for nt rows of k (f32, row stride d). */
static void scores(float *s, const float *q, const float *k, int nt, int d) {
    int t = 0;
#if DS4K_ISA >= 2
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
#endif
#if DS4K_AVX2
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
#endif
    for (; t < nt; t++) s[t] = dot(q, k + (int64_t)t * d, d);
}

/* out[d] += sum_t p[t] v_t for nt rows of v (f32). Even and odd rows go to two sets of
 * accumulators, kept in registers across the rows: one set alone is a chain of dependent
 * FMAs, which runs at half the FMA units' rate. */
static void weighted_sum(float *out, const float *p, const float *v, int nt, int d) {
    int i0 = 0;
#if DS4K_ISA >= 2
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
#endif
#if DS4K_AVX2
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
#endif
    for (int t = 0; t < nt; t++)
        for (int i = i0; i < d; i++) out[i] += p[t] * v[(int64_t)t * d + i];
}

/* max(p[0..n-1]); a serial compare chain here took as long as a block's scores. */
static float max_of(const float *p, int n) {
    int i = 0;
    float m = -INFINITY;
#if DS4K_AVX2
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
        m = _mm_cvtss_f32(h);
    }
#endif
    for (; i < n; i++) m = p[i] > m ? p[i] : m;
    return m;
}

/* f32 copies of n f16 values (F16C in the vector builds). */
static void load_f16(float *dst, const uint16_t *src, int64_t n) {
    int64_t i = 0;
#if DS4K_ISA >= 2
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
#endif
#if DS4K_AVX2
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8_f16(src + i));
#endif
    for (; i < n; i++) dst[i] = ds4k_f16_to_f32(src[i]);
}

/* Rows t0..t0+nt-1 of one K or V plane as f32: the rows themselves, or (f16) converted into
 * tile. Converting a tile once for all G query heads of the group, rather than once per
 * head, is what keeps attention at depth near the memory's speed. */
static const float *rows_f32(const att_job *j, const void *plane, int64_t off, int nt, float *tile) {
    if (!j->f16) return (const float *)plane + off;
    load_f16(tile, (const uint16_t *)plane + off, (int64_t)nt * j->d);
    return tile;
}

/* Ask for rows [t, t + ATT_TILE) of a plane ahead of use: the hardware prefetcher alone left
 * the tile conversion waiting on memory about as long as all of the block's arithmetic. */
#define ATT_PREFETCH_TILES 2
static void prefetch_tile(const att_job *j, const void *plane, int64_t h, int64_t t, int64_t t_end) {
    if (t >= t_end) return;
    const int64_t nt = t_end - t < ATT_TILE ? t_end - t : ATT_TILE, elem = j->f16 ? 2 : 4;
    const char *p = (const char *)plane + (h * j->ctx + t) * j->d * elem;
    for (int64_t b = 0; b < nt * j->d * elem; b += 64) __builtin_prefetch(p + b, 0, 3);
}

#if DS4K_ISA >= 2
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
#endif

static void att_chunk(void *vctx, int64_t c) {
    const att_job *j = (const att_job *)vctx;
    const int64_t h = c / j->nblk, blk = c % j->nblk;
    const int64_t t0 = blk * j->block, t1 = t0 + j->block < j->n ? t0 + j->block : j->n;
    const int nt = (int)(t1 - t0), d = j->d, G = j->g;
    float p[MAX_GROUP][ATT_BLOCK_MAX];
    float tile[ATT_TILE * MAX_HEAD_DIM];
    float *out[MAX_GROUP];
    for (int g = 0; g < G; g++) out[g] = j->part + ((h * j->nblk + blk) * G + g) * (d + 2);
    /* scores of every query head of the group, one K tile at a time */
    for (int r = 0; r < ATT_PREFETCH_TILES * ATT_TILE; r += ATT_TILE) prefetch_tile(j, j->k, h, t0 + r, t1);
    for (int r = 0; r < nt; r += ATT_TILE) {
        const int m = nt - r < ATT_TILE ? nt - r : ATT_TILE;
        /* the tile after next: K rows, then the first V rows once K runs out */
        const int64_t ahead = t0 + r + ATT_PREFETCH_TILES * ATT_TILE;
        if (ahead < t1) prefetch_tile(j, j->k, h, ahead, t1);
        else prefetch_tile(j, j->v, h, ahead - nt, t1);
        const float *k = rows_f32(j, j->k, (h * j->ctx + t0 + r) * d, m, tile);
        for (int g = 0; g < G; g++) scores(p[g] + r, j->q + (h * G + g) * d, k, m, d);
    }
    for (int g = 0; g < G; g++) {
        const float mx = max_of(p[g], nt);
        out[g][0] = mx;
        out[g][1] = exp_shift_sum(p[g], nt, mx);
        memset(out[g] + 2, 0, sizeof(float) * (size_t)d);
    }
#if DS4K_ISA >= 2
    if (d % 64 == 0 && G >= 2) { /* one head alone gains nothing from sharing its V loads */
        float *o2[MAX_GROUP];
        for (int g = 0; g < G; g++) o2[g] = out[g] + 2;
        weighted_sums(o2, p, (const char *)j->v + (h * j->ctx + t0) * d * (j->f16 ? 2 : 4), j->f16, nt, d, G,
                      ATT_PREFETCH_TILES * ATT_TILE);
        return;
    }
#endif
    /* outputs, one V tile at a time */
    for (int r = 0; r < nt; r += ATT_TILE) {
        const int m = nt - r < ATT_TILE ? nt - r : ATT_TILE;
        prefetch_tile(j, j->v, h, t0 + r + ATT_PREFETCH_TILES * ATT_TILE, t1);
        const float *v = rows_f32(j, j->v, (h * j->ctx + t0 + r) * d, m, tile);
        for (int g = 0; g < G; g++) weighted_sum(out[g] + 2, p[g] + r, v, m, d);
    }
}

/* att[Hq, D] = softmax(q k^T) v over positions 0..n-1, grouped: query head h*G+g uses KV
 * head h (llama.py's q.reshape(S, Hkv, G, D) order). */
static void attention(const ds4k_llama *m, float *att, const float *q, const void *k,
                      const void *v, int f16, int64_t ctx, int64_t n, float *part, int nth) {
    const int hkv = m->n_kv_heads, g = m->n_heads / m->n_kv_heads, d = m->head_dim;
    /* Longer blocks where there are plenty: each block is a chunk whose K and V streams
     * start cold, and with 2 threads a thread's blocks are not adjacent (SmolLM2 at 4K, 2
     * threads: attention alone 3.1 -> 2.4 ms, the step 6.0 -> 5.6 ms with 512-row blocks).
     * The size depends on n and the head count only, never on the thread count. */
    int64_t block = ATT_BLOCK;
    while (2 * block <= ATT_BLOCK_MAX && hkv * ((n + 2 * block - 1) / (2 * block)) >= ATT_MIN_CHUNKS) block *= 2;
    att_job j = {q, k, v, ctx, n, (n + block - 1) / block, block, g, d, f16, part};
    /* At a short context the whole attention is a few microseconds: waking the pool for it
     * costs more than it saves (the chunks, hence the results, are the same either way). */
    const int small = n * hkv * d * g < ATT_INLINE_WORK;
    ds4k_run_chunks(att_chunk, &j, hkv * j.nblk, small ? 1 : nth);
    for (int h = 0; h < hkv; h++) {
        for (int gi = 0; gi < g; gi++) {
            float *o = att + (h * g + gi) * d;
            float mx = -INFINITY, sum = 0.0f;
            for (int64_t b = 0; b < j.nblk; b++) {
                float bm = part[((h * j.nblk + b) * g + gi) * (d + 2)];
                if (bm > mx) mx = bm;
            }
            memset(o, 0, sizeof(float) * (size_t)d);
            for (int64_t b = 0; b < j.nblk; b++) {
                const float *pb = part + ((h * j.nblk + b) * g + gi) * (d + 2);
                float w = expf(pb[0] - mx);
                sum += pb[1] * w;
                axpy(o, w, pb + 2, d);
            }
            float inv = 1.0f / sum;
            for (int i = 0; i < d; i++) o[i] *= inv;
        }
    }
}

/* ---------------------------------------------------------------- the step */

/* Floats of workspace ds4k_llama_step needs when a layer holds at most `ctx` K/V rows. */
static int64_t llama_workspace(const ds4k_llama *m, int64_t ctx) {
    const int64_t h = m->hidden, d = m->head_dim, hq = m->n_heads, hkv = m->n_kv_heads;
    const int64_t nblk = (ctx + ATT_BLOCK - 1) / ATT_BLOCK;
    int64_t wide = (hq + 2 * hkv) * d;
    if (2 * (int64_t)m->inter > wide) wide = 2 * (int64_t)m->inter;
    return 3 * h + wide + hq * d + m->inter + hkv * nblk * (hq / hkv) * (d + 2);
}

/* Run `token` at position pos. kv[i] is layer i's K/V buffer [2 (K, V), Hkv, rows[i], D],
 * float or f16 when kv_f16: a global layer's rows are positions (valid below pos on entry),
 * a sliding layer's a ring holding position p at slot p % rows[i] (the caller makes rows[i]
 * min(window, context), so the live rows are exactly the window). Writes the token's K/V
 * rows (global layers' not with DS4K_STEP_FROZEN_GLOBAL), and logits [vocab] unless logits
 * is NULL (then the last layer stops after its K/V, as llama.py does). Returns 0, or -1 for
 * bad arguments or shapes. */
static int llama_step(const ds4k_llama *m, void *const *kv, const int64_t *rows, int kv_f16, int64_t pos,
                      int32_t token, int flags, float *logits, float *ws, int nth) {
    const int hdim = m->hidden, d = m->head_dim, hq = m->n_heads, hkv = m->n_kv_heads, f = m->inter;
    if (pos < 0 || pos >= m->rope_rows || token < 0 || token >= m->vocab) return -1;
    if (hkv <= 0 || hq % hkv || hq / hkv > MAX_GROUP || d > MAX_HEAD_DIM || d % 2) return -1;
    if (m->act != DS4K_ACT_SILU && m->act != DS4K_ACT_GELU_TANH) return -1;
    for (int i = 0; i < m->n_layers; i++)
        if (kv[i] == NULL || rows[i] <= 0 || (!m->layers[i].sliding && pos >= rows[i])) return -1;
    float *x = ws, *hb = x + hdim, *tmp = hb + hdim;
    float *wide = tmp + hdim;                    /* qkv [(Hq + 2 Hkv) D] or gate|up [2F] */
    const int64_t nqkv = (int64_t)(hq + 2 * hkv) * d;
    int64_t wide_n = nqkv > 2 * (int64_t)f ? nqkv : 2 * (int64_t)f;
    float *att = wide + wide_n, *act = att + hq * d, *part = act + f;
    const int64_t rope_off = pos * (d / 2);
    const float scale = m->attn_scale > 0.0f ? m->attn_scale : 1.0f / sqrtf((float)d);

    memcpy(x, m->embed + (int64_t)token * hdim, sizeof(float) * (size_t)hdim);
    if (m->embed_scale != 1.0f)
        for (int e = 0; e < hdim; e++) x[e] *= m->embed_scale;
    for (int i = 0; i < m->n_layers; i++) {
        const ds4k_layer *L = &m->layers[i];
        const int64_t cap = rows[i];
        const int64_t slot = L->sliding ? pos % cap : pos;
        const int64_t live = L->sliding && pos + 1 > cap ? cap : pos + 1;
        const int64_t plane = (int64_t)hkv * cap * d; /* one of K or V of this layer */
        float *kc = (float *)kv[i], *vc = kc + plane;
        uint16_t *kch = (uint16_t *)kv[i], *vch = kch + plane;
        const float *cos_row = (L->sliding ? m->local_cos : m->rope_cos) + rope_off;
        const float *sin_row = (L->sliding ? m->local_sin : m->rope_sin) + rope_off;
        rms_norm(hb, x, L->attn_norm, hdim, m->eps);
        if (gemv(L->qkv, nparts_of(L->qkv), hb, wide, hdim, nth)) return -1;
        if (L->bqkv)
            for (int64_t e = 0; e < nqkv; e++) wide[e] += L->bqkv[e];
        if (L->q_norm) /* per head, before RoPE; in place (rms_norm reads all of x first) */
            for (int h = 0; h < hq + hkv; h++)
                rms_norm(wide + h * d, wide + h * d, h < hq ? L->q_norm : L->k_norm, d, m->eps);
        for (int h = 0; h < hq + hkv; h++) rope(wide + h * d, cos_row, sin_row, d);
        if (L->sliding || !(flags & DS4K_STEP_FROZEN_GLOBAL)) {
            for (int h = 0; h < hkv; h++) {
                const int64_t row = ((int64_t)h * cap + slot) * d;
                if (kv_f16) {
                    store_f16(kch + row, wide + (hq + h) * d, d);
                    store_f16(vch + row, wide + (hq + hkv + h) * d, d);
                } else {
                    memcpy(kc + row, wide + (hq + h) * d, sizeof(float) * (size_t)d);
                    memcpy(vc + row, wide + (hq + hkv + h) * d, sizeof(float) * (size_t)d);
                }
            }
        }
        if (i == m->n_layers - 1 && logits == NULL) return 0;
        for (int e = 0; e < hq * d; e++) wide[e] *= scale; /* llama.py scales q, not scores */
        /* A ring's live rows are in slot order, not position order: softmax does not mind. */
        attention(m, att, wide, kv_f16 ? (const void *)kch : (const void *)kc,
                  kv_f16 ? (const void *)vch : (const void *)vc, kv_f16, cap, live, part, nth);
        if (gemv(&L->o, 1, att, tmp, (int64_t)hq * d, nth)) return -1;
        if (L->post_attn_norm) rms_norm(tmp, tmp, L->post_attn_norm, hdim, m->eps);
        for (int e = 0; e < hdim; e++) x[e] += tmp[e];
        rms_norm(hb, x, L->ffn_norm, hdim, m->eps);
        if (gemv(L->w13, nparts_of(L->w13), hb, wide, hdim, nth)) return -1;
        if (m->act == DS4K_ACT_GELU_TANH) geglu(act, wide, wide + f, f);
        else swiglu(act, wide, wide + f, f);
        if (gemv(&L->w2, 1, act, tmp, f, nth)) return -1;
        if (L->post_ffn_norm) rms_norm(tmp, tmp, L->post_ffn_norm, hdim, m->eps);
        for (int e = 0; e < hdim; e++) x[e] += tmp[e];
    }
    rms_norm(hb, x, m->norm, hdim, m->eps);
    if (gemv(&m->head, 1, hb, logits, hdim, nth)) return -1;
    if (m->softcap > 0.0f) softcap(logits, m->vocab, m->softcap);
    return 0;
}
