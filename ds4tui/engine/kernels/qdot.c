/* qdot.c: products with the activation quantized to 8 bits and integer dot products, as
 * ds4's CPU path (and llama.cpp) runs DeepSeek V4's quantized matrices.
 *
 * Owns two activation formats and the weight types that pair with them:
 * - Q8_K (256 values: float d, int8 q[256], int16 sums of each 16): for Q2_K, IQ2_XXS and
 *   Q4_K rows. d = max / -127 where max is the value of largest magnitude, q = rint(x / d)
 *   (ds4's ds4_quantize_row_q8_K, llama.cpp's quantize_row_q8_K_ref);
 * - Q8A (32 values: float d, int8 q[32]): for Q8_0 rows. d = max|x| / 127, q = rint(x / d)
 *   (ds4's quantize_q8_0_activation; a float scale where llama.cpp's Q8_0 has an f16 one).
 * Each block's dot product is an exact integer sum (any order, any ISA), combined into the
 * float result in one fixed order with ds4's scalar formulas:
 *   Q2_K:    s += (dx dw) isum - (dx dmin) Σ bsum_j m_j        per 256-block
 *   IQ2_XXS: s += (dw dx) Σ_sub (2 scale + 1) isum_sub;  result 0.125 s
 *   Q4_K:    s += (dw dx) Σ_sub sc_j isum_j - (dmin dx) Σ_sub m_j (bsum pair)
 *   Q8_0:    s += (dw dx) isum                              per 32-block
 * so scalar, AVX2 and AVX-512 give bit-identical results (no FMA in the float steps:
 * -ffp-contract=off), equal to ds4's non-NEON CPU path for the same inputs.
 * qdot_gemv / qdot_gemm quantize x (each row of X) once per call and run the rows in
 * chunks on the pool; a type without an integer path returns -1 (callers use gemv).
 * Included by isa.c after dequant.c (its IQ2_XXS grid and sign tables).
 */

typedef struct {
    float d;
    int8_t qs[256];
    int16_t bsums[16];
} q8k_block;

typedef struct {
    float d;
    int8_t qs[32];
} q8a_block;

_Static_assert(sizeof(q8k_block) == 292, "Q8_K block is 292 bytes");
_Static_assert(sizeof(q8a_block) == 36, "Q8A block is 36 bytes");

static void q8k_quantize(const float *x, q8k_block *y, int64_t n) {
    for (int64_t b = 0; b < n / 256; b++, x += 256) {
        float max = 0.0f, amax = 0.0f;
        for (int j = 0; j < 256; j++) {
            const float ax = fabsf(x[j]);
            if (ax > amax) amax = ax, max = x[j];
        }
        if (amax == 0.0f) {
            memset(&y[b], 0, sizeof(y[b]));
            continue;
        }
        const float iscale = -127.0f / max;
        for (int j = 0; j < 256; j++) {
            int v = (int)lrintf(iscale * x[j]);
            y[b].qs[j] = (int8_t)(v > 127 ? 127 : v < -128 ? -128 : v);
        }
        for (int j = 0; j < 16; j++) {
            int s = 0;
            for (int i = 0; i < 16; i++) s += y[b].qs[j * 16 + i];
            y[b].bsums[j] = (int16_t)s;
        }
        y[b].d = 1.0f / iscale;
    }
}

static void q8a_quantize(const float *x, q8a_block *y, int64_t n) {
    for (int64_t b = 0; b < n / 32; b++, x += 32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) {
            const float ax = fabsf(x[j]);
            if (ax > amax) amax = ax;
        }
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = d;
        for (int j = 0; j < 32; j++) {
            int v = (int)lrintf(x[j] * id);
            y[b].qs[j] = (int8_t)(v > 127 ? 127 : v < -128 ? -128 : v);
        }
    }
}

/* ---------------------------------------------------------------- integer block sums
 *
 * A 256-weight block (Q2_K, IQ2_XXS, Q4_K) is decoded once into signed bytes w with an
 * integer scale per 16 weights (and, for Q2_K and Q4_K, an integer min per 16), then dotted
 * with every activation row of the product: isum = Σ_j sc_j Σ_16 w q, minsum = Σ_j m_j
 * bsum_j. Both are exact, so decoding once for many rows changes no bit. */

