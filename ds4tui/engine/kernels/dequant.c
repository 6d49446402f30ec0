/* dequant.c: GGUF blocks -> fp32, exactly the values gguf.quants.dequantize computes.
 *
 * Owns: dequant_row (one row of any ds4k type; qgemm.c dequantizes its tiles with it),
 * dequant_rows_t32 (32 rows at once, transposed: qgemm.c's long-product layout; vector ISAs) and
 * dequant (whole matrices, exported for tests and fallbacks). The block types run 16 quants
 * at a time on simd.h's vectors (dequant_row_vec; the per-element loops below stay as the
 * plain statement of each format, and for F16/BF16). Every product and sum is
 * one float32 operation in the order gguf's numpy code applies them (no FMA contraction:
 * the build passes -ffp-contract=off), so results are bit-identical on every ISA.
 *
 * Block layouts (GGML's, all little-endian; d, m, dmin are f16):
 *   Q4_0  d, qs[16]                 w_j = d * (q_j - 8); q_j = qs[j] & 15 (j < 16), qs[j-16] >> 4
 *   Q4_1  d, m, qs[16]              w_j = d * q_j + m
 *   Q5_0  d, qh[4], qs[16]          q_j |= bit j of qh << 4; w_j = d * (q_j - 16)
 *   Q5_1  d, m, qh[4], qs[16]       q_j |= bit j of qh << 4; w_j = d * q_j + m
 *   Q8_0  d, qs[32] (int8)          w_j = d * qs[j]
 *   Q4_K  d, dmin, scales[12], qs[128]: 8 sub-blocks of 32 with 6-bit scale sc_i and min
 *         m_i; sub-block 2c / 2c+1 are the low / high nibbles of qs[32c .. 32c+31];
 *         w = (d sc_i) q - (dmin m_i)
 *   Q5_K  d, dmin, scales[12], qh[32], qs[128]: as Q4_K, plus bit i of qh[l] as bit 4 of
 *         element l of sub-block i
 *   Q6_K  ql[128], qh[64], scales[16] (int8), d: element e = 128h + 32s + l (h < 2, s < 4,
 *         l < 32) has low 4 bits from ql[64h + 32(s & 1) + l] (>> 4 when s >= 2), high 2 bits
 *         (qh[32h + l] >> 2s) & 3; w = (d scales[e / 16]) (q - 32)
 */

/* The 6-bit scale and min of sub-block i of a Q4_K/Q5_K block (GGML's get_scale_min_k4). */
static inline void k4_scale_min(const uint8_t *s, int i, uint8_t *sc, uint8_t *mn) {
    if (i < 4) {
        *sc = s[i] & 63;
        *mn = s[i + 4] & 63;
    } else {
        *sc = (uint8_t)((s[i + 4] & 15) | ((s[i - 4] >> 6) << 4));
        *mn = (uint8_t)((s[i + 4] >> 4) | ((s[i] >> 6) << 4));
    }
}

static inline void dq_store(float *p, vf v) {
#if DS4K_ISA >= 2
    _mm512_storeu_ps(p, v);
#elif DS4K_ISA == 1
    _mm256_storeu_ps(p, v.a), _mm256_storeu_ps(p + 8, v.b);
#else
    memcpy(p, v.v, sizeof v.v);
#endif
}

/* out = d * q (+ m) for 16 quants: one multiply and one add, rounded apart, as numpy does. */
static inline void dq_put(float *out, vf q, float d, int has_m, float m) {
    vf w = vf_mul(vf_set1(d), q);
    dq_store(out, has_m ? vf_add(w, vf_set1(m)) : w);
}

/* The block types 16 quants at a time (simd.h), the same operations as the scalar loops of
 * dequant_row below, so the same bits; 0 for a type it leaves to them. */
