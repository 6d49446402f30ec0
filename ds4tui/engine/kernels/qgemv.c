/* qgemv.c: batch-1 matrix-vector products y = W x, W in GGUF layouts, x and y fp32.
 *
 * Owns: one block kernel per weight type (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
 * Q2_K, Q4_K, Q5_K, Q6_K, IQ2_XXS) written against simd.h, the row loop around them, and gemv, which
 * splits the rows of a (possibly multi-part) matrix into fixed chunks for the pool.
 * Leaves to callers (dispatch.c, llama_step.c): argument checks and which weights take
 * this path. Compiled once per ISA by isa.c.
 *
 * Why: decode at batch 1 is memory-bandwidth bound. fp32 weights stream 4 bytes per
 * weight, Q4_K 0.5625, Q8_0 1.0625, so reading the file's blocks directly is 4-7x less
 * traffic. Activations stay fp32 (llama.cpp quantizes them to q8 for an integer dot; we do
 * not), so results equal fp32 dequant + matmul up to float rounding order.
 *
 * Each block kernel widens 16 quants at a time to floats and FMAs them against x. Offsets
 * (Q4_1/Q5_1 m, K-quant mins) use sum_j (s q_j - o) x_j = s sum_j q_j x_j - o sum_j x_j
 * with the per-32 sums of x (per-16 for Q2_K) computed once per call, not once per row. Signed types
 * subtract their offset in the byte domain (exact). Rows go in pairs: the x loads are
 * shared and two accumulator chains hide FMA latency. Software prefetch ahead of each row
 * stream: the hardware prefetcher alone left the Q8_0 head far below DRAM speed (docs/perf-archive.md,
 * "How decode got there", item 2).
 * Block layouts: dequant.c.
 */

#ifndef PF_DIST
#define PF_DIST 8192 /* bytes ahead of each row stream */
#endif
#define GEMV_MAX_COLS 65536 /* x block sums live on the stack: 2048 per-32 sums max */

/* ---------------------------------------------------------------- 32-weight blocks
 * quants_<type>(p, lo, hi): the block's quants 0..15 and 16..31 as floats (signed types
 * offset in the byte domain first: q - 8, q - 16). The row-pair loop converts both rows'
 * f16 scale (and min) with one instruction and keeps both rows' min terms in one vector. */

#if DS4K_ISA >= 2
/* AVX-512: one zero-extension of the 16 packed bytes to dwords serves both halves (low
 * nibble: and; high nibble: shift, the byte being zero-extended), and Q5's fifth bit
 * becomes a masked subtract straight from qh: q - 16 is the nibble where the bit is set,
 * the nibble - 16 where it is not. Same integers as the byte-domain code, so the same floats. */
static inline __m512i nib_bytes(const uint8_t *p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)); }
static inline void quants_q4_0(const uint8_t *p, vf *lo, vf *hi) {
    const __m512i v = nib_bytes(p + 2), k8 = _mm512_set1_epi32(8);
    *lo = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_and_si512(v, _mm512_set1_epi32(15)), k8));
    *hi = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_srli_epi32(v, 4), k8));
}

static inline void quants_q4_1(const uint8_t *p, vf *lo, vf *hi) {
    const __m512i v = nib_bytes(p + 4);
    *lo = _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(15)));
    *hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
}

static inline void quants_q5_0(const uint8_t *p, vf *lo, vf *hi) {
    uint32_t qh;
    memcpy(&qh, p + 2, 4);
    const __m512i v = nib_bytes(p + 6), k16 = _mm512_set1_epi32(16);
    const __m512i l = _mm512_and_si512(v, _mm512_set1_epi32(15)), h = _mm512_srli_epi32(v, 4);
    *lo = _mm512_cvtepi32_ps(_mm512_mask_sub_epi32(l, (__mmask16)~qh, l, k16));
    *hi = _mm512_cvtepi32_ps(_mm512_mask_sub_epi32(h, (__mmask16)(~qh >> 16), h, k16));
}

static inline void quants_q5_1(const uint8_t *p, vf *lo, vf *hi) {
    uint32_t qh;
    memcpy(&qh, p + 4, 4);
    const __m512i v = nib_bytes(p + 8), k16 = _mm512_set1_epi32(16);
    const __m512i l = _mm512_and_si512(v, _mm512_set1_epi32(15)), h = _mm512_srli_epi32(v, 4);
    *lo = _mm512_cvtepi32_ps(_mm512_mask_add_epi32(l, (__mmask16)qh, l, k16));
    *hi = _mm512_cvtepi32_ps(_mm512_mask_add_epi32(h, (__mmask16)(qh >> 16), h, k16));
}
#elif DS4K_ISA == 1
/* AVX2 runs at half the AVX-512 width and is bound by vector uops, so each quant type takes
 * the path with the fewest: Q4 types zero-extend the packed bytes to dwords straight from
 * memory (an and or a shift per 8 quants, as the AVX-512 build); Q5 builds its 32 quants as
 * bytes in one ymm (the 16 packed bytes in both lanes, the high lane shifted right by 4: low
 * nibbles = quants 0..15, high = 16..31; the fifth bits expanded for all 32 at once) for
 * Q5_ROWS to widen. Same integers as the other builds, so the same floats. */
static inline __m256i nib32(const uint8_t *p) {
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
    return _mm256_and_si256(_mm256_srlv_epi32(v, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), _mm256_set1_epi8(15));
}

/* byte j = 0xff where bit j of the 4 bytes at p is set */
static inline __m256i bits32(const uint8_t *p) {
    int32_t qh;
    memcpy(&qh, p, 4);
    const __m256i sel = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                         2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i others = _mm256_set1_epi64x((long long)0x7fbfdfeff7fbfdfeULL); /* all bits but j's */
    const __m256i b = _mm256_or_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(qh), sel), others);
    return _mm256_cmpeq_epi8(b, _mm256_set1_epi8(-1));
}

static inline __m256i zx8(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }
static inline __m256 cvt8_i8(const uint8_t *p) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p))); }
static inline __m256 cvt8_u8(const uint8_t *p) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p))); }

/* Q4: dwords zero-extended straight from the packed bytes, as the AVX-512 build */
static inline void quants_q4_0(const uint8_t *p, vf *lo, vf *hi) {
    const __m256i z0 = zx8(p + 2), z1 = zx8(p + 10), m15 = _mm256_set1_epi32(15), k8 = _mm256_set1_epi32(8);
    lo->a = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(z0, m15), k8));
    lo->b = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(z1, m15), k8));
    hi->a = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(z0, 4), k8));
    hi->b = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(z1, 4), k8));
}