#if DS4K_ISA >= 1
static inline int32_t hsum_i32x8(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}
/* the four sums of v0..v3 at once */
static inline __m128i hsum4_i32x8(__m256i v0, __m256i v1, __m256i v2, __m256i v3) {
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(v0, v1), _mm256_hadd_epi32(v2, v3));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}
typedef struct {
    __m256i aw[8], sw[8], sc[8]; /* |w| (or w), the sign source, int16 scales (lanes 0-7, 8-15) */
    __m256i mins;                /* 16 int16 mins */
    int sign, has_min;
} kblock;
/* int16 lanes 0-7 = v[2k], 8-15 = v[2k+1] for a 16-byte vector of small values */
static inline __m256i pair_scales(__m128i v16, int k) {
    const __m128i idx = _mm_setr_epi8((char)(2 * k), (char)(2 * k), (char)(2 * k), (char)(2 * k), (char)(2 * k), (char)(2 * k),
                                      (char)(2 * k), (char)(2 * k), (char)(2 * k + 1), (char)(2 * k + 1), (char)(2 * k + 1),
                                      (char)(2 * k + 1), (char)(2 * k + 1), (char)(2 * k + 1), (char)(2 * k + 1), (char)(2 * k + 1));
    return _mm256_cvtepu8_epi16(_mm_shuffle_epi8(v16, idx));
}
#else
typedef struct {
    int8_t w[256];
    int16_t sc[16], mins[16];
    int sign, has_min;
} kblock;
#endif

/* Q2_K (84 bytes: scales[16] = scale | min << 4, qs[64], d, dmin): weight 128c + 32k + i is
 * bits 2k..2k+1 of qs[32c + i]; sub-block j of 16 has scale and min j. */
static inline void decode_q2_k(const uint8_t *p, kblock *kb) {
    kb->sign = 0, kb->has_min = 1;
#if DS4K_ISA >= 1
    const __m128i raw = _mm_loadu_si128((const __m128i *)p);
    const __m128i sc = _mm_and_si128(raw, _mm_set1_epi8(15));
    kb->mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(15)));
    const __m256i m3 = _mm256_set1_epi8(3);
    for (int c = 0; c < 2; c++) {
        const __m256i bits = _mm256_loadu_si256((const __m256i *)(p + 16 + 32 * c));
        for (int k = 0; k < 4; k++) {
            kb->aw[4 * c + k] = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * k), m3);
            kb->sc[4 * c + k] = pair_scales(sc, 4 * c + k);
        }
    }
#else
    for (int j = 0; j < 16; j++) kb->sc[j] = p[j] & 15, kb->mins[j] = p[j] >> 4;
    for (int c = 0; c < 2; c++)
        for (int k = 0; k < 4; k++)
            for (int i = 0; i < 32; i++) kb->w[128 * c + 32 * k + i] = (int8_t)((p[16 + 32 * c + i] >> (2 * k)) & 3);
#endif
}

/* IQ2_XXS (66 bytes: d, then per sub-block of 32 two u32: four grid indices; four 7-bit sign
 * fields and the 4-bit scale s): w = grid * sign, both 16-halves of sub-block ib scaled 2s + 1. */
static inline void decode_iq2_xxs(const uint8_t *p, kblock *kb) {
    kb->sign = 1, kb->has_min = 0;
    for (int ib = 0; ib < 8; ib++) {
        uint32_t a0, a1;
        memcpy(&a0, p + 2 + 8 * ib, 4);
        memcpy(&a1, p + 6 + 8 * ib, 4);
        const int ls = 2 * (int)(a1 >> 28) + 1;
#if DS4K_ISA >= 1
        const __m256i g = _mm256_setr_epi64x((long long)iq2xxs_grid[a0 & 255], (long long)iq2xxs_grid[(a0 >> 8) & 255],
                                             (long long)iq2xxs_grid[(a0 >> 16) & 255], (long long)iq2xxs_grid[a0 >> 24]);
        const __m256i m = _mm256_setr_epi64x((long long)iq2xxs_signs[a1 & 127], (long long)iq2xxs_signs[(a1 >> 7) & 127],
                                             (long long)iq2xxs_signs[(a1 >> 14) & 127], (long long)iq2xxs_signs[(a1 >> 21) & 127]);
        kb->aw[ib] = g;
        kb->sw[ib] = _mm256_or_si256(m, _mm256_set1_epi8(1)); /* -1 where negative, +1 elsewhere */
        kb->sc[ib] = _mm256_set1_epi16((short)ls);
#else
        for (int l = 0; l < 4; l++) {
            const uint64_t g = iq2xxs_grid[(a0 >> (8 * l)) & 255], m = iq2xxs_signs[(a1 >> (7 * l)) & 127];
            for (int j = 0; j < 8; j++) {
                const int v = (int)((g >> (8 * j)) & 255);
                kb->w[32 * ib + 8 * l + j] = (int8_t)(((m >> (8 * j)) & 1) ? -v : v);
            }
        }
        kb->sc[2 * ib] = kb->sc[2 * ib + 1] = (int16_t)ls;
#endif
    }
}