static int dequant_row_vec(int type, const uint8_t *p, int64_t cols, float *out) {
    const int qk = ds4k_block_weights(type), bs = ds4k_block_bytes(type);
    switch (type) {
    case DS4K_Q4_0: case DS4K_Q4_1: case DS4K_Q5_0: case DS4K_Q5_1: case DS4K_Q8_0:
    case DS4K_Q4_K: case DS4K_Q5_K: case DS4K_Q6_K: break;
    default: return 0;
    }
    for (int64_t b = 0; b < cols / qk; b++, p += bs, out += qk) {
        switch (type) {
        case DS4K_Q4_0: {
            vb v = vb_load(p + 2);
            const float d = h2f(p);
            dq_put(out, vf_i8(vb_sub(vb_lo4(v), 8)), d, 0, 0.0f);
            dq_put(out + 16, vf_i8(vb_sub(vb_hi4(v), 8)), d, 0, 0.0f);
            break;
        }
        case DS4K_Q4_1: {
            vb v = vb_load(p + 4);
            const float d = h2f(p), m = h2f(p + 2);
            dq_put(out, vf_u8(vb_lo4(v)), d, 1, m);
            dq_put(out + 16, vf_u8(vb_hi4(v)), d, 1, m);
            break;
        }
        case DS4K_Q5_0: case DS4K_Q5_1: {
            const int has_m = type == DS4K_Q5_1, off = has_m ? 4 : 2;
            const float d = h2f(p), m = has_m ? h2f(p + 2) : 0.0f;
            uint32_t qh;
            memcpy(&qh, p + off, 4);
            vb v = vb_load(p + off + 4), h0, h1;
            vb_from_bits32(qh, &h0, &h1);
            vb lo = vb_or(vb_lo4(v), h0), hi = vb_or(vb_hi4(v), h1);
            if (has_m) {
                dq_put(out, vf_u8(lo), d, 1, m);
                dq_put(out + 16, vf_u8(hi), d, 1, m);
            } else {
                dq_put(out, vf_i8(vb_sub(lo, 16)), d, 0, 0.0f);
                dq_put(out + 16, vf_i8(vb_sub(hi, 16)), d, 0, 0.0f);
            }
            break;
        }
        case DS4K_Q8_0: {
            const float d = h2f(p);
            dq_put(out, vf_i8_mem(p + 2), d, 0, 0.0f);
            dq_put(out + 16, vf_i8_mem(p + 18), d, 0, 0.0f);
            break;
        }
        case DS4K_Q4_K: case DS4K_Q5_K: {
            const int five = type == DS4K_Q5_K;
            const float d = h2f(p), dmin = h2f(p + 2);
            const uint8_t *sc12 = p + 4, *qs = p + (five ? 48 : 16);
            vb h0 = vb_load(p + 16), h1 = vb_load(p + 32);
            for (int i = 0; i < 8; i++) {
                uint8_t sc, mn;
                k4_scale_min(sc12, i, &sc, &mn);
                /* ds q - dm is ds q + (-dm) exactly */
                const float ds = d * (float)sc, ndm = -(dmin * (float)mn);
                const uint8_t *q = qs + 32 * (i / 2);
                vb a = vb_load(q), c = vb_load(q + 16);
                a = i & 1 ? vb_hi4(a) : vb_lo4(a);
                c = i & 1 ? vb_hi4(c) : vb_lo4(c);
                if (five) a = vb_or(a, vb_bits_hi(h0, i, 1)), c = vb_or(c, vb_bits_hi(h1, i, 1));
                dq_put(out + 32 * i, vf_u8(a), ds, 1, ndm);
                dq_put(out + 32 * i + 16, vf_u8(c), ds, 1, ndm);
            }
            break;
        }
        case DS4K_Q6_K: {
            const int8_t *sc = (const int8_t *)(p + 192);
            const float d = h2f(p + 208);
            for (int h = 0; h < 2; h++) {
                const uint8_t *ql = p + 64 * h, *qh = p + 128 + 32 * h;
                for (int s = 0; s < 4; s++)
                    for (int half = 0; half < 2; half++) {
                        vb lo = vb_load(ql + 32 * (s & 1) + 16 * half);
                        lo = s >= 2 ? vb_hi4(lo) : vb_lo4(lo);
                        vb v = vb_sub(vb_or(lo, vb_bits_hi(vb_load(qh + 16 * half), 2 * s, 3)), 32);
                        const int e = 128 * h + 32 * s + 16 * half;
                        dq_put(out + e, vf_i8(v), d * (float)sc[e / 16], 0, 0.0f);
                    }
            }
            break;
        }
        default: break;
        }
    }
    return 1;
}