static inline void quants_q4_1(const uint8_t *p, vf *lo, vf *hi) {
    const __m256i z0 = zx8(p + 4), z1 = zx8(p + 12), m15 = _mm256_set1_epi32(15);
    lo->a = _mm256_cvtepi32_ps(_mm256_and_si256(z0, m15)), lo->b = _mm256_cvtepi32_ps(_mm256_and_si256(z1, m15));
    hi->a = _mm256_cvtepi32_ps(_mm256_srli_epi32(z0, 4)), hi->b = _mm256_cvtepi32_ps(_mm256_srli_epi32(z1, 4));
}

/* Q5_0's 32 quants as int8: q - 16 is the nibble with bits 4..7 set where the fifth bit is clear */
static inline __m256i q5_0_bytes(const uint8_t *p) {
    return _mm256_or_si256(nib32(p + 6), _mm256_andnot_si256(bits32(p + 2), _mm256_set1_epi8((char)0xf0)));
}

static inline __m256i q5_1_bytes(const uint8_t *p) {
    return _mm256_or_si256(nib32(p + 8), _mm256_and_si256(bits32(p + 4), _mm256_set1_epi8(16)));
}
#else
static inline void quants_q4_0(const uint8_t *p, vf *lo, vf *hi) {
    vb v = vb_load(p + 2);
    *lo = vf_i8(vb_sub(vb_lo4(v), 8)), *hi = vf_i8(vb_sub(vb_hi4(v), 8));
}

static inline void quants_q4_1(const uint8_t *p, vf *lo, vf *hi) {
    vb v = vb_load(p + 4);
    *lo = vf_u8(vb_lo4(v)), *hi = vf_u8(vb_hi4(v));
}

static inline void quants_q5_0(const uint8_t *p, vf *lo, vf *hi) {
    uint32_t qh;
    memcpy(&qh, p + 2, 4);
    vb v = vb_load(p + 6), h0, h1;
    vb_from_bits32(qh, &h0, &h1);
    *lo = vf_i8(vb_sub(vb_or(vb_lo4(v), h0), 16));
    *hi = vf_i8(vb_sub(vb_or(vb_hi4(v), h1), 16));
}

static inline void quants_q5_1(const uint8_t *p, vf *lo, vf *hi) {
    uint32_t qh;
    memcpy(&qh, p + 4, 4);
    vb v = vb_load(p + 8), h0, h1;
    vb_from_bits32(qh, &h0, &h1);
    *lo = vf_u8(vb_or(vb_lo4(v), h0)), *hi = vf_u8(vb_or(vb_hi4(v), h1));
}

#endif

static inline void quants_q8_0(const uint8_t *p, vf *lo, vf *hi) { *lo = vf_i8_mem(p + 2), *hi = vf_i8_mem(p + 18); }

#if DS4K_ISA >= 1
#define MINS_DECL __m128 mm = _mm_setzero_ps() /* lanes 1, 3: the two rows' sum of m * sum(x) */
#define MINS_ADD(b) mm = _mm_fmadd_ps(dm, _mm_set1_ps(xs[b]), mm)
#define MINS_ROW(k) f4_at(mm, (k) ? 3 : 1)
#define MINS_DECL2 __m128 mm2 = _mm_setzero_ps() /* rows 2 and 3 of four */
#define MINS_ADD2(b) mm2 = _mm_fmadd_ps(dm2, _mm_set1_ps(xs[b]), mm2)
#define MINS_ROW2(k) f4_at(mm2, (k) ? 3 : 1)
#else
#define MINS_DECL float mm[4] = {0.0f, 0.0f, 0.0f, 0.0f}
#define MINS_ADD(b) (mm[1] += f4_at(dm, 1) * xs[b], mm[3] += f4_at(dm, 3) * xs[b])
#define MINS_ROW(k) (mm[(k) ? 3 : 1])
#define MINS_DECL2 float mm2[4] = {0.0f, 0.0f, 0.0f, 0.0f}
#define MINS_ADD2(b) (mm2[1] += f4_at(dm2, 1) * xs[b], mm2[3] += f4_at(dm2, 3) * xs[b])
#define MINS_ROW2(k) (mm2[(k) ? 3 : 1])
#endif

/* A row's block scale as the accumulator FMA wants it. AVX-512: broadcast as a vector (one
 * f16 broadcast and one conversion for types without a min, a lane permute of the row
 * pair's converted {d, m} otherwise); elsewhere the float, broadcast by va_scale_add. */
#if DS4K_ISA >= 2
typedef __m512 scale_t;
static inline __m512 h2v(const uint8_t *p) { return _mm512_cvtph_ps(_mm256_set1_epi16((short)ds4k_rd16(p))); }
static inline __m512 lane_of(f4 v, int k) { return _mm512_permutexvar_ps(_mm512_set1_epi32(k), _mm512_castps128_ps512(v)); }
#define ROW_SCALE(dm, k, ptr, has_m) ((has_m) ? lane_of(dm, k) : h2v(ptr))
#define SCALE_ADD(d, s, acc) _mm512_fmadd_ps(d, s, acc)
#elif DS4K_ISA == 1 /* a broadcast f16 load and one conversion per row, not a 4-lane gather */
typedef __m256 scale_t;
static inline __m256 h2v(const uint8_t *p) { return _mm256_cvtph_ps(_mm_set1_epi16((short)ds4k_rd16(p))); }
#define ROW_SCALE(dm, k, ptr, has_m) ((has_m) ? _mm256_set1_ps(f4_at(dm, k)) : h2v(ptr))
#define SCALE_ADD(d, s, acc) _mm256_fmadd_ps(d, s, acc)
#else
typedef float scale_t;
#define ROW_SCALE(dm, k, ptr, has_m) f4_at(dm, k)
#define SCALE_ADD(d, s, acc) va_scale_add(d, s, acc)
#endif

/* AVX-512 runs rows in fours first (then pairs): the x loads are shared by more rows and
 * four accumulator chains are in flight (Q8_0 in cache 36 -> 49 GB/s per core, Q5_0 17 ->
 * 19). A row's own operations are the same either way, so are its bits. With 16 ymm
 * registers the AVX2 build keeps pairs. */
#define QUADS (DS4K_ISA >= 2)

