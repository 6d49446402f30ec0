/* qgemm.c: matrix products Y[n, rows] = X[n, cols] W^T, W in any ds4k type.
 *
 * Owns: gemm, for anything from a few activation rows (a short prefill: the new message after
 * a disk-cache restore) to a 512-token prefill chunk. Leaves to callers (dispatch.c,
 * qgemm.py, the llama forward): which shapes take this path (every prefill chunk with the
 * AVX-512 variant, chunks up to 256 rows with the others; batch-1 decode is the fused
 * step). Compiled once per ISA by isa.c.
 *
 * Why: a short prefill multiplies by every weight once. From the fp32 copy that is 4-8x the
 * weight traffic of the file's blocks, and torch's fp32 GEMM at such a small M is memory
 * bound (docs/perf-archive.md, "Short prefills"). So weight rows are dequantized once per pool chunk
 * (dequant.c, bit-exact to gguf) into fp32 tiles that stay in cache, then multiplied against
 * every activation row, so the FMA ports, not DRAM, are the limit:
 * - few activation rows: 4 weight rows x 6 activations per register tile (AVX-512; 4 x 3
 *   with AVX2), summed along the columns and reduced once per output;
 * - many (>= WIDE_MIN_ROWS, vector ISAs): the chunk's 32 rows dequantized transposed
 *   (dequant_rows_t32), 12 activations x 32 outputs per register tile with AVX-512, 6 x 16
 *   with AVX2, no reductions. This beats torch's fp32 GEMM at 512 rows, hence every chunk
 *   takes the blocks with AVX-512 (docs/perf-archive.md, "Prefill: attention and GEMMs in C").
 * - Q4_1 with AVX-512, any number of rows (up to 2048 columns): the same 12 x 32 tiles, but
 *   the first tile dequantizes from regrouped quant bytes in registers and stores the
 *   transposed chunk for the tiles after it (q4_1_first_tile), so a short product pays no
 *   separate dequantization pass (docs/perf-archive.md, "Short products without a dequantization
 *   pass").
 *
 * - on a CPU with AVX512_BF16, unless the caller's configuration says fp32 (DS4K_CFG_BF16 clear), products of 96 rows and
 *   more, and Q4_1 products of any length (its first tile dequantizes pairs of columns in
 *   registers, so a short product gains too; other types' short ones pay a dequantization
 *   pass that bf16 does not shorten): the wide tiles with weights and activations rounded to
 *   bf16 (to nearest even) and summed in fp32 by vdpbf16ps, two columns per instruction,
 *   twice the fp32 FMA rate (docs/perf-archive.md, "Prefill products in bf16").
 *
 * Results equal dequantize(W) @ x up to float summation order (the same values as the fp32
 * copy, which is the dequantized file), or on the bf16 path bf16(dequantize(W)) @ bf16(x)
 * summed in fp32. Chunk bounds and the path taken depend on the shape and that switch only,
 * so results never depend on the thread count (ds4k.h).
 */

#define TILE_ROWS 4
#define GEMM_MAX_COLS 8192  /* the dequantized tiles live on the stack: at least one 4 x 8192 tile */
#define CHUNK_ROWS 32       /* rows per pool chunk: a multiple of TILE_ROWS */
#define GROUP_FLOATS 65536  /* dequantized rows kept per chunk: 256 KB */
#define X_BLOCK 48          /* activation rows per pass over the dequantized rows (a multiple of 6) */
#define K_PANEL 768         /* at most this many columns per pass of the AVX-512 micro-tiles */

#if DS4K_ISA >= 2
/* y[a, i] (+)= sum_c x[a][c] w[i][c] for a < na (<= 6), i < TILE_ROWS, c < len: 24 FMA chains,
 * 10 loads per 24 FMAs, one 16-wide reduction per output; len % 16 != 0 ends masked. w and x
 * rows are ld floats apart; y is [na][TILE_ROWS]. */
