/* qgemv.c: batch-1 matrix-vector products y = W x, W in GGUF layouts, x and y fp32.
 *
 * Owns: the row kernels for Q4_1, Q8_0 (exactly the file's blocks), F16 and F32 weights,
 * and ds4k_gemv, which splits rows into fixed chunks for the pool (pool.c). Leaves to
 * callers (qgemv.py, llama_step.c): argument checks and which weights take this path
 * (decode at batch 1; short prefills use qgemm.c, long ones a torch fp32 GEMM).
 *
 * Why: decode at batch 1 is memory-bandwidth bound. fp32 weights stream 4 bytes per
 * weight, Q4_1 0.625 and Q8_0 1.0625, so reading the file's blocks directly is 4-6x less
 * traffic. Activations stay fp32 (llama.cpp quantizes them to q8 for an integer dot; we do
 * not), so results equal fp32 dequant + matmul up to float rounding order.
 *
 * Block layouts (ggml-common.h):
 *   Q4_1: f16 d, f16 m, u8 qs[16]; weight j = d * q_j + m, q_j = qs[j] & 15 (j < 16),
 *         qs[j-16] >> 4 (j >= 16).                                 20 bytes / 32 weights
 *   Q8_0: f16 d, i8 qs[32]; weight j = d * qs[j].                 34 bytes / 32 weights
 * For Q4_1 we use sum_j (d q_j + m) x_j = d * sum_j q_j x_j + m * sum_j x_j, with the
 * per-block sums of x computed once per call (not once per row).
 *
 * Built twice by qgemv.py: with -mavx2 -mfma -mf16c (the vector paths) and plain (the
 * scalar paths, for CPUs without AVX2); both give the same results up to rounding order.
 * Rows are processed in pairs: the x loads are shared and two accumulator chains hide
 * FMA latency. Software prefetch ahead of each row stream: without it the hardware
 * prefetcher left a 30 MB Q8_0 head at ~5 GB/s from DRAM (12-14 GB/s with it).
 */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ds4k.h"

#define QK 32
#define Q4_1_BYTES 20
#define Q8_0_BYTES 34
#ifndef PF_DIST
#define PF_DIST 1024 /* bytes ahead of each row stream */
#endif
#define MAX_COLS 65536 /* x block sums live on the stack: 2048 blocks max */


/* ---------------------------------------------------------------- row kernels */

#if DS4K_AVX2
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Two rows per pass: the x loads and nibble masks are shared, and the two accumulator
 * chains hide FMA latency. */