/* rows [r0, r1) of a matrix of nb 32-weight blocks of BYTES bytes per row */
#define BLOCK32_ROWS(NAME, QUANTS, BYTES, HAS_M)                                              \
    static void NAME(const uint8_t *w, int64_t nb, const float *x, const float *xs, float *y, \
                     int64_t r0, int64_t r1) {                                                \
        const int64_t rb = nb * (BYTES);                                                      \
        (void)xs;                                                                             \
        int64_t r = r0;                                                                       \
        for (; QUADS && r + 4 <= r1; r += 4) {                                                \
            const uint8_t *p = w + r * rb;                                                    \
            va a0 = va_zero(), a1 = va_zero(), a2 = va_zero(), a3 = va_zero();               \
            MINS_DECL;                                                                        \
            MINS_DECL2;                                                                       \
            const uint8_t *pf = p + PF_DIST;                                                  \
            for (int64_t b = 0; b < nb; b++, p += (BYTES), pf += 4 * (BYTES)) {              \
                for (int k = 0; k < 4 * (BYTES); k += 64) __builtin_prefetch(pf + k);         \
                const vf x0 = vf_load(x + 32 * b), x1 = vf_load(x + 32 * b + 16);             \
                const f4 dm = f16x4(p, p + rb), dm2 = f16x4(p + 2 * rb, p + 3 * rb);          \
                vf lo, hi;                                                                    \
                QUANTS(p, &lo, &hi);                                                          \
                a0 = SCALE_ADD(ROW_SCALE(dm, 0, p, HAS_M), va_dot32(lo, hi, x0, x1), a0);     \
                QUANTS(p + rb, &lo, &hi);                                                     \
                a1 = SCALE_ADD(ROW_SCALE(dm, 2, p + rb, HAS_M), va_dot32(lo, hi, x0, x1), a1); \
                QUANTS(p + 2 * rb, &lo, &hi);                                                 \
                a2 = SCALE_ADD(ROW_SCALE(dm2, 0, p + 2 * rb, HAS_M), va_dot32(lo, hi, x0, x1), a2); \
                QUANTS(p + 3 * rb, &lo, &hi);                                                 \
                a3 = SCALE_ADD(ROW_SCALE(dm2, 2, p + 3 * rb, HAS_M), va_dot32(lo, hi, x0, x1), a3); \
                if (HAS_M) MINS_ADD(b), MINS_ADD2(b);                                         \
            }                                                                                 \
            y[r] = va_sum(a0) + (HAS_M ? MINS_ROW(0) : 0.0f);                                 \
            y[r + 1] = va_sum(a1) + (HAS_M ? MINS_ROW(1) : 0.0f);                             \
            y[r + 2] = va_sum(a2) + (HAS_M ? MINS_ROW2(0) : 0.0f);                            \
            y[r + 3] = va_sum(a3) + (HAS_M ? MINS_ROW2(1) : 0.0f);                            \
        }                                                                                     \
        for (; r < r1; r += 2) {                                                              \
            const int two = r + 1 < r1; /* an odd last row pairs with itself */                \
            const uint8_t *p = w + r * rb, *q = two ? p + rb : p;                             \
            va a0 = va_zero(), a1 = va_zero();                                                \
            MINS_DECL;                                                                        \
            const uint8_t *pf = p + PF_DIST;                                                  \
            for (int64_t b = 0; b < nb; b++, p += (BYTES), q += (BYTES), pf += 2 * (BYTES)) { \
                for (int k = 0; k < 2 * (BYTES); k += 64) __builtin_prefetch(pf + k);         \
                const vf x0 = vf_load(x + 32 * b), x1 = vf_load(x + 32 * b + 16);             \
                const f4 dm = f16x4(p, q);                                                    \
                const scale_t dp = ROW_SCALE(dm, 0, p, HAS_M), dq = ROW_SCALE(dm, 2, q, HAS_M); \
                vf lo, hi;                                                                    \
                QUANTS(p, &lo, &hi);                                                          \
                a0 = SCALE_ADD(dp, va_dot32(lo, hi, x0, x1), a0);                             \
                QUANTS(q, &lo, &hi);                                                          \
                a1 = SCALE_ADD(dq, va_dot32(lo, hi, x0, x1), a1);                             \
                if (HAS_M) MINS_ADD(b);                                                       \
            }                                                                                 \
            y[r] = va_sum(a0) + (HAS_M ? MINS_ROW(0) : 0.0f);                                 \
            if (two) y[r + 1] = va_sum(a1) + (HAS_M ? MINS_ROW(1) : 0.0f);                    \
        }                                                                                     \
    }

BLOCK32_ROWS(q4_0_rows, quants_q4_0, 18, 0)
BLOCK32_ROWS(q4_1_rows, quants_q4_1, 20, 1)
#if DS4K_ISA == 1
/* AVX2 Q5 rows: a block's 32 quant bytes are built in one ymm and stored, and read back
 * Q5_AHEAD blocks later by vpmovsx/zxbd with a memory operand, 8 at a time (4 widening
 * uops instead of 4 plus 3 lane extracts). Read back at once, the loads wait on the store
 * (Q5_0, Zen 5, 1 thread: 76 ns per 1000 weights, 63 with lane extracts); 5 blocks later, 52. */
#define Q5_AHEAD 5
#define Q5_ROWS(NAME, QBYTES, BYTES, HAS_M, CVT)                                              \
    static void NAME(const uint8_t *w, int64_t nb, const float *x, const float *xs, float *y, \
                     int64_t r0, int64_t r1) {                                                \
        const int64_t rb = nb * (BYTES);                                                      \
        (void)xs;                                                                             \
        uint8_t buf[8][64] __attribute__((aligned(32)));                                      \
        for (int64_t r = r0; r < r1; r += 2) {                                                \
            const int two = r + 1 < r1;                                                       \
            const uint8_t *p = w + r * rb, *q = two ? p + rb : p;                             \
            va a0 = va_zero(), a1 = va_zero();                                                \
            MINS_DECL;                                                                        \
            const uint8_t *pf = p + PF_DIST;                                                  \
            for (int64_t b = 0; b < Q5_AHEAD && b < nb; b++) {                                \
                _mm256_store_si256((__m256i *)buf[b & 7], QBYTES(p + b * (BYTES)));           \
                _mm256_store_si256((__m256i *)(buf[b & 7] + 32), QBYTES(q + b * (BYTES)));    \
            }                                                                                 \
            for (int64_t b = 0; b < nb; b++, p += (BYTES), q += (BYTES), pf += 2 * (BYTES)) { \
                for (int k = 0; k < 2 * (BYTES); k += 64) __builtin_prefetch(pf + k);         \
                if (b + Q5_AHEAD < nb) {                                                      \
                    uint8_t *t = buf[(b + Q5_AHEAD) & 7];                                      \
                    _mm256_store_si256((__m256i *)t, QBYTES(p + Q5_AHEAD * (BYTES)));          \
                    _mm256_store_si256((__m256i *)(t + 32), QBYTES(q + Q5_AHEAD * (BYTES)));   \
                }                                                                             \
                const vf x0 = vf_load(x + 32 * b), x1 = vf_load(x + 32 * b + 16);             \
                const f4 dm = f16x4(p, q);                                                    \
                const scale_t dp = ROW_SCALE(dm, 0, p, HAS_M), dq = ROW_SCALE(dm, 2, q, HAS_M); \
                const uint8_t *t = buf[b & 7];                                                \
                vf lo = {CVT(t), CVT(t + 8)}, hi = {CVT(t + 16), CVT(t + 24)};                \
                a0 = SCALE_ADD(dp, va_dot32(lo, hi, x0, x1), a0);                             \
                vf lo2 = {CVT(t + 32), CVT(t + 40)}, hi2 = {CVT(t + 48), CVT(t + 56)};        \
                a1 = SCALE_ADD(dq, va_dot32(lo2, hi2, x0, x1), a1);                           \
                if (HAS_M) MINS_ADD(b);                                                       \
            }                                                                                 \
            y[r] = va_sum(a0) + (HAS_M ? MINS_ROW(0) : 0.0f);                                 \
            if (two) y[r + 1] = va_sum(a1) + (HAS_M ? MINS_ROW(1) : 0.0f);                    \
        }                                                                                     \
    }