static inline __attribute__((always_inline)) void tile_times_x16(const float *w, const float *x, int64_t ld,
                                                                int64_t len, float *y, int add, const int na) {
    __m512 acc[TILE_ROWS][6];
    for (int i = 0; i < TILE_ROWS; i++)
        for (int a = 0; a < na; a++) acc[i][a] = _mm512_setzero_ps();
    int64_t c = 0;
    for (; c + 16 <= len; c += 16) {
        __m512 xv[6];
        for (int a = 0; a < na; a++) xv[a] = _mm512_loadu_ps(x + a * ld + c);
        for (int i = 0; i < TILE_ROWS; i++) {
            __m512 wv = _mm512_loadu_ps(w + i * ld + c);
            for (int a = 0; a < na; a++) acc[i][a] = _mm512_fmadd_ps(wv, xv[a], acc[i][a]);
        }
    }
    if (c < len) {
        const __mmask16 k = (__mmask16)((1u << (len - c)) - 1);
        __m512 xv[6];
        for (int a = 0; a < na; a++) xv[a] = _mm512_maskz_loadu_ps(k, x + a * ld + c);
        for (int i = 0; i < TILE_ROWS; i++) {
            __m512 wv = _mm512_maskz_loadu_ps(k, w + i * ld + c);
            for (int a = 0; a < na; a++) acc[i][a] = _mm512_fmadd_ps(wv, xv[a], acc[i][a]);
        }
    }
    for (int a = 0; a < na; a++) {
        /* The four rows' sums at once: pairwise adds of interleaved lanes, then the 128-bit
         * quarters (half the shuffles of four separate reductions). */
        const __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(acc[0][a], acc[1][a]), _mm512_unpackhi_ps(acc[0][a], acc[1][a]));
        const __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(acc[2][a], acc[3][a]), _mm512_unpackhi_ps(acc[2][a], acc[3][a]));
        const __m512 t2 = _mm512_add_ps(_mm512_shuffle_ps(t0, t1, _MM_SHUFFLE(1, 0, 1, 0)),
                                        _mm512_shuffle_ps(t0, t1, _MM_SHUFFLE(3, 2, 3, 2)));
        const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(t2), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(t2), 1)));
        __m128 v = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        if (add) v = _mm_add_ps(_mm_loadu_ps(y + a * TILE_ROWS), v);
        _mm_storeu_ps(y + a * TILE_ROWS, v);
    }
}

/* Y[t][i] for t < n activation rows and the rows of `tiles` (ntile 4-row tiles of cols floats
 * each row), into ybuf [n][ntile * 4]. Columns go in panels of <= K_PANEL so that the six x rows
 * and four w rows of a micro-tile stay in L1 (wide rows: w2's 1536 columns); the panels' sums
 * add up in panel order. */
static void tiles_times_x16(const float *tiles, int ntile, const float *x, int64_t n, int64_t cols, float *ybuf) {
    float part[6 * TILE_ROWS];
    const int64_t ldy = (int64_t)ntile * TILE_ROWS;
    const int64_t npanel = (cols + K_PANEL - 1) / K_PANEL;
    const int64_t panel = ((cols + npanel - 1) / npanel + 15) / 16 * 16; /* equal panels, whole vectors */
    for (int64_t k0 = 0; k0 < cols; k0 += panel) {
        const int64_t len = cols - k0 < panel ? cols - k0 : panel;
        for (int64_t t = 0; t < n; t += 6) {
            const int na = n - t < 6 ? (int)(n - t) : 6;
            for (int tile = 0; tile < ntile; tile++) {
                const float *w = tiles + (int64_t)tile * TILE_ROWS * cols + k0, *xa = x + t * cols + k0;
                float *yt = ybuf + t * ldy + tile * TILE_ROWS;
                if (k0 > 0)
                    for (int a = 0; a < na; a++) memcpy(part + a * TILE_ROWS, yt + a * ldy, sizeof(float) * TILE_ROWS);
                switch (na) {
                case 6: tile_times_x16(w, xa, cols, len, part, k0 > 0, 6); break;
                case 5: tile_times_x16(w, xa, cols, len, part, k0 > 0, 5); break;
                case 4: tile_times_x16(w, xa, cols, len, part, k0 > 0, 4); break;
                case 3: tile_times_x16(w, xa, cols, len, part, k0 > 0, 3); break;
                case 2: tile_times_x16(w, xa, cols, len, part, k0 > 0, 2); break;
                default: tile_times_x16(w, xa, cols, len, part, k0 > 0, 1); break;
                }
                for (int a = 0; a < na; a++) memcpy(yt + a * ldy, part + a * TILE_ROWS, sizeof(float) * TILE_ROWS);
            }
        }
    }
}
#endif

#if DS4K_ISA >= 1
/* Long products (many activation rows): the chunk's 32 weight rows dequantized transposed,
 * wt[c][32], so a micro-tile keeps WIDE_ACTS activation rows x WIDE_OUTS outputs in
 * registers and needs no horizontal sums: each output is one sequential sum over the
 * columns, carried across column panels through ybuf. AVX-512: 12 x 32 in 24 registers, two
 * wt loads and 12 broadcasts per 24 FMAs; AVX2: 6 x 16 in 12 of its 16 registers, two
 * loads and 6 broadcasts per 12 FMAs, the chunk's two 16-row halves one after the other. */
#if DS4K_ISA >= 2
#define WIDE_ACTS 12
#define WIDE_OUTS 32
#define WIDE_PANEL 256    /* columns per panel: wt's 32 KB panel stays in L1 across activations */
#else
#define WIDE_ACTS 6
#define WIDE_OUTS 16
#define WIDE_PANEL 128    /* 16 KB of wt per panel: AVX2 CPUs may have a 32 KB L1 */
#endif
#define WIDE_BLOCK 240    /* activation rows per pass (a multiple of WIDE_ACTS): ybuf is 30 KB */
#define WIDE_MIN_ROWS 96  /* products with fewer activation rows take the short tiles */