static void dequant_row(int type, const uint8_t *p, int64_t cols, float *out) {
    switch (type) {
    case DS4K_F32: memcpy(out, p, (size_t)cols * 4); return;
    case DS4K_F16:
        for (int64_t c = 0; c < cols; c++) out[c] = h2f(p + 2 * c);
        return;
    case DS4K_BF16:
        for (int64_t c = 0; c < cols; c++) out[c] = ds4k_bf16_to_f32(ds4k_rd16(p + 2 * c));
        return;
    default: break;
    }
    if (dequant_row_vec(type, p, cols, out)) return;
    const int qk = ds4k_block_weights(type), bs = ds4k_block_bytes(type);
    for (int64_t b = 0; b < cols / qk; b++, p += bs, out += qk) {
        switch (type) {
        case DS4K_Q4_0: {
            float d = h2f(p);
            for (int j = 0; j < 16; j++) {
                out[j] = d * (float)((p[2 + j] & 15) - 8);
                out[j + 16] = d * (float)((p[2 + j] >> 4) - 8);
            }
            break;
        }
        case DS4K_Q4_1: {
            float d = h2f(p), m = h2f(p + 2);
            for (int j = 0; j < 16; j++) {
                out[j] = d * (float)(p[4 + j] & 15) + m;
                out[j + 16] = d * (float)(p[4 + j] >> 4) + m;
            }
            break;
        }
        case DS4K_Q5_0: case DS4K_Q5_1: {
            const int has_m = type == DS4K_Q5_1, off = has_m ? 4 : 2;
            float d = h2f(p), m = has_m ? h2f(p + 2) : 0.0f;
            uint32_t qh;
            memcpy(&qh, p + off, 4);
            const uint8_t *qs = p + off + 4;
            for (int j = 0; j < 16; j++) {
                int lo = (qs[j] & 15) | (int)(((qh >> j) & 1) << 4);
                int hi = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
                if (has_m) {
                    out[j] = d * (float)lo + m;
                    out[j + 16] = d * (float)hi + m;
                } else {
                    out[j] = d * (float)(lo - 16);
                    out[j + 16] = d * (float)(hi - 16);
                }
            }
            break;
        }
        case DS4K_Q8_0: {
            float d = h2f(p);
            for (int j = 0; j < 32; j++) out[j] = (float)(int8_t)p[2 + j] * d;
            break;
        }
        case DS4K_Q4_K: case DS4K_Q5_K: {
            const int five = type == DS4K_Q5_K;
            float d = h2f(p), dmin = h2f(p + 2);
            const uint8_t *sc12 = p + 4, *qh = p + 16, *qs = p + (five ? 48 : 16);
            for (int i = 0; i < 8; i++) {
                uint8_t sc, mn;
                k4_scale_min(sc12, i, &sc, &mn);
                float ds = d * (float)sc, dm = dmin * (float)mn;
                const uint8_t *q = qs + 32 * (i / 2);
                for (int l = 0; l < 32; l++) {
                    int v = i & 1 ? q[l] >> 4 : q[l] & 15;
                    if (five) v |= ((qh[l] >> i) & 1) << 4;
                    out[32 * i + l] = ds * (float)v - dm;
                }
            }
            break;
        }
        case DS4K_Q6_K: {
            const uint8_t *ql = p, *qh = p + 128;
            const int8_t *sc = (const int8_t *)(p + 192);
            float d = h2f(p + 208);
            for (int e = 0; e < 256; e++) {
                int h = e / 128, s = (e / 32) % 4, l = e % 32;
                uint8_t lo = ql[64 * h + 32 * (s & 1) + l];
                int v = (s >= 2 ? lo >> 4 : lo & 15) | (((qh[32 * h + l] >> (2 * s)) & 3) << 4);
                out[e] = (d * (float)sc[e / 16]) * (float)(v - 32);
            }
            break;
        }
        default: break;
        }
    }
}

/* out[rows, cols] = the weights of `rows` rows of `type`; 0, or -1 for a bad type/shape. */
static int dequant(int type, const void *w, float *out, int64_t rows, int64_t cols) {
    int64_t rb = ds4k_row_bytes(type, cols);
    if (rb == 0 || rows < 0) return -1;
    for (int64_t r = 0; r < rows; r++) dequant_row(type, (const uint8_t *)w + r * rb, cols, out + r * cols);
    return 0;
}

#if DS4K_ISA >= 2
/* The 16 x 16 transpose of r[16] in registers: r[i] lane j becomes r[j] lane i. Pairs of
 * rows interleaved, then pairs of pairs, then the 128-bit quarters (64 shuffles). */