static void q4_1_rows(const uint8_t *w, int64_t nb, const float *x, const float *xs,
                      float *y, int64_t r0, int64_t r1) {
    const int64_t rb = nb * Q4_1_BYTES;
    const __m128i m4 = _mm_set1_epi8(0x0f);
    int64_t r = r0;
    for (; r + 2 <= r1; r += 2) {
        const uint8_t *p = w + r * rb, *q = p + rb;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        __m128 mm = _mm_setzero_ps(); /* lanes 1: m_row0 * xsum, 3: m_row1 * xsum */
        for (int64_t b = 0; b < nb; b++, p += Q4_1_BYTES, q += Q4_1_BYTES) {
            _mm_prefetch((const char *)p + PF_DIST, _MM_HINT_T0);
            _mm_prefetch((const char *)q + PF_DIST, _MM_HINT_T0);
            const float *xb = x + b * QK;
            __m256 x0 = _mm256_loadu_ps(xb), x1 = _mm256_loadu_ps(xb + 8);
            __m256 x2 = _mm256_loadu_ps(xb + 16), x3 = _mm256_loadu_ps(xb + 24);
            /* d, m of both rows as 4 floats: [d0 m0 d1 m1] */
            uint32_t dm0, dm1;
            memcpy(&dm0, p, 4);
            memcpy(&dm1, q, 4);
            __m128 dm = _mm_cvtph_ps(_mm_set_epi32(0, 0, (int)dm1, (int)dm0));
            mm = _mm_fmadd_ps(dm, _mm_set1_ps(xs[b]), mm);

            __m128i v = _mm_loadu_si128((const __m128i *)(p + 4));
            __m128i lo = _mm_and_si128(v, m4), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
            __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), x0);
            s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(lo, lo))), x1, s);
            s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), x2, s);
            s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(hi, hi))), x3, s);
            a0 = _mm256_fmadd_ps(_mm256_broadcastss_ps(dm), s, a0);

            v = _mm_loadu_si128((const __m128i *)(q + 4));
            lo = _mm_and_si128(v, m4);
            hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
            s = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), x0);
            s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(lo, lo))), x1, s);
            s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), x2, s);
            s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(hi, hi))), x3, s);
            a1 = _mm256_fmadd_ps(_mm256_broadcastss_ps(_mm_movehl_ps(dm, dm)), s, a1);
        }
        float m4f[4];
        _mm_storeu_ps(m4f, mm);
        y[r] = hsum8(a0) + m4f[1];
        y[r + 1] = hsum8(a1) + m4f[3];
    }
    for (; r < r1; r++) { /* odd last row */
        const uint8_t *p = w + r * rb;
        __m256 a0 = _mm256_setzero_ps();
        float macc = 0.0f;
        for (int64_t b = 0; b < nb; b++, p += Q4_1_BYTES) {
            const float *xb = x + b * QK;
            float d = ds4k_f16_to_f32(ds4k_rd16(p)), m = ds4k_f16_to_f32(ds4k_rd16(p + 2));
            macc += m * xs[b];
            __m128i v = _mm_loadu_si128((const __m128i *)(p + 4));
            __m128i lo = _mm_and_si128(v, m4), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
            __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), _mm256_loadu_ps(xb));
            s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(lo, lo))), _mm256_loadu_ps(xb + 8), s);
            s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), _mm256_loadu_ps(xb + 16), s);
            s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(hi, hi))), _mm256_loadu_ps(xb + 24), s);
            a0 = _mm256_fmadd_ps(_mm256_set1_ps(d), s, a0);
        }
        y[r] = hsum8(a0) + macc;
    }
}

static inline __m256 q8_block_dot(const uint8_t *qs, const float *xb) {
    __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)qs))), _mm256_loadu_ps(xb));
    s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(qs + 8)))), _mm256_loadu_ps(xb + 8), s);
    s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(qs + 16)))), _mm256_loadu_ps(xb + 16), s);
    s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(qs + 24)))), _mm256_loadu_ps(xb + 24), s);
    return s;
}

static void q8_0_rows(const uint8_t *w, int64_t nb, const float *x, float *y, int64_t r0, int64_t r1) {
    const int64_t rb = nb * Q8_0_BYTES;
    int64_t r = r0;
    for (; r + 2 <= r1; r += 2) {
        const uint8_t *p = w + r * rb, *q = p + rb;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++, p += Q8_0_BYTES, q += Q8_0_BYTES) {
            _mm_prefetch((const char *)p + PF_DIST, _MM_HINT_T0);
            _mm_prefetch((const char *)q + PF_DIST, _MM_HINT_T0);
            const float *xb = x + b * QK;
            __m128 dd = _mm_cvtph_ps(_mm_set_epi16(0, 0, 0, 0, 0, 0, (short)ds4k_rd16(q), (short)ds4k_rd16(p)));
            a0 = _mm256_fmadd_ps(_mm256_broadcastss_ps(dd), q8_block_dot(p + 2, xb), a0);
            a1 = _mm256_fmadd_ps(_mm256_broadcastss_ps(_mm_movehdup_ps(dd)), q8_block_dot(q + 2, xb), a1);
        }
        y[r] = hsum8(a0);
        y[r + 1] = hsum8(a1);
    }
    for (; r < r1; r++) {
        const uint8_t *p = w + r * rb;
        __m256 a0 = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++, p += Q8_0_BYTES)
            a0 = _mm256_fmadd_ps(_mm256_set1_ps(ds4k_f16_to_f32(ds4k_rd16(p))), q8_block_dot(p + 2, x + b * QK), a0);
        y[r] = hsum8(a0);
    }
}

#else /* scalar build */