#if DS4K_ISA >= 2
/* The first nout (<= 32) outputs of a tile's na activation rows, rows ldo floats apart. */
static inline __attribute__((always_inline)) void store_tile32(__m512 acc[][2], const int na, float *out, int64_t ldo,
                                                               int nout) {
    const __mmask16 m0 = nout >= 16 ? 0xffff : (__mmask16)((1u << nout) - 1);
    const __mmask16 m1 = nout >= 32 ? 0xffff : nout <= 16 ? 0 : (__mmask16)((1u << (nout - 16)) - 1);
    for (int a = 0; a < na; a++) {
        _mm512_mask_storeu_ps(out + a * ldo, m0, acc[a][0]);
        _mm512_mask_storeu_ps(out + a * ldo + 16, m1, acc[a][1]);
    }
}
#endif

/* Adds x[a] . wt over len columns to the WIDE_OUTS sums of ybuf[a * 32] (or starts them from
 * 0 when first) for a < na, then stores the first nout of them to out[a * ldo]: the running
 * sums back into ybuf between column panels, the outputs straight into Y after the last one
 * (a copy from ybuf afterwards stalled on Y's cache misses one row at a time). wt and ybuf
 * rows are 32 floats apart. Row a of x is read as p[a / 3][(a % 3) * ldx]: a few pointers
 * and two strides keep the loop's addresses in registers (one offset per row spilled to
 * the stack). */
static inline __attribute__((always_inline)) void wide_tile(const float *wt, const float *x, int64_t ldx, int64_t len,
                                                           const float *ybuf, int first, float *out, int64_t ldo,
                                                           int nout, const int na) {
    const float *p[WIDE_ACTS / 3];
    for (int k = 0; k < WIDE_ACTS / 3; k++) p[k] = x + 3 * k * ldx;
    const int64_t s2 = 2 * ldx;
#if DS4K_ISA >= 2
    __m512 acc[WIDE_ACTS][2];
    for (int a = 0; a < na; a++) {
        acc[a][0] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(ybuf + a * 32);
        acc[a][1] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(ybuf + a * 32 + 16);
    }
    for (int64_t c = 0; c < len; c++) {
        const __m512 w0 = _mm512_loadu_ps(wt + c * 32), w1 = _mm512_loadu_ps(wt + c * 32 + 16);
        for (int a = 0; a < na; a++) {
            const float *xr = p[a / 3];
            const __m512 xb = _mm512_set1_ps(a % 3 == 0 ? xr[0] : a % 3 == 1 ? xr[ldx] : xr[s2]);
            acc[a][0] = _mm512_fmadd_ps(w0, xb, acc[a][0]);
            acc[a][1] = _mm512_fmadd_ps(w1, xb, acc[a][1]);
        }
        for (int k = 0; k < WIDE_ACTS / 3; k++) p[k]++;
    }
    store_tile32(acc, na, out, ldo, nout);
#else
    __m256 acc[WIDE_ACTS][2];
    for (int a = 0; a < na; a++) {
        acc[a][0] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(ybuf + a * 32);
        acc[a][1] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(ybuf + a * 32 + 8);
    }
    for (int64_t c = 0; c < len; c++) {
        const __m256 w0 = _mm256_loadu_ps(wt + c * 32), w1 = _mm256_loadu_ps(wt + c * 32 + 8);
        for (int a = 0; a < na; a++) {
            const float *xr = p[a / 3];
            const __m256 xb = _mm256_broadcast_ss(a % 3 == 0 ? xr : a % 3 == 1 ? xr + ldx : xr + s2);
            acc[a][0] = _mm256_fmadd_ps(w0, xb, acc[a][0]);
            acc[a][1] = _mm256_fmadd_ps(w1, xb, acc[a][1]);
        }
        for (int k = 0; k < WIDE_ACTS / 3; k++) p[k]++;
    }
    if (nout >= 16) {
        for (int a = 0; a < na; a++) {
            _mm256_storeu_ps(out + a * ldo, acc[a][0]);
            _mm256_storeu_ps(out + a * ldo + 8, acc[a][1]);
        }
    } else {
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        const __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(nout), lane);
        const __m256i m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(nout - 8), lane);
        for (int a = 0; a < na; a++) {
            _mm256_maskstore_ps(out + a * ldo, m0, acc[a][0]);
            _mm256_maskstore_ps(out + a * ldo + 8, m1, acc[a][1]);
        }
    }
#endif
}

#if DS4K_ISA >= 2 && DS4K_HAVE_BF16
/* The wide tiles in bf16 (AVX512_BF16): wb[c / 2][32] holds, per output o, the pair of
 * columns (2c', 2c' + 1) as two bf16 in one dword, and xb the activations' column pairs the
 * same way (a row of x in bf16 is already that: consecutive columns are adjacent), so one
 * vdpbf16ps adds two columns' products of 16 outputs. Same tiles, panels and carried sums
 * as wide_tile; pairs instead of columns. */