Q5_ROWS(q5_0_rows, q5_0_bytes, 22, 0, cvt8_i8)
Q5_ROWS(q5_1_rows, q5_1_bytes, 24, 1, cvt8_u8)
#else
BLOCK32_ROWS(q5_0_rows, quants_q5_0, 22, 0)
BLOCK32_ROWS(q5_1_rows, quants_q5_1, 24, 1)
#endif
BLOCK32_ROWS(q8_0_rows, quants_q8_0, 34, 0)

/* ---------------------------------------------------------------- 256-weight K-quant blocks
 * blk_<type>(p, x, xs, acc, off): adds one superblock's sum_j w_j x_j to acc (vector part)
 * and off (min part); x, xs point at its first weight / first per-32 sum of x. */

/* Q4_K and Q5_K: 8 sub-blocks of 32 with their own 6-bit scale and min. The vector builds
 * unpack all 16 with word operations, scale them in one vector and fold the min terms
 * (dmin * m_i * sum of x over sub-block i) into the accumulator with one FMA. */
static inline void blk_qk45(const uint8_t *p, const float *x, const float *xs, va *acc, float *off, int five) {
    const float d = h2f(p), dmin = h2f(p + 2);
    const uint8_t *s = p + 4, *qs = p + (five ? 48 : 16);
    vb h0 = vb_load(p + 16), h1 = vb_load(p + 32); /* qh when five, unused otherwise */
#if DS4K_ISA >= 1
    (void)off;
    uint32_t a, b, c;
    memcpy(&a, s, 4), memcpy(&b, s + 4, 4), memcpy(&c, s + 8, 4);
    const __m128i packed = _mm_set_epi32((int)(((c >> 4) & 0x0f0f0f0fu) | ((b >> 2) & 0x30303030u)),
                                         (int)(b & 0x3f3f3f3fu),
                                         (int)((c & 0x0f0f0f0fu) | ((a >> 2) & 0x30303030u)),
                                         (int)(a & 0x3f3f3f3fu)); /* sc 0..7, m 0..7 */
    const __m256 scd = _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(packed)));
    const __m256 mnd = _mm256_mul_ps(_mm256_set1_ps(dmin),
                                     _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(packed, packed))));
#if DS4K_ISA >= 2
    *acc = _mm512_fnmadd_ps(_mm512_zextps256_ps512(mnd), _mm512_zextps256_ps512(_mm256_loadu_ps(xs)), *acc);
    const __m512 scd16 = _mm512_zextps256_ps512(scd);
#define SCALE_OF(i) _mm512_permutexvar_ps(_mm512_set1_epi32(i), scd16)
#else
    *acc = _mm256_fnmadd_ps(mnd, _mm256_loadu_ps(xs), *acc);
    float scm[8] __attribute__((aligned(32))); /* a broadcast load per sub-block, not a permute */
    _mm256_store_ps(scm, scd);
#define SCALE_OF(i) _mm256_broadcast_ss(scm + (i))
#endif
#else
    float o = 0.0f;
#endif
#if DS4K_ISA >= 2
    if (!five) { /* Q4_K: the 32 packed bytes zero-extended once serve both sub-blocks (as Q4_1) */
        for (int c4 = 0; c4 < 4; c4++) {
            const __m512i z0 = nib_bytes(qs + 32 * c4), z1 = nib_bytes(qs + 32 * c4 + 16), m15 = _mm512_set1_epi32(15);
            for (int half = 0; half < 2; half++) {
                const int i = 2 * c4 + half;
                const vf lo = _mm512_cvtepi32_ps(half ? _mm512_srli_epi32(z0, 4) : _mm512_and_si512(z0, m15));
                const vf hi = _mm512_cvtepi32_ps(half ? _mm512_srli_epi32(z1, 4) : _mm512_and_si512(z1, m15));
                *acc = _mm512_fmadd_ps(SCALE_OF(i), va_dot32(lo, hi, vf_load(x + 32 * i), vf_load(x + 32 * i + 16)), *acc);
            }
        }
        return;
    }
#elif DS4K_ISA == 1
    if (!five) { /* Q4_K: dwords zero-extended straight from the packed bytes serve both sub-blocks */
        const __m256i m15 = _mm256_set1_epi32(15);
        for (int c4 = 0; c4 < 4; c4++) {
            const uint8_t *q = qs + 32 * c4;
            const __m256i z[4] = {zx8(q), zx8(q + 8), zx8(q + 16), zx8(q + 24)};
            for (int half = 0; half < 2; half++) {
                const int i = 2 * c4 + half;
                __m256 f[4];
                for (int k = 0; k < 4; k++) f[k] = _mm256_cvtepi32_ps(half ? _mm256_srli_epi32(z[k], 4) : _mm256_and_si256(z[k], m15));
                const vf lo = {f[0], f[1]}, hi = {f[2], f[3]};
                *acc = _mm256_fmadd_ps(SCALE_OF(i), va_dot32(lo, hi, vf_load(x + 32 * i), vf_load(x + 32 * i + 16)), *acc);
            }
        }
        return;
    }