static void q4_1_rows(const uint8_t *w, int64_t nb, const float *x, const float *xs,
                      float *y, int64_t r0, int64_t r1) {
    const int64_t rb = nb * Q4_1_BYTES;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *p = w + r * rb;
        float acc = 0.0f;
        for (int64_t b = 0; b < nb; b++, p += Q4_1_BYTES) {
            const float *xb = x + b * QK;
            const uint8_t *qs = p + 4;
            float s = 0.0f;
            for (int j = 0; j < 16; j++)
                s += (float)(qs[j] & 15) * xb[j] + (float)(qs[j] >> 4) * xb[j + 16];
            acc += ds4k_f16_to_f32(ds4k_rd16(p)) * s + ds4k_f16_to_f32(ds4k_rd16(p + 2)) * xs[b];
        }
        y[r] = acc;
    }
}

static void q8_0_rows(const uint8_t *w, int64_t nb, const float *x, float *y, int64_t r0, int64_t r1) {
    const int64_t rb = nb * Q8_0_BYTES;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *p = w + r * rb;
        float acc = 0.0f;
        for (int64_t b = 0; b < nb; b++, p += Q8_0_BYTES) {
            const int8_t *qs = (const int8_t *)(p + 2);
            const float *xb = x + b * QK;
            float s = 0.0f;
            for (int j = 0; j < QK; j++) s += (float)qs[j] * xb[j];
            acc += ds4k_f16_to_f32(ds4k_rd16(p)) * s;
        }
        y[r] = acc;
    }
}
#endif


/* ---------------------------------------------------------------- F32 / F16 rows */

#if DS4K_AVX2
#define LOAD_F32(p) _mm256_loadu_ps(p)
#define LOAD_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define DENSE_ROWS(NAME, T, LOAD, SCALAR)                                                    \
    static void NAME(const T *w, int64_t cols, const float *x, float *y, int64_t r0, int64_t r1) { \
        const int64_t c8 = cols & ~(int64_t)7;                                               \
        int64_t r = r0;                                                                      \
        for (; r + 2 <= r1; r += 2) {                                                        \
            const T *p = w + r * cols, *q = p + cols;                                        \
            __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();                       \
            for (int64_t c = 0; c < c8; c += 8) {                                            \
                _mm_prefetch((const char *)(p + c) + PF_DIST, _MM_HINT_T0);                  \
                _mm_prefetch((const char *)(q + c) + PF_DIST, _MM_HINT_T0);                  \
                __m256 xv = _mm256_loadu_ps(x + c);                                          \
                a0 = _mm256_fmadd_ps(LOAD(p + c), xv, a0);                                   \
                a1 = _mm256_fmadd_ps(LOAD(q + c), xv, a1);                                   \
            }                                                                                \
            float s0 = hsum8(a0), s1 = hsum8(a1);                                            \
            for (int64_t c = c8; c < cols; c++) {                                            \
                s0 += SCALAR(p[c]) * x[c];                                                   \
                s1 += SCALAR(q[c]) * x[c];                                                   \
            }                                                                                \
            y[r] = s0;                                                                       \
            y[r + 1] = s1;                                                                   \
        }                                                                                    \
        for (; r < r1; r++) {                                                                \
            const T *p = w + r * cols;                                                       \
            __m256 a0 = _mm256_setzero_ps();                                                 \
            for (int64_t c = 0; c < c8; c += 8) a0 = _mm256_fmadd_ps(LOAD(p + c), _mm256_loadu_ps(x + c), a0); \
            float s0 = hsum8(a0);                                                            \
            for (int64_t c = c8; c < cols; c++) s0 += SCALAR(p[c]) * x[c];                   \
            y[r] = s0;                                                                       \
        }                                                                                    \
    }
#else
#define DENSE_ROWS(NAME, T, LOAD, SCALAR)                                                    \
    static void NAME(const T *w, int64_t cols, const float *x, float *y, int64_t r0, int64_t r1) { \
        for (int64_t r = r0; r < r1; r++) {                                                  \
            const T *p = w + r * cols;                                                       \
            float s = 0.0f;                                                                  \
            for (int64_t c = 0; c < cols; c++) s += SCALAR(p[c]) * x[c];                     \
            y[r] = s;                                                                        \
        }                                                                                    \
    }