#define BF16_TARGET __attribute__((target("avx512bf16")))

/* Lanes i of a and b (16 outputs of two adjacent columns) rounded to bf16 and interleaved:
 * dword i = (a[i], b[i]), the pair one vdpbf16ps lane multiplies. */
static inline BF16_TARGET __attribute__((always_inline)) __m512i bf16_pairs16(__m512 a, __m512 b) {
    static const uint16_t order[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                       8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    /* cvtne2ps gives a in the low 16 words, b in the high ones */
    return _mm512_permutexvar_epi16(_mm512_loadu_si512(order), (__m512i)_mm512_cvtne2ps_pbh(b, a));
}

/* wt[cols][32] (fp32, as dequant_rows_t32 leaves it) -> the pair layout, in place: pair p is
 * written over bytes the loads of pairs <= p have already read. cols is even. */
static BF16_TARGET void wt_to_bf16_pairs(float *wt, int64_t cols) {
    uint32_t *wb = (uint32_t *)wt;
    for (int64_t c = 0; c < cols; c += 2) {
        const __m512 a0 = _mm512_loadu_ps(wt + c * 32), a1 = _mm512_loadu_ps(wt + c * 32 + 16);
        const __m512 b0 = _mm512_loadu_ps(wt + (c + 1) * 32), b1 = _mm512_loadu_ps(wt + (c + 1) * 32 + 16);
        _mm512_storeu_si512(wb + (c / 2) * 32, bf16_pairs16(a0, b0));
        _mm512_storeu_si512(wb + (c / 2) * 32 + 16, bf16_pairs16(a1, b1));
    }
}

/* rows [t0, t1) of x [n, cols] fp32 -> xb [n, cols] bf16 (rounded to nearest even) */
static BF16_TARGET void x_to_bf16(const float *x, int64_t t0, int64_t t1, int64_t cols, uint16_t *xb) {
    for (int64_t t = t0; t < t1; t++) {
        const float *r = x + t * cols;
        uint16_t *o = xb + t * cols;
        for (int64_t c = 0; c < cols; c += 32) {
            const int64_t left = cols - c;
            const __mmask16 k0 = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
            const __mmask16 k1 = left >= 32 ? 0xffff : left <= 16 ? 0 : (__mmask16)((1u << (left - 16)) - 1);
            const __m512i v = (__m512i)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(k1, r + c + 16), _mm512_maskz_loadu_ps(k0, r + c));
            _mm512_mask_storeu_epi16(o + c, ((__mmask32)k1 << 16) | k0, v);
        }
    }
}

#define X_BF16_ROWS 32 /* activation rows per pool chunk of the conversion */
typedef struct {
    const float *x;
    uint16_t *xb;
    int64_t n, cols;
} x_bf16_job;

static void x_bf16_chunk(void *ctx, int64_t c) {
    const x_bf16_job *j = (const x_bf16_job *)ctx;
    const int64_t t0 = c * X_BF16_ROWS, t1 = t0 + X_BF16_ROWS < j->n ? t0 + X_BF16_ROWS : j->n;
    x_to_bf16(j->x, t0, t1, j->cols, j->xb);
}

/* wide_tile over len2 column pairs: x rows are ldx2 dwords apart (pairs of bf16). */
static inline BF16_TARGET __attribute__((always_inline)) void wide_tile_bf16(const uint32_t *wb, const uint32_t *x,
                                                                            int64_t ldx2, int64_t len2, const float *ybuf,
                                                                            int first, float *out, int64_t ldo, int nout,
                                                                            const int na) {
    const uint32_t *p[WIDE_ACTS / 3];
    for (int k = 0; k < WIDE_ACTS / 3; k++) p[k] = x + 3 * k * ldx2;
    const int64_t s2 = 2 * ldx2;
    __m512 acc[WIDE_ACTS][2];
    for (int a = 0; a < na; a++) {
        acc[a][0] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(ybuf + a * 32);
        acc[a][1] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(ybuf + a * 32 + 16);
    }
    for (int64_t c = 0; c < len2; c++) {
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512(wb + c * 32), w1 = (__m512bh)_mm512_loadu_si512(wb + c * 32 + 16);
        for (int a = 0; a < na; a++) {
            const uint32_t *xr = p[a / 3];
            const __m512bh xv = (__m512bh)_mm512_set1_epi32((int)(a % 3 == 0 ? xr[0] : a % 3 == 1 ? xr[ldx2] : xr[s2]));
            acc[a][0] = _mm512_dpbf16_ps(acc[a][0], w0, xv);
            acc[a][1] = _mm512_dpbf16_ps(acc[a][1], w1, xv);
        }
        for (int k = 0; k < WIDE_ACTS / 3; k++) p[k]++;
    }
    store_tile32(acc, na, out, ldo, nout);
}
#endif

