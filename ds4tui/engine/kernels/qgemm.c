/* qgemm.c: small-batch matrix products Y[n, rows] = X[n, cols] W^T, W as Q4_1 / Q8_0 blocks.
 *
 * Owns: ds4k_gemm, for a few dozen activation rows (a short prefill: the new message after
 * a disk-cache restore). Leaves to callers (qgemm.py, llama.py): which shapes take this
 * path; long prefill chunks stay torch fp32 GEMMs, batch-1 decode is the fused step.
 *
 * Why: a 23-token prefill multiplies by every weight once. From the fp32 copy that is
 * 490 MB of weight traffic for ~3 GMAC (SmolLM2), and torch's fp32 GEMM at such a small M
 * ran ~115 ms of a 210 ms forward on 2 cores. The file's blocks are 5x smaller: each group
 * of 4 rows is dequantized once into an L1-resident fp32 tile, then multiplied against
 * every activation row (4 rows x 3 activations per register tile: 12 FMA chains, 7 loads
 * per 12 FMAs), so the FMA ports, not DRAM, are the limit.
 *
 * Results equal dequantize(W) @ x up to float summation order (the same values as the fp32
 * copy, which is the dequantized file). Chunk bounds depend on the shape only, so results
 * never depend on the thread count (ds4k.h).
 */

#include <stdint.h>
#include <string.h>

#include "ds4k.h"

#define QK 32
#define Q4_1_BYTES 20
#define Q8_0_BYTES 34
#define TILE_ROWS 4
#define GEMM_MAX_COLS 8192 /* the dequantized tile lives on the stack: 4 x 8192 floats */
#define CHUNK_ROWS 32      /* rows per pool chunk: a multiple of TILE_ROWS */


/* One row of blocks -> cols floats (gguf's dequantization: d * q + m, d * q; the vector
 * path fuses d * q + m into one FMA, a rounding-order difference only). */
static void dequant_row(int type, const uint8_t *p, int64_t nb, float *out) {
#if DS4K_AVX2
    if (type == DS4K_Q4_1) {
        const __m128i m4 = _mm_set1_epi8(0x0f);
        for (int64_t b = 0; b < nb; b++, out += QK, p += Q4_1_BYTES) {
            __m256 d = _mm256_set1_ps(ds4k_h2f(p)), m = _mm256_set1_ps(ds4k_h2f(p + 2));
            __m128i v = _mm_loadu_si128((const __m128i *)(p + 4));
            __m128i lo = _mm_and_si128(v, m4), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
            _mm256_storeu_ps(out, _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), m));
            _mm256_storeu_ps(out + 8, _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(lo, lo))), m));
            _mm256_storeu_ps(out + 16, _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), m));
            _mm256_storeu_ps(out + 24, _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(hi, hi))), m));
        }
    } else {
        for (int64_t b = 0; b < nb; b++, out += QK, p += Q8_0_BYTES) {
            __m256 d = _mm256_set1_ps(ds4k_h2f(p));
            __m128i v0 = _mm_loadu_si128((const __m128i *)(p + 2)), v1 = _mm_loadu_si128((const __m128i *)(p + 18));
            _mm256_storeu_ps(out, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v0))));
            _mm256_storeu_ps(out + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(v0, v0)))));
            _mm256_storeu_ps(out + 16, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v1))));
            _mm256_storeu_ps(out + 24, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(v1, v1)))));
        }
    }
    return;
#endif
    for (int64_t b = 0; b < nb; b++, out += QK) {
        if (type == DS4K_Q4_1) {
            float d = ds4k_h2f(p), m = ds4k_h2f(p + 2);
            const uint8_t *qs = p + 4;
            for (int j = 0; j < 16; j++) {
                out[j] = d * (float)(qs[j] & 15) + m;
                out[j + 16] = d * (float)(qs[j] >> 4) + m;
            }
            p += Q4_1_BYTES;
        } else {
            float d = ds4k_h2f(p);
            const int8_t *qs = (const int8_t *)(p + 2);
            for (int j = 0; j < QK; j++) out[j] = d * (float)qs[j];
            p += Q8_0_BYTES;
        }
    }
}

#if DS4K_AVX2
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