/* Q4_K (144 bytes: d, dmin, 12 bytes of 6-bit scales and mins for 8 sub-blocks of 32,
 * qs[128]: sub-blocks 2c and 2c+1 are the low and high nibbles of qs[32c..32c+31]). */
static inline void q4k_scales(const uint8_t *s, uint8_t *sc, uint8_t *mn) {
    for (int j = 0; j < 4; j++) sc[j] = s[j] & 63, mn[j] = s[j + 4] & 63;
    for (int j = 4; j < 8; j++) {
        sc[j] = (uint8_t)((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4));
        mn[j] = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

static inline void decode_q4_k(const uint8_t *p, kblock *kb) {
    kb->sign = 0, kb->has_min = 1;
    uint8_t sc[8], mn[8], sc16[16], mn16[16];
    q4k_scales(p + 4, sc, mn);
    for (int j = 0; j < 16; j++) sc16[j] = sc[j / 2], mn16[j] = mn[j / 2];
#if DS4K_ISA >= 1
    const __m128i s = _mm_loadu_si128((const __m128i *)sc16);
    kb->mins = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)mn16));
    const __m256i m4 = _mm256_set1_epi8(15);
    for (int c = 0; c < 4; c++) {
        const __m256i bits = _mm256_loadu_si256((const __m256i *)(p + 16 + 32 * c));
        kb->aw[2 * c] = _mm256_and_si256(bits, m4);
        kb->aw[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
        kb->sc[2 * c] = pair_scales(s, 2 * c);
        kb->sc[2 * c + 1] = pair_scales(s, 2 * c + 1);
    }
#else
    for (int j = 0; j < 16; j++) kb->sc[j] = sc16[j], kb->mins[j] = mn16[j];
    for (int c = 0; c < 4; c++)
        for (int i = 0; i < 32; i++) {
            kb->w[64 * c + i] = (int8_t)(p[16 + 32 * c + i] & 15);
            kb->w[64 * c + 32 + i] = (int8_t)(p[16 + 32 * c + i] >> 4);
        }
#endif
}

static inline int32_t kblock_isum(const kblock *kb, const int8_t *q8) {
#if DS4K_ISA >= 1
    __m256i acc = _mm256_setzero_si256();
    for (int k = 0; k < 8; k++) {
        __m256i x = _mm256_loadu_si256((const __m256i *)(q8 + 32 * k));
        if (kb->sign) x = _mm256_sign_epi8(x, kb->sw[k]);
        /* u8 |w| <= 43 times s8 x: the int16 pair sums are exact */
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(kb->aw[k], x), kb->sc[k]));
    }
    return hsum_i32x8(acc);
#else
    int32_t isum = 0;
    for (int j = 0; j < 16; j++) {
        int32_t s = 0;
        for (int i = 0; i < 16; i++) s += kb->w[16 * j + i] * q8[16 * j + i];
        isum += kb->sc[j] * s;
    }
    return isum;
#endif
}

static inline int32_t kblock_minsum(const kblock *kb, const int16_t *bsums) {
#if DS4K_ISA >= 1
    return hsum_i32x8(_mm256_madd_epi16(kb->mins, _mm256_loadu_si256((const __m256i *)bsums)));
#else
    int32_t s = 0;
    for (int j = 0; j < 16; j++) s += kb->mins[j] * bsums[j];
    return s;
#endif
}

/* One weight row against n Q8_K activation rows (stride in blocks): y[t * ldy] for each t.
 * Per (row, token) the blocks add in order with ds4's formula for the type. */