#if DS4K_ISA >= 2 && DS4K_HAVE_BF16
#define WIDE_TARGET BF16_TARGET /* may call the bf16 tile; runs no bf16 instruction otherwise */
#else
#define WIDE_TARGET
#endif

/* y[t][i] (rows ldy floats apart) for every activation row t and the nr (<= 32) rows
 * dequantized in wt, over `units` columns of x [n, units]; with bf16 (AVX512_BF16 builds),
 * wt and x hold bf16 column pairs instead (wt_to_bf16_pairs, x_to_bf16), `units` pairs per
 * row: the same 4-byte units, tiles, panels and carried sums. */
static WIDE_TARGET void wide_chunk(const float *wt, const float *x, int64_t n, int64_t units, float *y, int64_t ldy,
                                   int nr, int bf16) {
    float ybuf[WIDE_BLOCK * 32] __attribute__((aligned(64)));
    const int64_t npanel = (units + WIDE_PANEL - 1) / WIDE_PANEL, panel = (units + npanel - 1) / npanel;
    for (int64_t t0 = 0; t0 < n; t0 += WIDE_BLOCK) {
        const int64_t nt = n - t0 < WIDE_BLOCK ? n - t0 : WIDE_BLOCK;
        for (int64_t k0 = 0; k0 < units; k0 += panel) {
            const int64_t len = units - k0 < panel ? units - k0 : panel;
            const int first = k0 == 0, last = k0 + len == units;
            for (int h = 0; h < nr; h += WIDE_OUTS) /* the outputs of one micro-tile width */
                for (int64_t a = 0; a < nt; a += WIDE_ACTS) {
                    const float *xa = x + (t0 + a) * units + k0;
                    float *yb = ybuf + a * 32 + h, *out = last ? y + (t0 + a) * ldy + h : yb;
                    const int64_t ldo = last ? ldy : 32;
                    const int nout = last && nr - h < WIDE_OUTS ? nr - h : WIDE_OUTS;
#if DS4K_ISA >= 2 && DS4K_HAVE_BF16
#define WIDE_TILE(na)                                                                                           \
    (bf16 ? wide_tile_bf16((const uint32_t *)wt + k0 * 32 + h, (const uint32_t *)xa, units, len, yb, first, out, \
                           ldo, nout, na)                                                                       \
          : wide_tile(wt + k0 * 32 + h, xa, units, len, yb, first, out, ldo, nout, na))
#else
#define WIDE_TILE(na) ((void)bf16, wide_tile(wt + k0 * 32 + h, xa, units, len, yb, first, out, ldo, nout, na))
#endif
                    switch (nt - a < WIDE_ACTS ? nt - a : WIDE_ACTS) {
#if DS4K_ISA >= 2
                    case 12: WIDE_TILE(12); break;
                    case 11: WIDE_TILE(11); break;
                    case 10: WIDE_TILE(10); break;
                    case 9: WIDE_TILE(9); break;
                    case 8: WIDE_TILE(8); break;
                    case 7: WIDE_TILE(7); break;
#endif
                    case 6: WIDE_TILE(6); break;
                    case 5: WIDE_TILE(5); break;
                    case 4: WIDE_TILE(4); break;
                    case 3: WIDE_TILE(3); break;
                    case 2: WIDE_TILE(2); break;
                    default: WIDE_TILE(1); break;
                    }
#undef WIDE_TILE
                }
        }
    }
}
#endif

#if DS4K_ISA >= 2
/* Q4_1 products (up to 2048 columns; AVX-512) on the wide tiles with no separate
 * dequantization pass. The chunk's blocks are regrouped once into bytes (q4_1_bytes32: a
 * column of 16 rows is 16 bytes), then the first tile of up to 12 activations dequantizes
 * each column in registers as it goes (q4_1_bytes_col16) and, when more activations follow,
 * also stores it into wt for wide_chunk. Dequantizing alone
 * was bound by its 512-bit stores (about two per ns here, ~0.11 ms per SmolLM2 layer) while
 * the FMA pipes idled; riding along a tile, the stores are free and the dequantization
 * costs a few FMA-pipe operations per 24 FMAs. Each output is the same sequential sum over
 * the columns as wide_tile's, so the results are the wide path's bits. */