#endif
    for (int c4 = 0; c4 < 4; c4++) {
        vb v0 = vb_load(qs + 32 * c4), v1 = vb_load(qs + 32 * c4 + 16);
        for (int half = 0; half < 2; half++) {
            const int i = 2 * c4 + half;
            vb qa = half ? vb_hi4(v0) : vb_lo4(v0), qb = half ? vb_hi4(v1) : vb_lo4(v1);
            if (five) qa = vb_or(qa, vb_bits_hi(h0, i, 1)), qb = vb_or(qb, vb_bits_hi(h1, i, 1));
            const float *xi = x + 32 * i;
            const va dot = va_dot32(vf_u8(qa), vf_u8(qb), vf_load(xi), vf_load(xi + 16));
#if DS4K_ISA >= 1
#if DS4K_ISA >= 2
            *acc = _mm512_fmadd_ps(SCALE_OF(i), dot, *acc);
#else
            *acc = _mm256_fmadd_ps(SCALE_OF(i), dot, *acc);
#endif
#else
            uint8_t sc, mn;
            k4_scale_min(s, i, &sc, &mn);
            *acc = va_scale_add(d * (float)sc, dot, *acc);
            o += (float)mn * xs[i];
#endif
        }
    }
#if DS4K_ISA >= 1
#undef SCALE_OF
#else
    *off -= dmin * o;
#endif
}

/* Q2_K: 16 sub-blocks of 16 with a 4-bit scale and min each; the min terms are dmin m_j
 * times the per-16 sums of x (xs16), folded into the accumulator with one vector FMA. The
 * vector builds zero-extend each 16 quant bytes to dwords once and take the four 2-bit
 * fields from them by shifts. */
static inline void blk_q2_k(const uint8_t *p, const float *x, const float *xs16, va *acc, float *off) {
    const float d = h2f(p + 80), dmin = h2f(p + 82);
    const uint8_t *qs = p + 16;
#if DS4K_ISA >= 1
    (void)off;
    const __m128i sc = _mm_loadu_si128((const __m128i *)p), m0f = _mm_set1_epi8(15);
    const __m128i scl = _mm_and_si128(sc, m0f), mnh = _mm_and_si128(_mm_srli_epi16(sc, 4), m0f);
#if DS4K_ISA >= 2
    const __m512 scd = _mm512_mul_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(scl)));
    const __m512 mnd = _mm512_mul_ps(_mm512_set1_ps(dmin), _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(mnh)));
    *acc = _mm512_fnmadd_ps(mnd, _mm512_loadu_ps(xs16), *acc);
    const __m512i k3 = _mm512_set1_epi32(3);
    for (int h = 0; h < 2; h++)
        for (int half = 0; half < 2; half++) {
            const __m512i z = nib_bytes(qs + 32 * h + 16 * half);
            for (int s = 0; s < 4; s++) {
                const int e = 128 * h + 32 * s + 16 * half;
                const vf q = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(z, 2 * s), k3));
                *acc = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_set1_epi32(e / 16), scd), va_dot16(q, vf_load(x + e)), *acc);
            }
        }
#else
    const __m256 dv = _mm256_set1_ps(d), mv = _mm256_set1_ps(dmin);
    float scm[16] __attribute__((aligned(32)));
    _mm256_store_ps(scm, _mm256_mul_ps(dv, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(scl))));
    _mm256_store_ps(scm + 8, _mm256_mul_ps(dv, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(scl, scl)))));
    *acc = _mm256_fnmadd_ps(_mm256_mul_ps(mv, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mnh))), _mm256_loadu_ps(xs16), *acc);
    *acc = _mm256_fnmadd_ps(_mm256_mul_ps(mv, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(mnh, mnh)))),
                            _mm256_loadu_ps(xs16 + 8), *acc);
    const __m256i k3 = _mm256_set1_epi32(3);
    for (int h = 0; h < 2; h++)
        for (int half = 0; half < 2; half++) {
            const uint8_t *q8 = qs + 32 * h + 16 * half;
            const __m256i z0 = zx8(q8), z1 = zx8(q8 + 8);
            for (int s = 0; s < 4; s++) {
                const int e = 128 * h + 32 * s + 16 * half;
                const vf q = {_mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(z0, 2 * s), k3)),
                              _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(z1, 2 * s), k3))};
                *acc = _mm256_fmadd_ps(_mm256_broadcast_ss(scm + e / 16), va_dot16(q, vf_load(x + e)), *acc);
            }
        }
#endif
#else
    float o = 0.0f;
    for (int h = 0; h < 2; h++)
        for (int half = 0; half < 2; half++) {
            const vb v = vb_load(qs + 32 * h + 16 * half);
            for (int s = 0; s < 4; s++) {
                const int e = 128 * h + 32 * s + 16 * half;
                const uint8_t sc = p[e / 16];
                *acc = va_scale_add(d * (float)(sc & 15), va_dot16(vf_u8(vb_bits(v, 2 * s, 3)), vf_load(x + e)), *acc);
                o += (float)(sc >> 4) * xs16[e / 16];
            }
        }
    *off -= dmin * o;
#endif
}

/* IQ2_XXS. The vector builds read each group of 8 weights as floats straight from two small
 * constant tables (built by the compiler from dequant.c's lists): the codebook entry as 8 floats (8 KB) and
 * the group's sign pattern as 8 sign-bit masks (4 KB); an xor applies the signs. That is
 * two loads, an xor and an FMA per 8 weights, against a widening and a conversion per 8 and
 * the byte-domain sign step of dequant.c's iq2xxs_quants (3x the instructions; the
 * portable build keeps that path). ±g is exact either way, so the products are the same. */
#if DS4K_ISA >= 1
#define IQ2XXS_F(v, j) (float)(((v) >> (8 * (j))) & 255)
#define IQ2XXS_GRIDF(v) {IQ2XXS_F(v, 0), IQ2XXS_F(v, 1), IQ2XXS_F(v, 2), IQ2XXS_F(v, 3), \
                         IQ2XXS_F(v, 4), IQ2XXS_F(v, 5), IQ2XXS_F(v, 6), IQ2XXS_F(v, 7)},
#define IQ2XXS_M(v, j) ((((v) >> (8 * (j))) & 1) ? 0x80000000u : 0u)
#define IQ2XXS_SIGNF(v) {IQ2XXS_M(v, 0), IQ2XXS_M(v, 1), IQ2XXS_M(v, 2), IQ2XXS_M(v, 3), \
                         IQ2XXS_M(v, 4), IQ2XXS_M(v, 5), IQ2XXS_M(v, 6), IQ2XXS_M(v, 7)},
static const float iq2xxs_gridf[256][8] __attribute__((aligned(32))) = {IQ2XXS_GRID(IQ2XXS_GRIDF)};
static const uint32_t iq2xxs_signf[128][8] __attribute__((aligned(32))) = {IQ2XXS_SIGNS(IQ2XXS_SIGNF)};