#endif
#define AS_F32(v) (v)
DENSE_ROWS(f32_rows, float, LOAD_F32, AS_F32)
DENSE_ROWS(f16_rows, uint16_t, LOAD_F16, ds4k_f16_to_f32)

/* ---------------------------------------------------------------- ds4k_gemv */

typedef struct {
    const void *w;
    const float *x;
    const float *xs;
    float *y;
    int64_t rows, cols, chunk_rows;
    int type;
} gemv_job;

static void gemv_chunk(void *ctx, int64_t c) {
    const gemv_job *j = (const gemv_job *)ctx;
    int64_t r0 = c * j->chunk_rows, r1 = r0 + j->chunk_rows;
    if (r1 > j->rows) r1 = j->rows;
    switch (j->type) {
    case DS4K_Q4_1: q4_1_rows(j->w, j->cols / QK, j->x, j->xs, j->y, r0, r1); break;
    case DS4K_Q8_0: q8_0_rows(j->w, j->cols / QK, j->x, j->y, r0, r1); break;
    case DS4K_F16: f16_rows(j->w, j->cols, j->x, j->y, r0, r1); break;
    default: f32_rows(j->w, j->cols, j->x, j->y, r0, r1); break;
    }
}

/* Bytes per weight row, 0 for an unsupported type or shape. */
static int64_t row_bytes(int type, int64_t cols) {
    switch (type) {
    case DS4K_F32: return 4 * cols;
    case DS4K_F16: return 2 * cols;
    case DS4K_Q4_1: return cols % QK ? 0 : cols / QK * Q4_1_BYTES;
    case DS4K_Q8_0: return cols % QK ? 0 : cols / QK * Q8_0_BYTES;
    default: return 0;
    }
}

/* A matrix is cut into an even number of equal chunks of at most this many bytes. Large
 * chunks keep each thread on long sequential runs, which the hardware prefetcher needs:
 * decode measured 79 / 109 / 146 tok/s with 4 / 12 / 128 KB chunks (2 threads, SmolLM2).
 * A chunk is still only ~15 us of work, so a preempted worker holds the caller up little.
 * Bounds depend on the shape only, never on the thread count (see ds4k.h). */
#define CHUNK_BYTES 131072

int ds4k_gemv(int type, const void *w, const float *x, float *y, int64_t rows, int64_t cols, int nth) {
    int64_t rb = row_bytes(type, cols);
    if (rows <= 0 || cols <= 0 || rb == 0 || cols > MAX_COLS) return -1;
    float xs[MAX_COLS / QK];
    if (type == DS4K_Q4_1) {
        for (int64_t b = 0; b < cols / QK; b++) {
            float s = 0.0f;
            for (int k = 0; k < QK; k++) s += x[b * QK + k];
            xs[b] = s;
        }
    }
    int64_t nchunks = (rows * rb + CHUNK_BYTES - 1) / CHUNK_BYTES;
    nchunks = (nchunks + 1) & ~(int64_t)1;                                   /* even count */
    int64_t chunk_rows = ((rows + nchunks - 1) / nchunks + 1) & ~(int64_t)1; /* row pairs */
    gemv_job job = {w, x, xs, y, rows, cols, chunk_rows, type};
    ds4k_run_chunks(gemv_chunk, &job, (rows + chunk_rows - 1) / chunk_rows, nth);
    return 0;
}

__attribute__((visibility("default"))) int ds4k_gemv_typed(int type, const void *w, const float *x,
                                                          float *y, int64_t rows, int64_t cols, int nth) {
    return ds4k_gemv(type, w, x, y, rows, cols, nth);
}

/* 1: AVX2+FMA+F16C build, 0: portable scalar build. */
int ds4k_isa(void) { return DS4K_AVX2; }

/* Bumped when an entry point changes signature or meaning; qgemv.py checks it. */
int ds4k_abi(void) { return 2; }