static inline __attribute__((always_inline)) void q4_1_first_tile(const q4_1_bytes *prep, int64_t nb, const float *x,
                                                                 int64_t ldx, float *out, int64_t ldo, int nout,
                                                                 float *wt, const int na) {
    const float *p[WIDE_ACTS / 3];
    for (int k = 0; k < WIDE_ACTS / 3; k++) p[k] = x + 3 * k * ldx;
    const int64_t s2 = 2 * ldx;
    __m512 acc[WIDE_ACTS][2];
    for (int a = 0; a < na; a++) acc[a][0] = acc[a][1] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const q4_1_bytes *q = prep + b;
        for (int j = 0; j < 32; j++) {
            const __m512 w0 = q4_1_bytes_col16(q, 0, j), w1 = q4_1_bytes_col16(q, 1, j);
            if (wt) {
                _mm512_storeu_ps(wt + (b * 32 + j) * 32, w0);
                _mm512_storeu_ps(wt + (b * 32 + j) * 32 + 16, w1);
            }
            for (int a = 0; a < na; a++) {
                const float *xr = p[a / 3];
                const __m512 xb = _mm512_set1_ps(a % 3 == 0 ? xr[j] : a % 3 == 1 ? xr[ldx + j] : xr[s2 + j]);
                acc[a][0] = _mm512_fmadd_ps(w0, xb, acc[a][0]);
                acc[a][1] = _mm512_fmadd_ps(w1, xb, acc[a][1]);
            }
        }
        for (int k = 0; k < WIDE_ACTS / 3; k++) p[k] += 32;
    }
    store_tile32(acc, na, out, ldo, nout);
}

#if DS4K_HAVE_BF16
/* q4_1_first_tile on the bf16 tiles: each pair of columns is dequantized in registers
 * (q4_1_bytes_col16: dequant_row's bits), rounded to a bf16 pair (as wt_to_bf16_pairs
 * rounds the same floats) and multiplied by the activations' bf16 pairs (x, ldx2 dwords a
 * row); stored into wb for wide_chunk when more activations follow. Each output is the same
 * sequential sum over the pairs as wide_tile_bf16's, so the results are the bf16 wide path's
 * bits: a short product pays neither a dequantization pass nor fp32 FMAs. */
static inline BF16_TARGET __attribute__((always_inline)) void q4_1_first_tile_bf16(
    const q4_1_bytes *prep, int64_t nb, const uint32_t *x, int64_t ldx2, float *out, int64_t ldo, int nout,
    uint32_t *wb, const int na) {
    const uint32_t *p[WIDE_ACTS / 3];
    for (int k = 0; k < WIDE_ACTS / 3; k++) p[k] = x + 3 * k * ldx2;
    const int64_t s2 = 2 * ldx2;
    __m512 acc[WIDE_ACTS][2];
    for (int a = 0; a < na; a++) acc[a][0] = acc[a][1] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const q4_1_bytes *q = prep + b;
        for (int j = 0; j < 32; j += 2) {
            const __m512bh w0 = (__m512bh)bf16_pairs16(q4_1_bytes_col16(q, 0, j), q4_1_bytes_col16(q, 0, j + 1));
            const __m512bh w1 = (__m512bh)bf16_pairs16(q4_1_bytes_col16(q, 1, j), q4_1_bytes_col16(q, 1, j + 1));
            if (wb) {
                _mm512_storeu_si512(wb + (b * 16 + j / 2) * 32, (__m512i)w0);
                _mm512_storeu_si512(wb + (b * 16 + j / 2) * 32 + 16, (__m512i)w1);
            }
            for (int a = 0; a < na; a++) {
                const uint32_t *xr = p[a / 3] + j / 2;
                const __m512bh xv = (__m512bh)_mm512_set1_epi32((int)(a % 3 == 0 ? xr[0] : a % 3 == 1 ? xr[ldx2] : xr[s2]));
                acc[a][0] = _mm512_dpbf16_ps(acc[a][0], w0, xv);
                acc[a][1] = _mm512_dpbf16_ps(acc[a][1], w1, xv);
            }
        }
        for (int k = 0; k < WIDE_ACTS / 3; k++) p[k] += 16;
    }
    store_tile32(acc, na, out, ldo, nout);
}
#endif

/* y[t][i] (rows ldy floats apart) for every activation row t and the nr (<= 32) Q4_1 rows at
 * wq (rb bytes apart); wt has room for 32 x cols floats, prep for cols / 32 q4_1_bytes. With
 * xb (bf16 builds, bf16 on), on the bf16 tiles: x is then unused and xb its bf16 copy. */
