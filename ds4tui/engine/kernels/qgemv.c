/* qgemv.c: batch-1 matrix-vector products y = W x, W in GGUF layouts, x and y fp32.
 *
 * Owns: one block kernel per weight type (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
 * Q4_K, Q5_K, Q6_K) written against simd.h, the row loop around them, and gemv, which
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
 * with the per-32 sums of x computed once per call, not once per row. Signed types
 * subtract their offset in the byte domain (exact). Rows go in pairs: the x loads are
 * shared and two accumulator chains hide FMA latency. Software prefetch ahead of each row
 * stream: without it the hardware prefetcher left a 30 MB Q8_0 head at ~5 GB/s from DRAM.
 * Block layouts: dequant.c.
 */

#ifndef PF_DIST
#define PF_DIST 1024 /* bytes ahead of each row stream */
#endif
#define GEMV_MAX_COLS 65536 /* x block sums live on the stack: 2048 per-32 sums max */

/* ---------------------------------------------------------------- block kernels
 * blk_<type>(p, x, xs, acc, off): adds one block's sum_j w_j x_j to acc (vector part) and
 * off (scalar part); x, xs point at the block's first weight / first per-32 sum. */

#define DOT32_U8(lo, hi, x) vf_fma(vf_u8(hi), vf_load((x) + 16), vf_mul(vf_u8(lo), vf_load(x)))
#define DOT32_I8(lo, hi, x) vf_fma(vf_i8(hi), vf_load((x) + 16), vf_mul(vf_i8(lo), vf_load(x)))

static inline void blk_q4_0(const uint8_t *p, const float *x, const float *xs, vf *acc, float *off) {
    (void)xs, (void)off;
    vb v = vb_load(p + 2);
    *acc = vf_fma(vf_set1(h2f(p)), DOT32_I8(vb_sub(vb_lo4(v), 8), vb_sub(vb_hi4(v), 8), x), *acc);
}

static inline void blk_q4_1(const uint8_t *p, const float *x, const float *xs, vf *acc, float *off) {
    vb v = vb_load(p + 4);
    *acc = vf_fma(vf_set1(h2f(p)), DOT32_U8(vb_lo4(v), vb_hi4(v), x), *acc);
    *off += h2f(p + 2) * xs[0];
}

static inline void blk_q5_0(const uint8_t *p, const float *x, const float *xs, vf *acc, float *off) {
    (void)xs, (void)off;
    uint32_t qh;
    memcpy(&qh, p + 2, 4);
    vb v = vb_load(p + 6);
    vb lo = vb_sub(vb_or(vb_lo4(v), vb_from_bits16(qh)), 16);
    vb hi = vb_sub(vb_or(vb_hi4(v), vb_from_bits16(qh >> 16)), 16);
    *acc = vf_fma(vf_set1(h2f(p)), DOT32_I8(lo, hi, x), *acc);
}

static inline void blk_q5_1(const uint8_t *p, const float *x, const float *xs, vf *acc, float *off) {
    uint32_t qh;
    memcpy(&qh, p + 4, 4);
    vb v = vb_load(p + 8);
    vb lo = vb_or(vb_lo4(v), vb_from_bits16(qh)), hi = vb_or(vb_hi4(v), vb_from_bits16(qh >> 16));
    *acc = vf_fma(vf_set1(h2f(p)), DOT32_U8(lo, hi, x), *acc);
    *off += h2f(p + 2) * xs[0];
}

static inline void blk_q8_0(const uint8_t *p, const float *x, const float *xs, vf *acc, float *off) {
    (void)xs, (void)off;
    *acc = vf_fma(vf_set1(h2f(p)), DOT32_I8(vb_load(p + 2), vb_load(p + 18), x), *acc);
}

/* Q4_K and Q5_K: 8 sub-blocks of 32 with their own scale and min. */
static inline void blk_qk45(const uint8_t *p, const float *x, const float *xs, vf *acc, float *off, int five) {
    const float d = h2f(p), dmin = h2f(p + 2);
    const uint8_t *s = p + 4, *qs = p + (five ? 48 : 16);
    vb h0, h1;
    if (five) h0 = vb_load(p + 16), h1 = vb_load(p + 32);
    float o = 0.0f;
    for (int c = 0; c < 4; c++) {
        vb v0 = vb_load(qs + 32 * c), v1 = vb_load(qs + 32 * c + 16);
        for (int half = 0; half < 2; half++) {
            const int i = 2 * c + half;
            vb a = half ? vb_hi4(v0) : vb_lo4(v0), b = half ? vb_hi4(v1) : vb_lo4(v1);
            if (five) a = vb_or(a, vb_bits_hi(h0, i, 1)), b = vb_or(b, vb_bits_hi(h1, i, 1));
            uint8_t sc, mn;
            k4_scale_min(s, i, &sc, &mn);
            *acc = vf_fma(vf_set1(d * (float)sc), DOT32_U8(a, b, x + 32 * i), *acc);
            o += (float)mn * xs[i];
        }
    }
    *off -= dmin * o;
}

static inline void blk_q4_k(const uint8_t *p, const float *x, const float *xs, vf *acc, float *off) {
    blk_qk45(p, x, xs, acc, off, 0);
}

static inline void blk_q5_k(const uint8_t *p, const float *x, const float *xs, vf *acc, float *off) {
    blk_qk45(p, x, xs, acc, off, 1);
}