/* group l of a sub-block (grid index byte l of a0, sign field l of a1) as 8 signed floats */
static inline __m256 iq2xxs_group8(uint32_t a0, uint32_t a1, int l) {
    const __m256 g = _mm256_load_ps(iq2xxs_gridf[(a0 >> (8 * l)) & 255]);
    return _mm256_xor_ps(g, _mm256_load_ps((const float *)iq2xxs_signf[(a1 >> (7 * l)) & 127]));
}
#endif

static inline void blk_iq2_xxs(const uint8_t *p, const float *x, const float *xs, va *acc, float *off) {
    (void)xs, (void)off;
    const float d = h2f(p);
    for (int ib = 0; ib < 8; ib++) {
#if DS4K_ISA >= 1
        uint32_t a0, a1;
        memcpy(&a0, p + 2 + 8 * ib, 4);
        memcpy(&a1, p + 6 + 8 * ib, 4);
        const float db = d * (0.5f + (float)(a1 >> 28)) * 0.25f;
        const float *xb = x + 32 * ib;
#if DS4K_ISA >= 2
        const __m512 w0 = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(iq2xxs_group8(a0, a1, 0))),
                                                              _mm256_castps_pd(iq2xxs_group8(a0, a1, 1)), 1));
        const __m512 w1 = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(iq2xxs_group8(a0, a1, 2))),
                                                              _mm256_castps_pd(iq2xxs_group8(a0, a1, 3)), 1));
        *acc = _mm512_fmadd_ps(_mm512_set1_ps(db), va_dot32(w0, w1, vf_load(xb), vf_load(xb + 16)), *acc);
#else
        __m256 s = _mm256_mul_ps(iq2xxs_group8(a0, a1, 0), _mm256_loadu_ps(xb));
        s = _mm256_fmadd_ps(iq2xxs_group8(a0, a1, 1), _mm256_loadu_ps(xb + 8), s);
        s = _mm256_fmadd_ps(iq2xxs_group8(a0, a1, 2), _mm256_loadu_ps(xb + 16), s);
        s = _mm256_fmadd_ps(iq2xxs_group8(a0, a1, 3), _mm256_loadu_ps(xb + 24), s);
        *acc = _mm256_fmadd_ps(_mm256_set1_ps(db), s, *acc);
#endif
#else
        vb lo, hi;
        float db;
        iq2xxs_quants(p, ib, &lo, &hi, &db);
        *acc = va_scale_add(db, va_dot32(vf_i8(lo), vf_i8(hi), vf_load(x + 32 * ib), vf_load(x + 32 * ib + 16)), *acc);
#endif
    }
    (void)d;
}

static inline void blk_q4_k(const uint8_t *p, const float *x, const float *xs, va *acc, float *off) {
    blk_qk45(p, x, xs, acc, off, 0);
}

static inline void blk_q5_k(const uint8_t *p, const float *x, const float *xs, va *acc, float *off) {
    blk_qk45(p, x, xs, acc, off, 1);
}

#if DS4K_ISA >= 1
/* AVX2 and AVX-512 Q6_K, in two steps a superblock apart (as the Q5 rows, so that the
 * widening loads find the bytes stored): q6_k_bytes stores the 256 quants as int8, two
 * groups of 16 per ymm (ql's 32 bytes, low or high nibbles; qh's 32 bytes, bits 2s and
 * 2s + 1 moved to bits 4 and 5 by one word shift; minus 32); q6_k_dot2 widens them from
 * memory (8 at a time with AVX2, 16 with AVX-512) and scales each group by a broadcast
 * load of its scaled scale. Same integers and float operations as the scalar build's
 * blk_q6_k per group. The AVX-512 build unpacked each group in dword lanes until
 * 2026-12-01 (about 8 zmm operations per 16 weights, against 3 ymm and 4 zmm this way);
 * on Zen 4, which splits every zmm operation in two, that took 55 ns per 1000 weights
 * against AVX2's 40 (`bench/kernel_types.py --threads 2`, [3072, 512]); bit-identical. */
static inline void q6_k_bytes(const uint8_t *p, uint8_t *out) {
    const __m256i m0f = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30), k32 = _mm256_set1_epi8(32);
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = p + 64 * h, *qh = p + 128 + 32 * h;
        const __m256i l01 = _mm256_loadu_si256((const __m256i *)ql), l23 = _mm256_loadu_si256((const __m256i *)(ql + 32));
        const __m256i qhv = _mm256_loadu_si256((const __m256i *)qh);
        for (int s = 0; s < 4; s++) {
            const __m256i l = s & 1 ? l23 : l01;
            const __m256i nib = _mm256_and_si256(s >= 2 ? _mm256_srli_epi16(l, 4) : l, m0f);
            const __m256i hb = _mm256_and_si256(s == 0 ? _mm256_slli_epi16(qhv, 4) : s == 1 ? _mm256_slli_epi16(qhv, 2)
                                                : s == 2 ? qhv : _mm256_srli_epi16(qhv, 2), m30);
            _mm256_store_si256((__m256i *)(out + 128 * h + 32 * s), _mm256_sub_epi8(_mm256_or_si256(nib, hb), k32));
        }
    }
}

/* scm: a superblock's 16 scales times d */
static inline void q6_k_scales(const uint8_t *p, float *scm) {
    const int8_t *sc = (const int8_t *)(p + 192);
    const __m256 d = _mm256_set1_ps(h2f(p + 208));
    _mm256_store_ps(scm, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)sc)))));
    _mm256_store_ps(scm + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(sc + 8))))));
}

/* both rows of a pair group by group, so that their two accumulator chains overlap (Q6_K
 * [3072, 512], 1 thread: 58 -> 53 ns per 1000 weights against one row after the other) */
static inline void q6_k_dot2(const uint8_t *p, const uint8_t *q, const uint8_t *qp, const uint8_t *qq, const float *x,
                             va *a0, va *a1) {
    float sp[16] __attribute__((aligned(32))), sq[16] __attribute__((aligned(32)));
    q6_k_scales(p, sp), q6_k_scales(q, sq);
    for (int k = 0; k < 16; k++) {
        const vf xk = vf_load(x + 16 * k);
#if DS4K_ISA >= 2
        const vf vp = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_load_si128((const __m128i *)(qp + 16 * k))));
        const vf vq = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_load_si128((const __m128i *)(qq + 16 * k))));
        *a0 = _mm512_fmadd_ps(_mm512_set1_ps(sp[k]), va_dot16(vp, xk), *a0);
        *a1 = _mm512_fmadd_ps(_mm512_set1_ps(sq[k]), va_dot16(vq, xk), *a1);