static inline void transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    /* u[4g + e], quarter q: column 4q + e of rows 4g .. 4g + 3 */
    __m512 u[16];
    for (int g = 0; g < 4; g++) {
        const __m512d a = _mm512_castps_pd(t[4 * g]), b = _mm512_castps_pd(t[4 * g + 2]);
        const __m512d c = _mm512_castps_pd(t[4 * g + 1]), d = _mm512_castps_pd(t[4 * g + 3]);
        u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
        u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
        u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
    }
    for (int e = 0; e < 4; e++) {
        const __m512 v0 = _mm512_shuffle_f32x4(u[e], u[4 + e], 0x44), v1 = _mm512_shuffle_f32x4(u[e], u[4 + e], 0xee);
        const __m512 v2 = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], 0x44);
        const __m512 v3 = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], 0xee);
        r[e] = _mm512_shuffle_f32x4(v0, v2, 0x88);
        r[4 + e] = _mm512_shuffle_f32x4(v0, v2, 0xdd);
        r[8 + e] = _mm512_shuffle_f32x4(v1, v3, 0x88);
        r[12 + e] = _mm512_shuffle_f32x4(v1, v3, 0xdd);
    }
}
#elif DS4K_ISA == 1
/* The 8 x 8 transpose of r[8] (AVX2): pairs of rows interleaved, pairs of pairs, then the
 * 128-bit halves (24 shuffles). */
static inline void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int g = 0; g < 2; g++) { /* u[4g + e], half q: column 4q + e of rows 4g .. 4g + 3 */
        u[4 * g] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
        u[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0xee);
        u[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
        u[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xee);
    }
    for (int e = 0; e < 4; e++) {
        r[e] = _mm256_permute2f128_ps(u[e], u[4 + e], 0x20);
        r[4 + e] = _mm256_permute2f128_ps(u[e], u[4 + e], 0x31);
    }
}
#endif

#if DS4K_ISA >= 1
#define DQT_STEP 256 /* columns dequantized per pass: a multiple of every type's block */

/* out[c][32] = the weight of row r at column c, for the nr (<= 32) rows at w (rb bytes
 * apart) and cols columns (a multiple of 8); rows nr..31 are 0. This is qgemm.c's long-
 * product layout. Rows are dequantized 256 columns at a time by dequant_row (so the values
 * are its bits) into a 32 KB scratch, then transposed in registers (16 x 16 with AVX-512,
 * 8 x 8 with AVX2): a column scattered element by element into a 128-byte-strided tile cost
 * more than the dequantization. */
static void dequant_rows_t32(int type, const uint8_t *w, int64_t rb, int nr, int64_t cols, float *out) {
    float tmp[32 * DQT_STEP] __attribute__((aligned(64)));
    /* The rows are one contiguous run of blocks, read below in 32 short pieces per pass:
     * requested all at once their misses overlap (one by one they stalled each pass). */
    for (int64_t off = 0; off < nr * rb; off += 64) _mm_prefetch((const char *)w + off, _MM_HINT_T0);
    if (nr < 32) memset(tmp + nr * DQT_STEP, 0, sizeof(float) * (size_t)((32 - nr) * DQT_STEP));
    for (int64_t c0 = 0; c0 < cols; c0 += DQT_STEP) {
        const int64_t len = cols - c0 < DQT_STEP ? cols - c0 : DQT_STEP;
        const int64_t off = c0 ? ds4k_row_bytes(type, c0) : 0; /* c0 is a whole number of blocks */
        for (int r = 0; r < nr; r++) dequant_row(type, w + r * rb + off, len, tmp + r * DQT_STEP);
#if DS4K_ISA >= 2
        for (int64_t j0 = 0; j0 < len; j0 += 16) {
            const int nj = len - j0 < 16 ? (int)(len - j0) : 16;
            const __mmask16 k = (__mmask16)((1u << nj) - 1);
            for (int h = 0; h < 32; h += 16) {
                __m512 v[16];
                for (int i = 0; i < 16; i++) v[i] = _mm512_maskz_loadu_ps(k, tmp + (h + i) * DQT_STEP + j0);
                transpose16(v);
                for (int j = 0; j < nj; j++) _mm512_storeu_ps(out + (c0 + j0 + j) * 32 + h, v[j]);
            }
        }
#else
        for (int64_t j0 = 0; j0 < len; j0 += 8) /* len is a multiple of 8 */
            for (int h = 0; h < 32; h += 8) {
                __m256 v[8];
                for (int i = 0; i < 8; i++) v[i] = _mm256_loadu_ps(tmp + (h + i) * DQT_STEP + j0);
                transpose8(v);
                for (int j = 0; j < 8; j++) _mm256_storeu_ps(out + (c0 + j0 + j) * 32 + h, v[j]);
            }
#endif
    }
}
#endif