static inline void blk_q6_k(const uint8_t *p, const float *x, const float *xs, vf *acc, float *off) {
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
            *acc = vf_fma(vf_set1(d * (float)sc[si]), vf_mul(vf_i8(a), vf_load(xe)), *acc);
            *acc = vf_fma(vf_set1(d * (float)sc[si + 1]), vf_mul(vf_i8(b), vf_load(xe + 16)), *acc);
        }
    }
}

/* rows [r0, r1) of a block-quantized matrix; nb blocks of QKB weights and BYTES bytes per row */
#define BLOCK_ROWS(NAME, BLK, QKB, BYTES)                                                     \
    static void NAME(const uint8_t *w, int64_t nb, const float *x, const float *xs, float *y, \
                     int64_t r0, int64_t r1) {                                                \
        const int64_t rb = nb * (BYTES);                                                      \
        int64_t r = r0;                                                                       \
        for (; r + 2 <= r1; r += 2) {                                                         \
            const uint8_t *p = w + r * rb, *q = p + rb;                                       \
            vf a0 = vf_zero(), a1 = vf_zero();                                                \
            float o0 = 0.0f, o1 = 0.0f;                                                       \
            for (int64_t b = 0; b < nb; b++, p += (BYTES), q += (BYTES)) {                    \
                __builtin_prefetch(p + PF_DIST);                                              \
                __builtin_prefetch(q + PF_DIST);                                              \
                BLK(p, x + b * (QKB), xs + b * ((QKB) / 32), &a0, &o0);                       \
                BLK(q, x + b * (QKB), xs + b * ((QKB) / 32), &a1, &o1);                       \
            }                                                                                 \
            y[r] = vf_sum(a0) + o0;                                                           \
            y[r + 1] = vf_sum(a1) + o1;                                                       \
        }                                                                                     \
        for (; r < r1; r++) { /* odd last row */                                              \
            const uint8_t *p = w + r * rb;                                                    \
            vf a0 = vf_zero();                                                                \
            float o0 = 0.0f;                                                                  \
            for (int64_t b = 0; b < nb; b++, p += (BYTES))                                    \
                BLK(p, x + b * (QKB), xs + b * ((QKB) / 32), &a0, &o0);                       \
            y[r] = vf_sum(a0) + o0;                                                           \
        }                                                                                     \
    }

BLOCK_ROWS(q4_0_rows, blk_q4_0, 32, 18)
BLOCK_ROWS(q4_1_rows, blk_q4_1, 32, 20)
BLOCK_ROWS(q5_0_rows, blk_q5_0, 32, 22)
BLOCK_ROWS(q5_1_rows, blk_q5_1, 32, 24)
BLOCK_ROWS(q8_0_rows, blk_q8_0, 32, 34)
BLOCK_ROWS(q4_k_rows, blk_q4_k, 256, 144)
BLOCK_ROWS(q5_k_rows, blk_q5_k, 256, 176)
BLOCK_ROWS(q6_k_rows, blk_q6_k, 256, 210)

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
    const float *x, *xs;
    float *y;
    int64_t cols;
} gemv_job;

static void rows_of(int type, const uint8_t *w, int64_t cols, const float *x, const float *xs, float *y,
                    int64_t r0, int64_t r1) {
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
    rows_of(m->type, m->w, j->cols, j->x, j->xs, j->y + j->row0[k], r0, r1);
}

/* A matrix is cut into an even number of equal chunks of at most this many bytes. Large
 * chunks keep each thread on long sequential runs, which the hardware prefetcher needs:
 * decode measured 79 / 109 / 146 tok/s with 4 / 12 / 128 KB chunks (2 threads, SmolLM2).
 * Bounds depend on the shape only, never on the thread count (see ds4k.h). */
#define CHUNK_BYTES 131072

/* y = [parts stacked by rows] x; 0 on success, -1 for an unsupported type or shape. */
static int gemv(const ds4k_mat *parts, int nparts, const float *x, float *y, int64_t cols, int nth) {
    if (nparts < 1 || nparts > DS4K_MAX_PARTS || cols <= 0 || cols > GEMV_MAX_COLS) return -1;
    gemv_job job = {.parts = parts, .nparts = nparts, .x = x, .y = y, .cols = cols};
    int need_sums = 0;
    int64_t row = 0;
    for (int k = 0; k < nparts; k++) {
        const ds4k_mat *m = &parts[k];
        int64_t rb = ds4k_row_bytes(m->type, cols);
        if (rb == 0 || m->rows <= 0 || m->w == NULL) return -1;
        int64_t nchunks = (m->rows * rb + CHUNK_BYTES - 1) / CHUNK_BYTES;
        nchunks = (nchunks + 1) & ~(int64_t)1;                                    /* even count */
        int64_t chunk_rows = ((m->rows + nchunks - 1) / nchunks + 1) & ~(int64_t)1; /* row pairs */
        job.chunk_rows[k] = chunk_rows;
        job.first[k + 1] = job.first[k] + (m->rows + chunk_rows - 1) / chunk_rows;
        job.row0[k] = row;
        row += m->rows;
        need_sums |= m->type == DS4K_Q4_1 || m->type == DS4K_Q5_1 || m->type == DS4K_Q4_K || m->type == DS4K_Q5_K;
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
    ds4k_run_chunks(gemv_chunk, &job, job.first[nparts], nth);
    return 0;
}