/* y[t, r0 + i] for i < nr (<= 4), every activation row t, from the tile w[4][cols]. */
static void tile_times_x(const float *w, int64_t cols, const float *x, int64_t n, float *y,
                         int64_t ldy, int64_t r0, int nr) {
    int64_t t = 0;
#if DS4K_AVX2
    const float *w0 = w, *w1 = w + cols, *w2 = w + 2 * cols, *w3 = w + 3 * cols;
    for (; t + 3 <= n; t += 3) {
        const float *xa = x + t * cols, *xb = xa + cols, *xc = xb + cols;
        __m256 a[12];
        for (int k = 0; k < 12; k++) a[k] = _mm256_setzero_ps();
        for (int64_t c = 0; c < cols; c += 8) {
            __m256 va = _mm256_loadu_ps(xa + c), vb = _mm256_loadu_ps(xb + c), vc = _mm256_loadu_ps(xc + c);
            __m256 u = _mm256_loadu_ps(w0 + c);
            a[0] = _mm256_fmadd_ps(u, va, a[0]); a[1] = _mm256_fmadd_ps(u, vb, a[1]); a[2] = _mm256_fmadd_ps(u, vc, a[2]);
            u = _mm256_loadu_ps(w1 + c);
            a[3] = _mm256_fmadd_ps(u, va, a[3]); a[4] = _mm256_fmadd_ps(u, vb, a[4]); a[5] = _mm256_fmadd_ps(u, vc, a[5]);
            u = _mm256_loadu_ps(w2 + c);
            a[6] = _mm256_fmadd_ps(u, va, a[6]); a[7] = _mm256_fmadd_ps(u, vb, a[7]); a[8] = _mm256_fmadd_ps(u, vc, a[8]);
            u = _mm256_loadu_ps(w3 + c);
            a[9] = _mm256_fmadd_ps(u, va, a[9]); a[10] = _mm256_fmadd_ps(u, vb, a[10]); a[11] = _mm256_fmadd_ps(u, vc, a[11]);
        }
        for (int i = 0; i < nr; i++)
            for (int k = 0; k < 3; k++) y[(t + k) * ldy + r0 + i] = hsum8(a[3 * i + k]);
    }
    for (; t < n; t++) {
        const float *xa = x + t * cols;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t c = 0; c < cols; c += 8) {
            __m256 va = _mm256_loadu_ps(xa + c);
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + c), va, a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + c), va, a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + c), va, a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + c), va, a3);
        }
        float s[4] = {hsum8(a0), hsum8(a1), hsum8(a2), hsum8(a3)};
        for (int i = 0; i < nr; i++) y[t * ldy + r0 + i] = s[i];
    }
#else
    for (; t < n; t++) {
        const float *xa = x + t * cols;
        for (int i = 0; i < nr; i++) {
            const float *wi = w + i * cols;
            float s = 0.0f;
            for (int64_t c = 0; c < cols; c++) s += wi[c] * xa[c];
            y[t * ldy + r0 + i] = s;
        }
    }
#endif
}

typedef struct {
    const uint8_t *w;
    const float *x;
    float *y;
    int64_t rows, cols, n, row_bytes;
    int type;
} gemm_job;

static void gemm_chunk(void *ctx, int64_t c) {
    const gemm_job *j = (const gemm_job *)ctx;
    float tile[TILE_ROWS * GEMM_MAX_COLS] __attribute__((aligned(32)));
    int64_t r1 = (c + 1) * CHUNK_ROWS;
    if (r1 > j->rows) r1 = j->rows;
    for (int64_t r = c * CHUNK_ROWS; r < r1; r += TILE_ROWS) {
        int nr = r1 - r < TILE_ROWS ? (int)(r1 - r) : TILE_ROWS;
        for (int i = 0; i < TILE_ROWS; i++) {
            if (i < nr)
                dequant_row(j->type, j->w + (r + i) * j->row_bytes, j->cols / QK, tile + i * j->cols);
            else /* a short last tile: zero rows, never stored */
                memset(tile + i * j->cols, 0, (size_t)j->cols * sizeof(float));
        }
        tile_times_x(tile, j->cols, j->x, j->n, j->y, j->rows, r, nr);
    }
}

/* Y[n, rows] = X[n, cols] W^T; 0 on success, -1 for an unsupported type or shape. */
__attribute__((visibility("default"))) int ds4k_gemm(int type, const void *w, const float *x, float *y,
                                                     int64_t rows, int64_t cols, int64_t n, int nth) {
    int64_t rb;
    if (type == DS4K_Q4_1) rb = cols / QK * Q4_1_BYTES;
    else if (type == DS4K_Q8_0) rb = cols / QK * Q8_0_BYTES;
    else return -1;
    if (rows <= 0 || n <= 0 || cols <= 0 || cols % QK || cols > GEMM_MAX_COLS) return -1;
    gemm_job job = {(const uint8_t *)w, x, y, rows, cols, n, rb, type};
    ds4k_run_chunks(gemm_chunk, &job, (rows + CHUNK_ROWS - 1) / CHUNK_ROWS, nth);
    return 0;
}