#else
        const vf vp = {cvt8_i8(qp + 16 * k), cvt8_i8(qp + 16 * k + 8)}, vq = {cvt8_i8(qq + 16 * k), cvt8_i8(qq + 16 * k + 8)};
        *a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(sp + k), va_dot16(vp, xk), *a0);
        *a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(sq + k), va_dot16(vq, xk), *a1);
#endif
    }
}

static void q6_k_rows(const uint8_t *w, int64_t nb, const float *x, const float *xs, float *y, int64_t r0, int64_t r1) {
    (void)xs;
    const int64_t rb = nb * 210;
    uint8_t buf[2][2][256] __attribute__((aligned(32))); /* [superblock parity][row of the pair] */
    for (int64_t r = r0; r < r1; r += 2) {
        const int two = r + 1 < r1;
        const uint8_t *p = w + r * rb, *q = p + rb;
        va a0 = va_zero(), a1 = va_zero();
        const uint8_t *pf = p + PF_DIST, *pf_end = pf;
        q6_k_bytes(p, buf[0][0]);
        if (two) q6_k_bytes(q, buf[0][1]);
        for (int64_t b = 0; b < nb; b++, p += 210, q += 210) {
            for (pf_end += 2 * 210; pf < pf_end; pf += 64) __builtin_prefetch(pf);
            if (b + 1 < nb) {
                q6_k_bytes(p + 210, buf[(b + 1) & 1][0]);
                if (two) q6_k_bytes(q + 210, buf[(b + 1) & 1][1]);
            }
            q6_k_dot2(p, two ? q : p, buf[b & 1][0], buf[b & 1][two], x + 256 * b, &a0, &a1);
        }
        y[r] = va_sum(a0);
        if (two) y[r + 1] = va_sum(a1);
    }
}
#else
/* Q6_K, the portable build: 16 groups of 16 with their own int8 scale. */
static inline void blk_q6_k(const uint8_t *p, const float *x, const float *xs, va *acc, float *off) {
    (void)xs, (void)off;
    const int8_t *sc = (const int8_t *)(p + 192);
    const float d = h2f(p + 208);
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = p + 64 * h, *qh = p + 128 + 32 * h;
        vb l0 = vb_load(ql), l1 = vb_load(ql + 16), l2 = vb_load(ql + 32), l3 = vb_load(ql + 48);
        vb q0 = vb_load(qh), q1 = vb_load(qh + 16);
        for (int s = 0; s < 4; s++) {
            vb a = s & 1 ? l2 : l0, b = s & 1 ? l3 : l1;
            a = s >= 2 ? vb_hi4(a) : vb_lo4(a);
            b = s >= 2 ? vb_hi4(b) : vb_lo4(b);
            a = vb_sub(vb_or(a, vb_bits_hi(q0, 2 * s, 3)), 32);
            b = vb_sub(vb_or(b, vb_bits_hi(q1, 2 * s, 3)), 32);
            const float *xe = x + 128 * h + 32 * s;
            const int si = 8 * h + 2 * s;
            *acc = va_scale_add(d * (float)sc[si], va_dot16(vf_i8(a), vf_load(xe)), *acc);
            *acc = va_scale_add(d * (float)sc[si + 1], va_dot16(vf_i8(b), vf_load(xe + 16)), *acc);
        }
    }
}
#endif

/* rows [r0, r1) of a matrix of nb 256-weight superblocks of BYTES bytes per row; XS sums
 * of x per superblock (8: per 32, 16: per 16) */
#define BLOCK256_ROWS(NAME, BLK, BYTES, XS)                                                     \
    static void NAME(const uint8_t *w, int64_t nb, const float *x, const float *xs, float *y, \
                     int64_t r0, int64_t r1) {                                                \
        const int64_t rb = nb * (BYTES);                                                      \
        for (int64_t r = r0; r < r1; r += 2) {                                                \
            const int two = r + 1 < r1;                                                       \
            const uint8_t *p = w + r * rb, *q = p + rb;                                       \
            va a0 = va_zero(), a1 = va_zero();                                                \
            float o0 = 0.0f, o1 = 0.0f;                                                       \
            const uint8_t *pf = p + PF_DIST, *pf_end = pf;                                    \
            for (int64_t b = 0; b < nb; b++, p += (BYTES), q += (BYTES)) {                    \
                for (pf_end += 2 * (BYTES); pf < pf_end; pf += 64) __builtin_prefetch(pf);    \
                BLK(p, x + 256 * b, xs + (XS) * b, &a0, &o0);                                 \
                if (two) BLK(q, x + 256 * b, xs + (XS) * b, &a1, &o1);                        \
            }                                                                                 \
            y[r] = va_sum(a0) + o0;                                                           \
            if (two) y[r + 1] = va_sum(a1) + o1;                                              \
        }                                                                                     \
    }

BLOCK256_ROWS(q2_k_rows, blk_q2_k, 84, 16)
BLOCK256_ROWS(q4_k_rows, blk_q4_k, 144, 8)
BLOCK256_ROWS(q5_k_rows, blk_q5_k, 176, 8)
BLOCK256_ROWS(iq2_xxs_rows, blk_iq2_xxs, 66, 8)
#if DS4K_ISA == 0
BLOCK256_ROWS(q6_k_rows, blk_q6_k, 210, 8)
#endif

/* ---------------------------------------------------------------- F32 / F16 / BF16 rows */

static inline float dense_at(int type, const uint8_t *w, int64_t c) {
    if (type == DS4K_F32) { float f; memcpy(&f, w + 4 * c, 4); return f; }
    if (type == DS4K_F16) return h2f(w + 2 * c);
    return ds4k_bf16_to_f32(ds4k_rd16(w + 2 * c));
}

static inline vf dense16(int type, const uint8_t *w) {
    if (type == DS4K_F32) return vf_load((const float *)w);
    if (type == DS4K_F16) return vf_f16((const uint16_t *)w);
    return vf_bf16((const uint16_t *)w);
}