static void krow(int type, const uint8_t *w, int64_t nb, const q8k_block *x, int64_t xstride, int64_t n,
                 float *y, int64_t ldy) {
    enum { T = 64 };
    const int bb = type == DS4K_Q2_K ? 84 : type == DS4K_IQ2_XXS ? 66 : 144;
    for (int64_t t0 = 0; t0 < n; t0 += T) {
        const int64_t tn = n - t0 < T ? n - t0 : T;
        float acc[T];
        for (int64_t t = 0; t < tn; t++) acc[t] = 0.0f;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *p = w + b * bb;
            kblock kb;
            if (type == DS4K_Q2_K) decode_q2_k(p, &kb);
            else if (type == DS4K_IQ2_XXS) decode_iq2_xxs(p, &kb);
            else decode_q4_k(p, &kb);
            if (type == DS4K_Q2_K) {
                const float dw = h2f(p + 80), dm = h2f(p + 82);
                for (int64_t t = 0; t < tn; t++) {
                    const q8k_block *q = &x[(t0 + t) * xstride + b];
                    const int32_t isum = kblock_isum(&kb, q->qs), summs = kblock_minsum(&kb, q->bsums);
                    const float dall = q->d * dw, dmin = q->d * dm;
                    acc[t] += dall * (float)isum - dmin * (float)summs;
                }
            } else if (type == DS4K_IQ2_XXS) {
                const float dw = h2f(p);
                for (int64_t t = 0; t < tn; t++) {
                    const q8k_block *q = &x[(t0 + t) * xstride + b];
                    acc[t] += dw * q->d * (float)kblock_isum(&kb, q->qs);
                }
            } else {
                const float dw = h2f(p), dm = h2f(p + 2);
                for (int64_t t = 0; t < tn; t++) {
                    const q8k_block *q = &x[(t0 + t) * xstride + b];
                    const int32_t isum = kblock_isum(&kb, q->qs), summs = kblock_minsum(&kb, q->bsums);
                    acc[t] += dw * q->d * (float)isum - dm * q->d * (float)summs;
                }
            }
        }
        for (int64_t t = 0; t < tn; t++) y[(t0 + t) * ldy] = type == DS4K_IQ2_XXS ? 0.125f * acc[t] : acc[t];
    }
}

/* Q8_0 (34 bytes: d, q[32]) against Q8A, block by block in order: acc += (dw dx) isum. */
static float dot_q8_0(const uint8_t *w, const q8a_block *y, int64_t nb) {
    float acc = 0.0f;
    int64_t b = 0;
#if DS4K_ISA >= 1
    const __m256i ones = _mm256_set1_epi16(1);
    for (; b + 4 <= nb; b += 4) {
        __m256i v[4];
        for (int k = 0; k < 4; k++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(w + 34 * (b + k) + 2));
            const __m256i x = _mm256_loadu_si256((const __m256i *)y[b + k].qs);
            /* |q| * (x with q's sign): |q| <= 128, |x| <= 127, so the int16 pairs stay exact */
            v[k] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(x, q)), ones);
        }
        int32_t is[4];
        _mm_storeu_si128((__m128i *)is, hsum4_i32x8(v[0], v[1], v[2], v[3]));
        for (int k = 0; k < 4; k++) acc += h2f(w + 34 * (b + k)) * y[b + k].d * (float)is[k];
    }
#endif
    for (; b < nb; b++) {
        const int8_t *q = (const int8_t *)(w + 34 * b + 2);
        int32_t s = 0;
        for (int i = 0; i < 32; i++) s += q[i] * y[b].qs[i];
        acc += h2f(w + 34 * b) * y[b].d * (float)s;
    }
    return acc;
}

/* ---------------------------------------------------------------- products */

static int qdot_kind(int type) { /* 1: Q8_K activation, 2: Q8A, 0: no integer path */
    return type == DS4K_Q2_K || type == DS4K_IQ2_XXS || type == DS4K_Q4_K ? 1 : type == DS4K_Q8_0 ? 2 : 0;
}

#define QDOT_CHUNK_ROWS 16