static WIDE_TARGET void q4_1_fused_chunk(const uint8_t *wq, int64_t rb, int nr, const float *x, const uint16_t *xb,
                                         int64_t n, int64_t cols, float *y, int64_t ldy, float *wt, q4_1_bytes *prep) {
    const int64_t nb = cols / 32;
    q4_1_bytes32(wq, rb, nr, nb, prep);
#if DS4K_HAVE_BF16
    const uint32_t *x2 = (const uint32_t *)xb; /* the activations' bf16 pairs, or NULL: fp32 tiles */
    const int64_t ld2 = cols / 2;
#define FIRST_TILE(na, out_wt)                                                                \
    (x2 ? q4_1_first_tile_bf16(prep, nb, x2, ld2, y, ldy, nr, (uint32_t *)(out_wt), na)      \
        : q4_1_first_tile(prep, nb, x, cols, y, ldy, nr, (out_wt), na))
#else
    (void)xb;
#define FIRST_TILE(na, out_wt) q4_1_first_tile(prep, nb, x, cols, y, ldy, nr, (out_wt), na)
#endif
    if (n > WIDE_ACTS) {
        FIRST_TILE(WIDE_ACTS, wt);
#if DS4K_HAVE_BF16
        if (x2) {
            wide_chunk(wt, (const float *)(x2 + WIDE_ACTS * ld2), n - WIDE_ACTS, ld2, y + WIDE_ACTS * ldy, ldy, nr, 1);
            return;
        }
#endif
        wide_chunk(wt, x + WIDE_ACTS * cols, n - WIDE_ACTS, cols, y + WIDE_ACTS * ldy, ldy, nr, 0);
        return;
    }
    switch (n) {
    case 12: FIRST_TILE(12, NULL); break;
    case 11: FIRST_TILE(11, NULL); break;
    case 10: FIRST_TILE(10, NULL); break;
    case 9: FIRST_TILE(9, NULL); break;
    case 8: FIRST_TILE(8, NULL); break;
    case 7: FIRST_TILE(7, NULL); break;
    case 6: FIRST_TILE(6, NULL); break;
    case 5: FIRST_TILE(5, NULL); break;
    case 4: FIRST_TILE(4, NULL); break;
    case 3: FIRST_TILE(3, NULL); break;
    case 2: FIRST_TILE(2, NULL); break;
    default: FIRST_TILE(1, NULL); break;
    }
#undef FIRST_TILE
}
#endif

#if DS4K_ISA < 2 /* the AVX-512 build multiplies its tiles with tiles_times_x16 */
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

#endif

typedef struct {
    const ds4k_mat *parts;
    int64_t first[DS4K_MAX_PARTS + 1]; /* first global chunk of each part */
    int64_t row0[DS4K_MAX_PARTS];      /* first output column of each part */
    const float *x;
    const uint16_t *xb; /* x in bf16 when the chunks take the bf16 tiles, else NULL */
    float *y;
    int64_t rows, cols, n;
    int64_t nth; /* threads on the job: only for prefetch hints */
} gemm_job;

static void gemm_chunk(void *ctx, int64_t c) {
    const gemm_job *j = (const gemm_job *)ctx;
    /* Dequantized rows, up to 256 KB (all 32 rows of the chunk up to 2048 columns): then
     * multiplied by one block of activation rows after another, so a block (up to X_BLOCK
     * rows) stays in L2 across the tiles instead of streaming the whole X once per tile. */
    float tiles[GROUP_FLOATS] __attribute__((aligned(64)));
    int k = 0;
    while (c >= j->first[k + 1]) k++;
    const ds4k_mat *m = &j->parts[k];
    const int64_t rb = ds4k_row_bytes(m->type, j->cols);
    const int64_t group = GROUP_FLOATS / (TILE_ROWS * j->cols) * TILE_ROWS;
    int64_t r0 = (c - j->first[k]) * CHUNK_ROWS, r1 = r0 + CHUNK_ROWS;
    if (r1 > m->rows) r1 = m->rows;
#if DS4K_ISA >= 1
    const uint8_t *wq = (const uint8_t *)m->w + r0 * rb;
#if DS4K_ISA >= 2 && DS4K_HAVE_BF16
    if (j->xb && m->type != DS4K_Q4_1 && j->n >= WIDE_MIN_ROWS) { /* gemm checked the shape */
        dequant_rows_t32(m->type, wq, rb, (int)(r1 - r0), j->cols, tiles);
        wt_to_bf16_pairs(tiles, j->cols);
        wide_chunk(tiles, (const float *)j->xb, j->n, j->cols / 2, j->y + j->row0[k] + r0, j->rows, (int)(r1 - r0), 1);
        return;
    }
#endif
#if DS4K_ISA >= 2
    if (m->type == DS4K_Q4_1 && CHUNK_ROWS * j->cols <= GROUP_FLOATS) {
        q4_1_bytes prep[GROUP_FLOATS / CHUNK_ROWS / 32] __attribute__((aligned(64))); /* 80 KB at 2048 columns */
        for (int64_t off = 0; off < (r1 - r0) * rb; off += 64) _mm_prefetch((const char *)wq + off, _MM_HINT_T0);
        /* Towards L2, the blocks of the chunk this thread is likely to claim next (nth on):
         * in a forward the weights come from DRAM, and a short product's chunk is done
         * before the misses of its first loads would resolve (a hint: no result depends on it). */
        const int64_t n0 = r0 + j->nth * CHUNK_ROWS, n1 = n0 + CHUNK_ROWS < m->rows ? n0 + CHUNK_ROWS : m->rows;
        for (int64_t off = (n0 - r0) * rb; off < (n1 - r0) * rb; off += 64) _mm_prefetch((const char *)wq + off, _MM_HINT_T1);
        q4_1_fused_chunk(wq, rb, (int)(r1 - r0), j->x, j->xb, j->n, j->cols, j->y + j->row0[k] + r0, j->rows, tiles,
                         prep);
        return;
    }
#endif
    if (j->n >= WIDE_MIN_ROWS && CHUNK_ROWS * j->cols <= GROUP_FLOATS) {
        /* wt's column-major layout (padding rows 0) */
        dequant_rows_t32(m->type, wq, rb, (int)(r1 - r0), j->cols, tiles);
        wide_chunk(tiles, j->x, j->n, j->cols, j->y + j->row0[k] + r0, j->rows, (int)(r1 - r0), 0);
        return;
    }
#endif
    for (int64_t g0 = r0; g0 < r1; g0 += group) {
        const int64_t g1 = g0 + group < r1 ? g0 + group : r1;
        const int64_t padded = (g1 - g0 + TILE_ROWS - 1) / TILE_ROWS * TILE_ROWS;
        for (int64_t r = g0; r < g0 + padded; r++) {
            float *row = tiles + (r - g0) * j->cols;
            if (r < g1)
                dequant_row(m->type, (const uint8_t *)m->w + r * rb, j->cols, row);
            else /* a short last tile: zero rows, never stored */
                memset(row, 0, (size_t)j->cols * sizeof(float));
        }
        for (int64_t t = 0; t < j->n; t += X_BLOCK) {
            const int64_t nt = j->n - t < X_BLOCK ? j->n - t : X_BLOCK;
#if DS4K_ISA >= 2
            /* Results land in a small buffer first: straight into Y, rows a few KB apart
             * would share L1 sets. */
            float ybuf[X_BLOCK * CHUNK_ROWS];
            const int ntile = (int)(padded / TILE_ROWS);
            tiles_times_x16(tiles, ntile, j->x + t * j->cols, nt, j->cols, ybuf);
            for (int64_t a = 0; a < nt; a++)
                memcpy(j->y + (t + a) * j->rows + j->row0[k] + g0, ybuf + a * padded, sizeof(float) * (size_t)(g1 - g0));
#else
            for (int64_t r = g0; r < g1; r += TILE_ROWS) {
                const int nr = g1 - r < TILE_ROWS ? (int)(g1 - r) : TILE_ROWS;
                tile_times_x(tiles + (r - g0) * j->cols, j->cols, j->x + t * j->cols, nt, j->y + t * j->rows,
                             j->rows, j->row0[k] + r, nr);
            }
#endif
        }
    }
}