static void dense_rows(int type, const uint8_t *w, int64_t cols, const float *x, float *y, int64_t r0, int64_t r1) {
    const int es = type == DS4K_F32 ? 4 : 2;
    const int64_t rb = cols * es, c16 = cols & ~(int64_t)15;
    int64_t r = r0;
    for (; r + 2 <= r1; r += 2) {
        const uint8_t *p = w + r * rb, *q = p + rb;
        vf a0 = vf_zero(), a1 = vf_zero();
        for (int64_t c = 0; c < c16; c += 16) {
            __builtin_prefetch(p + c * es + PF_DIST);
            __builtin_prefetch(q + c * es + PF_DIST);
            vf xv = vf_load(x + c);
            a0 = vf_fma(dense16(type, p + c * es), xv, a0);
            a1 = vf_fma(dense16(type, q + c * es), xv, a1);
        }
        float s0 = vf_sum(a0), s1 = vf_sum(a1);
        for (int64_t c = c16; c < cols; c++) {
            s0 += dense_at(type, p, c) * x[c];
            s1 += dense_at(type, q, c) * x[c];
        }
        y[r] = s0;
        y[r + 1] = s1;
    }
    for (; r < r1; r++) {
        const uint8_t *p = w + r * rb;
        vf a0 = vf_zero();
        for (int64_t c = 0; c < c16; c += 16) a0 = vf_fma(dense16(type, p + c * es), vf_load(x + c), a0);
        float s0 = vf_sum(a0);
        for (int64_t c = c16; c < cols; c++) s0 += dense_at(type, p, c) * x[c];
        y[r] = s0;
    }
}

/* ---------------------------------------------------------------- gemv */

typedef struct {
    const ds4k_mat *parts;
    int nparts;
    int64_t first[DS4K_MAX_PARTS + 1]; /* first global chunk of each part */
    int64_t chunk_rows[DS4K_MAX_PARTS];
    int64_t row0[DS4K_MAX_PARTS];      /* first output row of each part */
    const float *x, *xs, *xs16; /* per-32 and per-16 sums of x (those a part's type needs) */
    float *y;
    int64_t cols;
} gemv_job;

static void rows_of(int type, const uint8_t *w, int64_t cols, const float *x, const float *xs, const float *xs16,
                    float *y, int64_t r0, int64_t r1) {
    const int64_t nb = cols / (ds4k_block_weights(type) ? ds4k_block_weights(type) : 1);
    switch (type) {
    case DS4K_Q4_0: q4_0_rows(w, nb, x, xs, y, r0, r1); break;
    case DS4K_Q4_1: q4_1_rows(w, nb, x, xs, y, r0, r1); break;
    case DS4K_Q5_0: q5_0_rows(w, nb, x, xs, y, r0, r1); break;
    case DS4K_Q5_1: q5_1_rows(w, nb, x, xs, y, r0, r1); break;
    case DS4K_Q8_0: q8_0_rows(w, nb, x, xs, y, r0, r1); break;
    case DS4K_Q4_K: q4_k_rows(w, nb, x, xs, y, r0, r1); break;
    case DS4K_Q5_K: q5_k_rows(w, nb, x, xs, y, r0, r1); break;
    case DS4K_Q6_K: q6_k_rows(w, nb, x, xs, y, r0, r1); break;
    case DS4K_Q2_K: q2_k_rows(w, nb, x, xs16, y, r0, r1); break;
    case DS4K_IQ2_XXS: iq2_xxs_rows(w, nb, x, xs, y, r0, r1); break;
    default: dense_rows(type, w, cols, x, y, r0, r1); break;
    }
}

static void gemv_chunk(void *ctx, int64_t c) {
    const gemv_job *j = (const gemv_job *)ctx;
    int k = 0;
    while (c >= j->first[k + 1]) k++;
    const ds4k_mat *m = &j->parts[k];
    int64_t r0 = (c - j->first[k]) * j->chunk_rows[k], r1 = r0 + j->chunk_rows[k];
    if (r1 > m->rows) r1 = m->rows;
    rows_of(m->type, m->w, j->cols, j->x, j->xs, j->xs16, j->y + j->row0[k], r0, r1);
}

/* A matrix is cut into an even number of equal chunks of at most CHUNK_BYTES, or for a
 * large matrix (an output head) 1/128 of it up to CHUNK_MAX. Large chunks keep each thread
 * on long sequential runs, which the hardware prefetcher needs (docs/perf-archive.md, "How decode
 * got there", item 5): with 2 threads each one's chunks are not adjacent, and every jump to
 * a new chunk restarts its stream (the Q8_0 head's chunks run in one thread's order, every
 * other chunk: 28 GB/s at 128 KB, 34-36 GB/s at 1 MB, 36 contiguous). Bounds depend on the
 * shape only, never on the thread count (see ds4k.h). */
#define CHUNK_BYTES 131072
#define CHUNK_MAX 1048576

/* y = [parts stacked by rows] x; 0 on success, -1 for an unsupported type or shape. */
static int gemv(const ds4k_mat *parts, int nparts, const float *x, float *y, int64_t cols, int nth) {
    if (nparts < 1 || nparts > DS4K_MAX_PARTS || cols <= 0 || cols > GEMV_MAX_COLS) return -1;
    gemv_job job = {.parts = parts, .nparts = nparts, .x = x, .y = y, .cols = cols};
    int need_sums = 0, need_sums16 = 0;
    int64_t row = 0;
    for (int k = 0; k < nparts; k++) {
        const ds4k_mat *m = &parts[k];
        int64_t rb = ds4k_row_bytes(m->type, cols);
        if (rb == 0 || m->rows <= 0 || m->w == NULL) return -1;
        int64_t cb = m->rows * rb / 128;
        cb = cb < CHUNK_BYTES ? CHUNK_BYTES : cb > CHUNK_MAX ? CHUNK_MAX : cb;
        int64_t nchunks = (m->rows * rb + cb - 1) / cb;
        nchunks = (nchunks + 1) & ~(int64_t)1;                                    /* even count */
        int64_t chunk_rows = ((m->rows + nchunks - 1) / nchunks + 1) & ~(int64_t)1; /* row pairs */
        job.chunk_rows[k] = chunk_rows;
        job.first[k + 1] = job.first[k] + (m->rows + chunk_rows - 1) / chunk_rows;
        job.row0[k] = row;
        row += m->rows;
        need_sums |= m->type == DS4K_Q4_1 || m->type == DS4K_Q5_1 || m->type == DS4K_Q4_K || m->type == DS4K_Q5_K;
        need_sums16 |= m->type == DS4K_Q2_K;
    }
    float xs[GEMV_MAX_COLS / 32];
    if (need_sums) {
        if (cols % 32) return -1;
        for (int64_t b = 0; b < cols / 32; b++) {
            float s = 0.0f;
            for (int k = 0; k < 32; k++) s += x[b * 32 + k];
            xs[b] = s;
        }
    }
    job.xs = xs;
    float xs16[GEMV_MAX_COLS / 16];
    if (need_sums16) {
        if (cols % 16) return -1;
        for (int64_t b = 0; b < cols / 16; b++) {
            float s = 0.0f;
            for (int k = 0; k < 16; k++) s += x[b * 16 + k];
            xs16[b] = s;
        }
    }
    job.xs16 = xs16;
    ds4k_run_chunks(gemv_chunk, &job, job.first[nparts], nth);
    return 0;
}