typedef struct {
    const ds4k_mat *parts;
    int nparts;
    int64_t cols, n, ldy; /* n activation rows; y[t * ldy + row] */
    const void *xq[2];    /* Q8_K rows, Q8A rows (n each) */
    int64_t xq_stride[2]; /* bytes per activation row */
    int64_t first[DS4K_MAX_PARTS + 1], row0[DS4K_MAX_PARTS];
    float *y;
} qdot_job;

static void qdot_chunk(void *ctx, int64_t c) {
    const qdot_job *j = (const qdot_job *)ctx;
    int k = 0;
    while (c >= j->first[k + 1]) k++;
    const ds4k_mat *m = &j->parts[k];
    const int kind = qdot_kind(m->type) - 1;
    const int64_t rb = ds4k_row_bytes(m->type, j->cols);
    int64_t r0 = (c - j->first[k]) * QDOT_CHUNK_ROWS, r1 = r0 + QDOT_CHUNK_ROWS;
    if (r1 > m->rows) r1 = m->rows;
    /* rows outer, tokens inner: each weight block is decoded once for every row of X, and a
     * chunk's weight rows (16 x <= 18 KB) are read from memory once per product */
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *w = (const uint8_t *)m->w + r * rb;
        float *y = j->y + j->row0[k] + r;
        if (kind == 0) {
            krow(m->type, w, j->cols / 256, (const q8k_block *)j->xq[0], j->cols / 256, j->n, y, j->ldy);
            continue;
        }
        for (int64_t t = 0; t < j->n; t++)
            y[t * j->ldy] = dot_q8_0(w, (const q8a_block *)j->xq[1] + t * (j->cols / 32), j->cols / 32);
    }
}

/* Y[n, rows] = X[n, cols] W^T with X quantized per row; -1 for a type without an integer
 * path, a row length that is not whole blocks, or no memory. */
static int qdot_gemm(const ds4k_mat *parts, int nparts, const float *x, float *y, int64_t cols, int64_t n, int nth) {
    if (nparts < 1 || nparts > DS4K_MAX_PARTS || cols <= 0 || n <= 0) return -1;
    qdot_job job = {.parts = parts, .nparts = nparts, .cols = cols, .n = n, .y = y};
    int need[2] = {0, 0};
    int64_t row = 0;
    for (int k = 0; k < nparts; k++) {
        const ds4k_mat *m = &parts[k];
        const int kind = qdot_kind(m->type);
        if (kind == 0 || ds4k_row_bytes(m->type, cols) == 0 || m->rows <= 0 || m->w == NULL) return -1;
        need[kind - 1] = 1;
        job.row0[k] = row;
        job.first[k + 1] = job.first[k] + (m->rows + QDOT_CHUNK_ROWS - 1) / QDOT_CHUNK_ROWS;
        row += m->rows;
    }
    job.ldy = row;
    job.xq_stride[0] = cols / 256 * (int64_t)sizeof(q8k_block);
    job.xq_stride[1] = cols / 32 * (int64_t)sizeof(q8a_block);
    void *buf[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) {
        if (!need[i]) continue;
        buf[i] = malloc((size_t)(n * job.xq_stride[i]));
        if (buf[i] == NULL) {
            free(buf[0]);
            return -1;
        }
        for (int64_t t = 0; t < n; t++) {
            void *dst = (uint8_t *)buf[i] + t * job.xq_stride[i];
            if (i == 0) q8k_quantize(x + t * cols, (q8k_block *)dst, cols);
            else q8a_quantize(x + t * cols, (q8a_block *)dst, cols);
        }
        job.xq[i] = buf[i];
    }
    ds4k_run_chunks(qdot_chunk, &job, job.first[nparts], nth);
    free(buf[0]);
    free(buf[1]);
    return 0;
}

static int qdot_gemv(const ds4k_mat *parts, int nparts, const float *x, float *y, int64_t cols, int nth) {
    return qdot_gemm(parts, nparts, x, y, cols, 1, nth);
}

/* The activation blocks of x as the products see them (tests): kind 1 Q8_K, 2 Q8A. */
static int qdot_quantize(int kind, const float *x, void *out, int64_t n) {
    if (kind == 1 && n % 256 == 0) q8k_quantize(x, (q8k_block *)out, n);
    else if (kind == 2 && n % 32 == 0) q8a_quantize(x, (q8a_block *)out, n);
    else return -1;
    return 0;
}