/* Y[n, rows] = X[n, cols] W^T, W the parts stacked by rows; 0 on success, -1 for an
 * unsupported type or shape. */
static int gemm(const ds4k_mat *parts, int nparts, const float *x, float *y, int64_t cols, int64_t n, int bf16,
                int nth) {
    (void)bf16; /* read by the AVX-512 build only */
    if (nparts < 1 || nparts > DS4K_MAX_PARTS || n <= 0 || cols <= 0 || cols % 8 || cols > GEMM_MAX_COLS) return -1;
    /* One row (the head of a prefill): the GEMV reads each block once, without building a
     * tile (docs/perf-archive.md, "Quant types and run-time ISA variants"). */
    if (n == 1) return gemv(parts, nparts, x, y, cols, nth);
    gemm_job job = {.parts = parts, .x = x, .y = y, .cols = cols, .n = n, .nth = nth > 1 ? nth : 1};
    for (int k = 0; k < nparts; k++) {
        if (ds4k_row_bytes(parts[k].type, cols) == 0 || parts[k].rows <= 0 || parts[k].w == NULL) return -1;
        job.row0[k] = job.rows;
        job.rows += parts[k].rows;
        job.first[k + 1] = job.first[k] + (parts[k].rows + CHUNK_ROWS - 1) / CHUNK_ROWS;
    }
    uint16_t *xb = NULL;
#if DS4K_ISA >= 2 && DS4K_HAVE_BF16
    /* bf16 for long products, and for Q4_1 ones of any length: its fused tile dequantizes in
     * registers, so even a few rows gain (other types' short products pay a dequantization
     * pass that bf16 does not shorten: no gain measured at 18 rows). */
    int q4_1 = 0;
    for (int k = 0; k < nparts; k++) q4_1 |= parts[k].type == DS4K_Q4_1;
    if (bf16 && (n >= WIDE_MIN_ROWS || q4_1) && cols % 2 == 0 && CHUNK_ROWS * cols <= GROUP_FLOATS) {
        xb = (uint16_t *)aligned_alloc(64, ((size_t)(n * cols) * 2 + 63) / 64 * 64);
        if (xb) { /* no memory: the fp32 tiles, same shape rules */
            x_bf16_job xj = {x, xb, n, cols};
            ds4k_run_chunks(x_bf16_chunk, &xj, (n + X_BF16_ROWS - 1) / X_BF16_ROWS, nth);
        }
    }
#endif
    job.xb = xb;
    ds4k_run_chunks(gemm_chunk, &job, job.first[nparts], nth);
    free(xb);
    return 0;
}
