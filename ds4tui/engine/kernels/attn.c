/* attn.c: causal grouped-query attention of S query positions over a session's KV rows, the
 * one attention of the C kernels: the llama forward's prefill chunks (chunk.c, attn.py) and
 * the fused decode step (llama_step.c) call attn(), which picks the kernel by shape: one
 * query whose keys are all in the buffer takes the decode kernel (attn_decode, below), every
 * other call the chunk kernel described here.
 *
 * Owns: attn, softmax(q k^T * scale) v for every query head of S consecutive positions
 * qpos0..qpos0+S-1, reading the K/V rows where they live: rows of positions below `kbase`
 * from the session's buffer (slot p % cap, so a sliding layer's ring is read in place),
 * the rest from the chunk's own new rows; f32 or f16 rows, converted as they are read.
 * Query s sees keys qpos0+s-window+1..qpos0+s (window 0: every key from 0). Leaves to
 * callers (attn.py, the llama forward): writing the new rows, checks, serializing calls.
 * Compiled once per ISA by isa.c.
 *
 * Layout: the G query heads sharing a KV head become G*S rows m = s*G + g of that head, so
 * each K/V row is read (and converted) once per block of up to ATTN_QB rows. Keys go in
 * blocks of ATTN_NK, converted once for the whole block of rows: K transposed (Kt[d][key],
 * keys along the vector lanes), V as rows (dims along the lanes). Rows go in register tiles
 * of up to AR rows, any count, so no lane is spent on padding rows (a short chunk's 69 rows
 * per head are 9 tiles of 6 and 3 of 5): scores S[r][key] = sum_d Q[r][d] Kt[d][key] (a Q
 * element broadcast against a vector of keys), the online softmax per row in base 2 (flash
 * attention's rescaling between blocks, but lazy: a row's max moves only when a score passes
 * it by ATTN_SLACK, a weight over 2^ATTN_SLACK; one vector compare per row and key block), then
 * O[r][d] = alpha[r] O[r][d] + sum_key P[r][key] V[key][d] (a P element broadcast against a
 * vector of dims). A tile reads only the keys its rows see: blocks none of them sees are
 * skipped, and key vectors past its last row's position are not computed. The next key
 * block's rows are prefetched while one is computed: at depth they come from memory.
 *
 * Work is split into pool chunks of (KV head, query block, key span); when there are few
 * query blocks (a short chunk after a restore: 69 rows per head over 4K keys), each block's
 * keys are split into spans whose (max, sum, output) are merged afterwards in span order.
 * Chunk and span bounds depend only on the shape, so results never depend on the thread
 * count, and a replayed chunk computes exactly what the live one did.
 *
 * bf16 at depth: where the CPU has AVX512_BF16 and bf16 products are on (the caller's DS4K_CFG_BF16,
 * DS4TUI_BF16), a call whose query blocks see ATTN_BF16_MIN_KEYS keys or more (a prefill
 * chunk of 512 tokens, any chunk after a conversation of that length) computes both
 * products on bf16 pairs with vdpbf16ps, summed in fp32, at twice the fp32 FMA rate: q
 * (scaled) and K rounded to bf16 for the scores, the softmax weights P and V rounded to
 * bf16 for the output. The softmax itself (max, exponentials, sums, rescaling) stays fp32.
 * Shorter calls stay fp32: attention is a small share of their time there, and short
 * conversations keep exactly the results they had. The choice depends on the shape and the
 * switch only (docs/perf-archive.md, "bf16 attention at depth").
 */

#define ATTN_QB 192        /* query rows per block: a short chunk's G*S rows fit one; each converted key block serves this many */
#define ATTN_NK 64         /* keys per block: Kt and V stay in L1 at D = 64 */
#define ATTN_SPAN_MIN 256  /* a key span is never split below this */
#define ATTN_MIN_CHUNKS 12 /* split keys until there are this many chunks (or spans run out): even for 2, 3, 4 threads */
#define ATTN_MAX_D 256
#define ATTN_PF_TILES 4    /* fewer row tiles per key block: the next block's rows prefetched during its conversion */
#define ATTN_SLACK 8.0f    /* a row's running max (base 2) moves when a score passes it by this much */

#define ATTN_LOG2E 1.44269504088896341

/* The native vector av (AW lanes) and the register tiles' shape (AR rows of AKV key or ADV
 * dim vectors) are each ISA's (simd_*.h). */
#define ATTN_KC (AKV * AW) /* keys per score tile */
#define ATTN_DC (ADV * AW) /* dims per output tile */
_Static_assert(ATTN_NK % ATTN_KC == 0 && ATTN_NK % 8 == 0, "key blocks must be whole score tiles");

/* The bf16 path exists in the AVX-512 build only (BF16_TARGET, bf16_pairs16: qgemm.c). The
 * functions that may run it carry the target; they run no bf16 instruction on the fp32 path. */
#if DS4K_ISA >= 2 && DS4K_HAVE_BF16
#define ATTN_BF16 1
#define ATTN_TARGET BF16_TARGET
#else
#define ATTN_BF16 0
#define ATTN_TARGET
#endif
#define ATTN_BF16_MIN_KEYS 512 /* a call's widest query block sees this many keys: bf16 products */
/* With bf16, a tile's weights are rounded where the fused softmax computes them: */
_Static_assert(!ATTN_BF16 || ATTN_KC == ATTN_NK, "bf16 tiles need one score tile per key block (attn_tile)");

/* ---------------------------------------------------------------- the job */

typedef struct {
    const float *q;           /* row s, head j at q + s * ldq + j * d */
    float *o;                 /* same layout, ldo */
    const void *k, *v;        /* the buffer: head h, slot r at (h * hs + r * d) elements */
    const void *kn, *vn;      /* new rows: head h, row i at (h * hsn + i * rsn) elements (vn: hsv, rsv) */
    int64_t ldq, ldo, hs, cap, hsn, rsn, hsv, rsv, s, qpos0, kbase, window;
    int g, d, dp, f16, nqb, qb, nsplit;
    int bf16;                 /* q.k and p.v on bf16 pairs (kt, vf, the Q rows hold pairs) */
    float scale;
    float *part;              /* nsplit > 1: per chunk, max[qb], sum[qb], O[qb][dp] */
    int64_t part_stride;
} attn_job;

/* Keys [first, end) a query block sees at all (rows r0..r1-1). */
static void attn_keys(const attn_job *j, int64_t r0, int64_t r1, int64_t *first, int64_t *end) {
    const int64_t qlo = j->qpos0 + r0 / j->g, qhi = j->qpos0 + (r1 - 1) / j->g;
    *first = j->window > 0 && qlo - j->window + 1 > 0 ? qlo - j->window + 1 : 0;
    *end = qhi + 1;
}

/* Where the K and V rows of keys p0..p0+n-1 of head h live: one division for the block (a
 * buffer row is slot p % cap), not one per row and use. */
static void attn_rows(const attn_job *j, int64_t h, int64_t p0, int n, const void **kr, const void **vr) {
    const int64_t es = j->f16 ? 2 : 4;
    int64_t slot = p0 < j->kbase ? p0 % j->cap : 0;
    if (p0 + n <= j->kbase && slot + n <= j->cap) { /* consecutive buffer rows: the usual block */
        const int64_t off = (h * j->hs + slot * j->d) * es, step = j->d * es;
        for (int t = 0; t < n; t++) kr[t] = (const char *)j->k + off + t * step, vr[t] = (const char *)j->v + off + t * step;
        return;
    }
    for (int t = 0; t < n; t++) {
        const int64_t p = p0 + t;
        if (p < j->kbase) {
            const int64_t off = (h * j->hs + slot * j->d) * es;
            kr[t] = (const char *)j->k + off, vr[t] = (const char *)j->v + off;
            if (++slot == j->cap) slot = 0;
        } else {
            kr[t] = (const char *)j->kn + (h * j->hsn + (p - j->kbase) * j->rsn) * es;
            vr[t] = (const char *)j->vn + (h * j->hsv + (p - j->kbase) * j->rsv) * es;
        }
    }
}

/* One value row as floats. */
static inline void attn_vrow(const attn_job *j, const void *src, float *dst) {
    const int d = j->d;
    if (!j->f16) {
        memcpy(dst, src, sizeof(float) * (size_t)d);
        return;
    }
    const uint16_t *h = (const uint16_t *)src;
    for (int64_t i = f16_to_f32_vec(dst, h, d); i < d; i++) dst[i] = ds4k_f16_to_f32(h[i]);
}

#if DS4K_ISA >= 1
static inline __m256 attn_ld8(const void *src, int f16, int i) {
    return f16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)src + i)))
               : _mm256_loadu_ps((const float *)src + i);
}

/* r[0..7] (8 rows of 8) := their transpose */
static inline void attn_tr8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}
#endif

#if DS4K_ISA >= 2
/* r[0..15] (16 rows of 16) := their transpose */
static inline void attn_tr16(__m512 r[16]) {
    __m512 t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    /* u[4G + c], 128-bit lane L: column 4L + c of rows 4G..4G+3 */
    for (int i = 0; i < 16; i += 4) {
        const __m512d a = _mm512_castps_pd(t[i]), b = _mm512_castps_pd(t[i + 1]);
        const __m512d c = _mm512_castps_pd(t[i + 2]), e = _mm512_castps_pd(t[i + 3]);
        u[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        u[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        u[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, e));
        u[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, e));
    }
    for (int c = 0; c < 4; c++) {
        const __m512 v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88), v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xDD);
        const __m512 w0 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88), w1 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xDD);
        r[c] = _mm512_shuffle_f32x4(v0, w0, 0x88);
        r[8 + c] = _mm512_shuffle_f32x4(v0, w0, 0xDD);
        r[4 + c] = _mm512_shuffle_f32x4(v1, w1, 0x88);
        r[12 + c] = _mm512_shuffle_f32x4(v1, w1, 0xDD);
    }
}
#endif

/* Columns [ta, tb) (ta a multiple of 16) of the nk key rows kr as Kt[i][t] (row stride
 * ATTN_NK); columns nk up to the next score tile are zeros (computed, then masked). */
static void attn_load_kt(const attn_job *j, const void *const *kr, int nk, float *kt, int ta, int tb) {
    const int d = j->d, nkp0 = (nk + ATTN_KC - 1) / ATTN_KC * ATTN_KC, nkp = nkp0 < tb ? nkp0 : tb;
#if DS4K_ISA >= 1
    int t0 = ta;
#if DS4K_ISA >= 2
    if (d % 16 == 0)
        for (; t0 + 16 <= nk && t0 + 16 <= tb; t0 += 16) { /* whole groups of 16 keys, 16 dims at a time */
            const void *src[16];
            for (int t = 0; t < 16; t++) src[t] = kr[t0 + t];
            for (int i = 0; i < d; i += 16) {
                __m512 r[16];
                if (j->f16)
                    for (int t = 0; t < 16; t++)
                        r[t] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)src[t] + i)));
                else
                    for (int t = 0; t < 16; t++) r[t] = _mm512_loadu_ps((const float *)src[t] + i);
                attn_tr16(r);
                for (int l = 0; l < 16; l++) _mm512_storeu_ps(kt + (int64_t)(i + l) * ATTN_NK + t0, r[l]);
            }
        }
#endif
    for (; t0 < nkp; t0 += 8) {
        const void *src[8];
        for (int t = 0; t < 8; t++)
            src[t] = t0 + t < nk ? kr[t0 + t] : NULL;
        for (int i = 0; i < d; i += 8) {
            __m256 r[8];
            for (int t = 0; t < 8; t++) r[t] = src[t] ? attn_ld8(src[t], j->f16, i) : _mm256_setzero_ps();
            attn_tr8(r);
            for (int l = 0; l < 8; l++) _mm256_storeu_ps(kt + (int64_t)(i + l) * ATTN_NK + t0, r[l]);
        }
    }
#else
    for (int t = ta; t < nkp; t++) {
        if (t >= nk) {
            for (int i = 0; i < d; i++) kt[(int64_t)i * ATTN_NK + t] = 0.0f;
            continue;
        }
        const void *src = kr[t];
        for (int i = 0; i < d; i++)
            kt[(int64_t)i * ATTN_NK + t] = j->f16 ? ds4k_f16_to_f32(((const uint16_t *)src)[i]) : ((const float *)src)[i];
    }
#endif
}

#if ATTN_BF16
/* 16 elements of a K/V row from column i, as floats */
static inline __m512 attn_ld16(const void *src, int f16, int i) {
    return f16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)src + i)))
               : _mm512_loadu_ps((const float *)src + i);
}

/* Keys [ta, tb) (multiples of 16) of the nk rows kr as bf16 column pairs, transposed:
 * kb[i][t] = (K[t][2i], K[t][2i + 1]) rounded to bf16 (rows ATTN_NK dwords apart), the
 * layout of Kt with pairs for columns; keys nk.. are zeros (computed, then masked). */
static ATTN_TARGET void attn_load_kt_bf16(const attn_job *j, const void *const *kr, int nk, uint32_t *kb, int ta,
                                          int tb) {
    for (int t0 = ta; t0 < tb; t0 += 16)
        for (int i = 0; i < j->d; i += 32) {
            __m512 r[16]; /* r[t]: key t0 + t's 16 pairs of columns i.. (cvtne2ps: its second operand low) */
            for (int t = 0; t < 16; t++)
                r[t] = t0 + t < nk ? (__m512)_mm512_cvtne2ps_pbh(attn_ld16(kr[t0 + t], j->f16, i + 16),
                                                                 attn_ld16(kr[t0 + t], j->f16, i))
                                   : _mm512_setzero_ps();
            attn_tr16(r);
            for (int l = 0; l < 16; l++) _mm512_storeu_ps((float *)(kb + (int64_t)(i / 2 + l) * ATTN_NK + t0), r[l]);
        }
}

/* Value rows 2p and 2p + 1 of the block, for pairs p in [pa, pb), as bf16 pairs per column:
 * vb[p][c] = (V[2p][c], V[2p + 1][c]) (rows dp dwords apart); a row at nk or past it is
 * zeros (its weight is 0, and 0 times a row never written could be NaN). */
static ATTN_TARGET void attn_vpairs_bf16(const attn_job *j, const void *const *vr, int nk, uint32_t *vb, int pa,
                                         int pb) {
    for (int p = pa; p < pb; p++) {
        const void *a = vr[2 * p], *b = 2 * p + 1 < nk ? vr[2 * p + 1] : NULL;
        for (int c = 0; c < j->d; c += 16)
            _mm512_storeu_si512(vb + (int64_t)p * j->dp + c,
                                bf16_pairs16(attn_ld16(a, j->f16, c), b ? attn_ld16(b, j->f16, c) : _mm512_setzero_ps()));
    }
}

/* The Q rows (scaled, d floats apart) rounded to bf16 pairs in place: row r's pairs fill
 * the first d / 2 dwords of its own d floats (each store lands on floats already read). */
static ATTN_TARGET void attn_q_to_bf16(float *qs, int m, int d) {
    for (int r = 0; r < m; r++) {
        float *q = qs + (int64_t)r * d;
        for (int i = 0; i < d; i += 32) {
            const __m512 lo = _mm512_loadu_ps(q + i), hi = _mm512_loadu_ps(q + i + 16);
            _mm512_storeu_si512((uint32_t *)q + i / 2, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
    }
}

/* attn_qk_acc on bf16 pairs: qb rows of d / 2 pairs (d dwords apart), kb as attn_load_kt_bf16
 * leaves it; one vdpbf16ps adds two columns' products of 16 keys. */
static inline ATTN_TARGET __attribute__((always_inline)) void attn_qk_acc_bf16(const uint32_t *qb, const uint32_t *kb,
                                                                               int d, av acc[AR][AKV], const int nr) {
    for (int r = 0; r < nr; r++)
        for (int v = 0; v < AKV; v++) acc[r][v] = av_set1(0.0f);
    for (int i = 0; i < d / 2; i++) {
        __m512bh kv[AKV];
        for (int v = 0; v < AKV; v++) kv[v] = (__m512bh)_mm512_loadu_si512(kb + (int64_t)i * ATTN_NK + v * AW);
        for (int r = 0; r < nr; r++) {
            const __m512bh qv = (__m512bh)_mm512_set1_epi32((int)qb[r * d + i]);
            for (int v = 0; v < AKV; v++) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], qv, kv[v]);
        }
    }
}
#endif

/* The key block's K columns [ta, tb) as the score tiles read them: transposed floats, or
 * transposed bf16 pairs. */
static inline ATTN_TARGET void attn_block_k(const attn_job *j, const void *const *kr, int nk, float *kt, int ta,
                                            int tb) {
#if ATTN_BF16
    if (j->bf16) {
        attn_load_kt_bf16(j, kr, nk, (uint32_t *)kt, ta, tb);
        return;
    }
#endif
    attn_load_kt(j, kr, nk, kt, ta, tb);
}

/* The block's value rows 2p and 2p + 1, for pairs p in [pa, pb), as the output tiles read
 * them: rows of floats, or bf16 pairs of rows. */
static inline ATTN_TARGET void attn_block_v(const attn_job *j, const void *const *vr, int nk, float *vf, int pa,
                                            int pb) {
#if ATTN_BF16
    if (j->bf16) {
        attn_vpairs_bf16(j, vr, nk, (uint32_t *)vf, pa, pb);
        return;
    }
#endif
    for (int t = 2 * pa; t < 2 * pb && t < nk; t++) attn_vrow(j, vr[t], vf + (int64_t)t * j->dp);
}

/* Ask for K/V rows [t0, t1) of kr, vr (clipped to n) ahead of their use: rows of a deep
 * context come from memory. Inlined: GCC drops calls of a function that only prefetches. */
static inline __attribute__((always_inline)) void attn_prefetch(const attn_job *j, const void *const *kr,
                                                               const void *const *vr, int64_t t0, int64_t t1, int n) {
    const int bytes = j->d * (j->f16 ? 2 : 4);
    for (int64_t t = t0; t < n && t < t1; t++)
        for (int b = 0; b < bytes; b += 64) {
            __builtin_prefetch((const char *)kr[t] + b);
            __builtin_prefetch((const char *)vr[t] + b);
        }
}

/* acc[r][v] = sum_i Q[r][i] Kt[i][v * AW..] for nr rows (Q rows d apart): one score tile. */
static inline __attribute__((always_inline)) void attn_qk_acc(const float *qs, const float *kt, int d,
                                                             av acc[AR][AKV], const int nr) {
    for (int r = 0; r < nr; r++)
        for (int v = 0; v < AKV; v++) acc[r][v] = av_set1(0.0f);
    for (int i = 0; i < d; i++) {
        av kv[AKV];
        for (int v = 0; v < AKV; v++) kv[v] = av_load(kt + (int64_t)i * ATTN_NK + v * AW);
        for (int r = 0; r < nr; r++) {
            const av qb = av_set1(qs[r * d + i]);
            for (int v = 0; v < AKV; v++) acc[r][v] = av_fma(qb, kv[v], acc[r][v]);
        }
    }
}

/* attn_qk_acc, or with bf16 its pair form (qs and kt holding pairs). */
static inline ATTN_TARGET __attribute__((always_inline)) void attn_scores(const float *qs, const float *kt, int d,
                                                                          av acc[AR][AKV], const int nr,
                                                                          const int bf16) {
#if ATTN_BF16
    if (bf16) {
        attn_qk_acc_bf16((const uint32_t *)qs, (const uint32_t *)kt, d, acc, nr);
        return;
    }
#endif
    (void)bf16;
    attn_qk_acc(qs, kt, d, acc, nr);
}

/* S[r][c..c+ATTN_KC) = sum_i Q[r][i] Kt[i][c..] for nr rows (kt, st already at c). */
static inline __attribute__((always_inline)) void attn_qk_tile(const float *qs, const float *kt, float *st, int d,
                                                              const int nr) {
    av acc[AR][AKV];
    attn_qk_acc(qs, kt, d, acc, nr);
    for (int r = 0; r < nr; r++)
        for (int v = 0; v < AKV; v++) av_store(st + r * ATTN_NK + v * AW, acc[r][v]);
}

/* O[r][c..c+ATTN_DC) = alpha[r] O[r][c..] + sum_{t in [t0, t1)} P[r][t] V[t][c..] for nr rows
 * (O and V rows dp apart, P rows ATTN_NK apart). With bf16, P comes from pb and V as pairs
 * of rows (attn_vpairs_bf16), from the pair holding t0: a weight outside [t0, t1) is 0. */
static inline ATTN_TARGET __attribute__((always_inline)) void attn_pv_tile(const float *p, const uint16_t *pb,
                                                                           const float *vf, float *o,
                                                                           const float *alpha, int t0, int t1, int dp,
                                                                           const int nr, const int bf16) {
    (void)pb, (void)bf16;
    av acc[AR][ADV];
    for (int r = 0; r < nr; r++) {
        const av a = av_set1(alpha[r]);
        for (int v = 0; v < ADV; v++) acc[r][v] = av_mul(a, av_load(o + (int64_t)r * dp + v * AW));
    }
#if ATTN_BF16
    if (bf16) {
        const uint32_t *vb = (const uint32_t *)vf;
        for (int t = t0 & ~1; t < t1; t += 2) {
            __m512bh vv[ADV];
            for (int v = 0; v < ADV; v++) vv[v] = (__m512bh)_mm512_loadu_si512(vb + (int64_t)(t / 2) * dp + v * AW);
            for (int r = 0; r < nr; r++) {
                uint32_t w;
                memcpy(&w, pb + r * ATTN_NK + t, sizeof(w)); /* weights t and t + 1 */
                const __m512bh pw = (__m512bh)_mm512_set1_epi32((int)w);
                for (int v = 0; v < ADV; v++) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], pw, vv[v]);
            }
        }
    } else
#endif
    for (int t = t0; t < t1; t++) {
        av vv[ADV];
        for (int v = 0; v < ADV; v++) vv[v] = av_load(vf + (int64_t)t * dp + v * AW);
        for (int r = 0; r < nr; r++) {
            const av pb = av_set1(p[r * ATTN_NK + t]);
            for (int v = 0; v < ADV; v++) acc[r][v] = av_fma(pb, vv[v], acc[r][v]);
        }
    }
    for (int r = 0; r < nr; r++)
        for (int v = 0; v < ADV; v++) av_store(o + (int64_t)r * dp + v * AW, acc[r][v]);
}

/* A row's running max m after a block whose lanes' maxima are bm; returns the factor that
 * rescales what was summed before. Lazily: m moves only when a score exceeds it by more than
 * ATTN_SLACK (weights up to 2^ATTN_SLACK are fine in float; the sum and output scale
 * together), so after a row's first block m rarely moves. That test is one vector compare,
 * not a horizontal max, and its branch is predictable: a max updated whenever it rose
 * mispredicted several times per row and span. 1 when m stays; 0 for the first block the
 * row sees (m = -inf), whose earlier output and sum are 0. */
static inline float attn_new_max(float *mx, av bm) {
    const float old = *mx;
    if (!av_any_gt(bm, av_set1(old + ATTN_SLACK))) return 1.0f;
    const float top = av_hmax(bm);
    *mx = top;
    return av_first(av_exp2(av_set1(old - top))); /* no libm call amid vector code */
}

/* The tile's scores when they fit one score tile (keys c..c+ATTN_KC: a whole key block on
 * AVX-512), with the softmax of each row done in the registers that hold them: P into
 * st[r][c..] (with bf16: rounded, into pb[r][c..]), the row's max, vector sum and rescale
 * factor updated. */
static inline ATTN_TARGET __attribute__((always_inline)) void attn_qk_softmax_tile(
    const float *qs, const float *kt, float *st, uint16_t *pb, int d, int c, const int *lo, const int *hi, float *mx,
    float *sum, float *alpha, const int nr, const int bf16) {
    (void)pb; /* the bf16 path's only (AVX-512 builds) */
    av acc[AR][AKV];
    attn_scores(qs, kt + c, d, acc, nr, bf16);
    for (int r = 0; r < nr; r++) {
        float *s = st + r * ATTN_NK + c;
        if (lo[r] >= hi[r]) { /* no key of this block for this row: weights 0, output kept */
#if ATTN_BF16
            if (bf16)
                memset(pb + r * ATTN_NK + c, 0, sizeof(uint16_t) * ATTN_KC);
            else
#endif
                for (int v = 0; v < AKV; v++) av_store(s + v * AW, av_set1(0.0f));
            alpha[r] = 1.0f;
            continue;
        }
        av bm = av_set1(-INFINITY);
        for (int v = 0; v < AKV; v++) {
            const int t = c + v * AW;
            if (t < lo[r] || t + AW > hi[r]) acc[r][v] = av_keep(acc[r][v], t, lo[r], hi[r]);
            bm = av_max(bm, acc[r][v]);
        }
        alpha[r] = attn_new_max(&mx[r], bm);
        const av base = av_set1(mx[r]);
        av e[AKV];
        for (int v = 0; v < AKV; v++) {
            e[v] = av_exp2(av_sub(acc[r][v], base));
#if ATTN_BF16
            if (bf16)
                _mm256_storeu_si256((__m256i *)(pb + r * ATTN_NK + c + v * AW), (__m256i)_mm512_cvtneps_pbh(e[v]));
            else
#endif
                av_store(s + v * AW, e[v]);
        }
        av tot = e[0];
        for (int v = 1; v < AKV; v++) tot = av_add(tot, e[v]);
        av_store(sum + r * AW, av_fma(av_load(sum + r * AW), av_set1(alpha[r]), tot));
    }
}

/* Visible keys [lo, hi) of a query at position q within the block p0..p0+nk-1, relative to p0. */
static inline void attn_span(const attn_job *j, int64_t q, int64_t p0, int nk, int *lo, int *hi) {
    const int64_t a = j->window > 0 ? q - j->window + 1 - p0 : 0, b = q - p0 + 1;
    *lo = a > 0 ? (int)a : 0;
    *hi = b < nk ? (b > 0 ? (int)b : 0) : nk;
}

/* One tile of nr rows (positions qp; Q, O rows at qs, os) against the key block at p0: scores,
 * the online softmax (mx and a vector of partial sums per row, in base 2), the output update. */
static inline ATTN_TARGET __attribute__((always_inline)) void attn_tile(
    const attn_job *j, const int64_t *qp, int64_t p0, int nk, const float *kt, const float *vf, const float *qs,
    float *os, float *mx, float *sum, float *st, uint16_t *pb, const int nr, const int bf16) {
    const int d = j->d, dp = j->dp;
    int lo[AR], hi[AR];
    for (int r = 0; r < nr; r++) attn_span(j, qp[r], p0, nk, &lo[r], &hi[r]);
    /* Rows are in position order, so the tile's keys are [lo of its first, hi of its last). */
    const int t0 = lo[0], t1 = hi[nr - 1];
    const int c0 = t0 / ATTN_KC * ATTN_KC, c1 = (t1 + ATTN_KC - 1) / ATTN_KC * ATTN_KC;
    float alpha[AR];
    if (c1 - c0 == ATTN_KC) {
        attn_qk_softmax_tile(qs, kt, st, pb, d, c0, lo, hi, mx, sum, alpha, nr, bf16);
        for (int c = 0; c < dp; c += ATTN_DC) attn_pv_tile(st, pb, vf + c, os + c, alpha, t0, t1, dp, nr, bf16);
        return;
    }
    /* Several score tiles per key block: the AVX2 and scalar builds, never bf16 (asserted above). */
    for (int c = c0; c < c1; c += ATTN_KC) attn_qk_tile(qs, kt + c, st + c, d, nr);
    const int v0 = t0 / AW * AW, v1 = (t1 + AW - 1) / AW * AW;
    for (int r = 0; r < nr; r++) {
        float *s = st + r * ATTN_NK;
        if (lo[r] >= hi[r]) { /* no key of this block for this row: weights 0, output kept */
            for (int t = v0; t < v1; t += AW) av_store(s + t, av_set1(0.0f));
            alpha[r] = 1.0f;
            continue;
        }
        av bm = av_set1(-INFINITY);
        for (int t = v0; t < v1; t += AW) {
            av x = av_load(s + t);
            if (t < lo[r] || t + AW > hi[r]) {
                x = av_keep(x, t, lo[r], hi[r]);
                av_store(s + t, x);
            }
            bm = av_max(bm, x);
        }
        alpha[r] = attn_new_max(&mx[r], bm);
        const av base = av_set1(mx[r]);
        av acc = av_set1(0.0f);
        for (int t = v0; t < v1; t += AW) {
            const av e = av_exp2(av_sub(av_load(s + t), base));
            av_store(s + t, e);
            acc = av_add(acc, e);
        }
        /* The row's sum stays a vector (one horizontal add at the end). */
        av_store(sum + r * AW, av_fma(av_load(sum + r * AW), av_set1(alpha[r]), acc));
    }
    for (int c = 0; c < dp; c += ATTN_DC) attn_pv_tile(st, pb, vf + c, os + c, alpha, t0, t1, dp, nr, 0);
}

/* attn_tile for a tile of nr rows (1..AR), each height its own instance (the row loops unrolled). */
static inline ATTN_TARGET __attribute__((always_inline)) void attn_tile_rows(
    const attn_job *j, const int64_t *qp, int64_t p0, int nk, const float *kt, const float *vf, const float *qs,
    float *os, float *mx, float *sum, float *st, uint16_t *pb, int nr, const int bf16) {
    switch (nr) {
#if AR >= 6
    case 6: attn_tile(j, qp, p0, nk, kt, vf, qs, os, mx, sum, st, pb, 6, bf16); break;
    case 5: attn_tile(j, qp, p0, nk, kt, vf, qs, os, mx, sum, st, pb, 5, bf16); break;
#endif
#if AR >= 4
    case 4: attn_tile(j, qp, p0, nk, kt, vf, qs, os, mx, sum, st, pb, 4, bf16); break;
#endif
    case 3: attn_tile(j, qp, p0, nk, kt, vf, qs, os, mx, sum, st, pb, 3, bf16); break;
    case 2: attn_tile(j, qp, p0, nk, kt, vf, qs, os, mx, sum, st, pb, 2, bf16); break;
    default: attn_tile(j, qp, p0, nk, kt, vf, qs, os, mx, sum, st, pb, 1, bf16); break;
    }
}

static ATTN_TARGET void attn_chunk(void *vctx, int64_t c) {
    const attn_job *j = (const attn_job *)vctx;
    const int g = j->g, d = j->d, dp = j->dp;
    const int64_t h = c / ((int64_t)j->nqb * j->nsplit), qb = c / j->nsplit % j->nqb, sp = c % j->nsplit;
    const int64_t m_all = j->s * g, r0 = qb * j->qb, r1 = r0 + j->qb < m_all ? r0 + j->qb : m_all;
    const int m = (int)(r1 - r0);
    int64_t first, end;
    attn_keys(j, r0, r1, &first, &end);
    /* This span's key blocks: blocks [b0, b1) of the block's range. */
    const int64_t nblk = (end - first + ATTN_NK - 1) / ATTN_NK;
    const int64_t b0 = sp * nblk / j->nsplit, b1 = (sp + 1) * nblk / j->nsplit;

    /* ~530 KB at D = 256, ~140 KB at D = 64 (the stack: no allocation per chunk). */
    float qs[m * d], os[m * dp], kt[d * ATTN_NK], vf[ATTN_NK * dp], st[AR * ATTN_NK];
    uint16_t pb[AR * ATTN_NK]; /* bf16: a tile's weights */
    float mx[m], sum[m * AW];
    int64_t qp[m];
    const void *kr[ATTN_NK], *vr[ATTN_NK], *kr2[ATTN_NK], *vr2[ATTN_NK];
    const float scale = (float)(j->scale * ATTN_LOG2E);
    for (int r = 0; r < m; r++) {
        const int64_t row = r0 + r;
        const float *q = j->q + row / g * j->ldq + (h * g + row % g) * d;
        for (int i = 0; i < d; i++) qs[r * d + i] = q[i] * scale;
        qp[r] = j->qpos0 + row / g;
        mx[r] = -INFINITY;
    }
    memset(sum, 0, sizeof(sum));
    memset(os, 0, sizeof(float) * (size_t)(m * dp));
    /* Value dims d..dp (whole output tiles) stay zero: rows of floats, or of pairs with bf16. */
    if (dp > d)
        for (int t = 0; t < (j->bf16 ? ATTN_NK / 2 : ATTN_NK); t++)
            memset(vf + (int64_t)t * dp + d, 0, sizeof(float) * (size_t)(dp - d));
#if ATTN_BF16
    if (j->bf16) attn_q_to_bf16(qs, m, d);
#endif
    for (int64_t b = b0; b < b1; b++) {
        const int64_t p0 = first + b * ATTN_NK;
        const int nk = (int)(end - p0 < ATTN_NK ? end - p0 : ATTN_NK);
        /* Rows that see a key of this block: from the first at position >= p0 to the last whose
         * window still reaches p0 + nk - 1 (rows are in position order). */
        int64_t ra = (p0 - j->qpos0) * g - r0, rb = m;
        if (j->window > 0) rb = (p0 + nk - 1 + j->window - j->qpos0) * g - r0;
        ra = ra > 0 ? ra : 0;
        rb = rb < m ? rb : m;
        if (ra >= rb) continue;
        /* This block's rows, and the next one's for the prefetches. */
        const int nn = (int)(end - p0 - ATTN_NK < ATTN_NK ? end - p0 - ATTN_NK : ATTN_NK);
        attn_rows(j, h, p0, nk, kr, vr);
        if (nn > 0) attn_rows(j, h, p0 + ATTN_NK, nn, kr2, vr2);
        /* Tiles of equal size (69 rows: 9 of 6 and 3 of 5, not 11 and a weak one of 3). The next
         * block's rows are prefetched a share per tile, or with few tiles (a lone query's 3
         * rows) spread over this block's conversion: all at once they queue (a lone query over
         * 4K keys took 7.2 ms for 30 layers instead of 5.5). */
        const int64_t ntile = (rb - ra + AR - 1) / AR, per = (ATTN_NK + ntile - 1) / ntile;
        const int spread = ntile < ATTN_PF_TILES, npairs = (nk + 1) / 2;
        if (!spread) {
            attn_block_k(j, kr, nk, kt, 0, ATTN_NK);
            attn_block_v(j, vr, nk, vf, 0, npairs);
        } else { /* next block's rows: 8 per 16 keys transposed, then 1 per pair of value rows */
            for (int t = 0; t < ATTN_NK; t += 16) {
                attn_block_k(j, kr, nk, kt, t, t + 16);
                attn_prefetch(j, kr2, vr2, t / 2, t / 2 + 8, nn);
            }
            for (int p = 0; p < npairs; p++) {
                attn_prefetch(j, kr2, vr2, ATTN_NK / 2 + p, ATTN_NK / 2 + p + 1, nn);
                attn_block_v(j, vr, nk, vf, p, p + 1);
            }
            attn_prefetch(j, kr2, vr2, ATTN_NK / 2 + npairs, ATTN_NK, nn);
        }
        for (int64_t k = 0; k < ntile; k++) {
            const int64_t r = ra + k * (rb - ra) / ntile;
            const int nr = (int)(ra + (k + 1) * (rb - ra) / ntile - r);
            if (!spread) attn_prefetch(j, kr2, vr2, k * per, (k + 1) * per, nn);
            const float *q = qs + r * d;
            float *o = os + r * dp;
#if ATTN_BF16
            if (j->bf16)
                attn_tile_rows(j, qp + r, p0, nk, kt, vf, q, o, mx + r, sum + r * AW, st, pb, nr, 1);
            else
#endif
                attn_tile_rows(j, qp + r, p0, nk, kt, vf, q, o, mx + r, sum + r * AW, st, pb, nr, 0);
        }
    }
    for (int r = 0; r < m; r++) sum[r] = av_hsum(av_load(sum + r * AW)); /* in place: r * AW >= r */
    if (j->nsplit == 1) {
        for (int r = 0; r < m; r++) {
            const int64_t row = r0 + r;
            float *o = j->o + row / g * j->ldo + (h * g + row % g) * d;
            const float inv = 1.0f / sum[r];
            for (int i = 0; i < d; i++) o[i] = os[r * dp + i] * inv;
        }
        return;
    }
    float *part = j->part + c * j->part_stride;
    memcpy(part, mx, sizeof(float) * (size_t)m);
    memcpy(part + j->qb, sum, sizeof(float) * (size_t)m);
    memcpy(part + 2 * j->qb, os, sizeof(float) * (size_t)(m * dp));
}

/* Merge the spans of every (head, query block), in span order. */
static void attn_merge(const attn_job *j, int hkv) {
    const int g = j->g, d = j->d, dp = j->dp, mq = j->qb;
    const int64_t m_all = j->s * g;
    for (int64_t h = 0; h < hkv; h++)
        for (int64_t qb = 0; qb < j->nqb; qb++) {
            const int64_t r0 = qb * j->qb, r1 = r0 + j->qb < m_all ? r0 + j->qb : m_all;
            const int m = (int)(r1 - r0);
            const float *parts = j->part + (h * j->nqb + qb) * j->nsplit * j->part_stride;
            for (int r = 0; r < m; r++) {
                const int64_t row = r0 + r;
                float *o = j->o + row / g * j->ldo + (h * g + row % g) * d;
                float top = -INFINITY, total = 0.0f;
                for (int sp = 0; sp < j->nsplit; sp++) {
                    float v = parts[sp * j->part_stride + r];
                    top = v > top ? v : top;
                }
                memset(o, 0, sizeof(float) * (size_t)d);
                for (int sp = 0; sp < j->nsplit; sp++) {
                    const float *p = parts + sp * j->part_stride;
                    if (p[r] == -INFINITY) continue; /* a span with no key visible to this query */
                    const float w = exp2f(p[r] - top); /* maxima in base 2 */
                    total += p[mq + r] * w;
                    for (int i = 0; i < d; i++) o[i] += w * p[2 * mq + r * dp + i];
                }
                const float inv = 1.0f / total;
                for (int i = 0; i < d; i++) o[i] *= inv;
            }
        }
}

/* ---------------------------------------------------------------- one query: the decode kernel
 *
 * A decode step's query (S = 1, every key in the buffer) is a different problem from a
 * chunk's: G query heads against up to a whole context of rows, memory-bound. attn() hands
 * it to attn_decode, which splits each KV head's positions into blocks of ATT_BLOCK
 * positions, doubled up to ATT_BLOCK_MAX while a layer keeps ATT_MIN_CHUNKS of them (one
 * pool chunk each), then merges the blocks' (max, sum, output) with the usual log-sum-exp
 * rescaling. Inside a block, K and V are read in tiles of ATT_TILE rows, converted to f32
 * once for all G query heads of the group (AVX-512 FMAs in the AVX-512 build, AVX2 in the
 * other); the AVX-512 build reads V instead once per row for all G heads, converting in
 * registers (weighted_sums). Block bounds depend only on n and the head count, so results do
 * not depend on the thread count. Against the chunk kernel on the same query
 * (bench/attn_decode_ab.c, AVX2, f16 rows, one thread's CPU time): Gemma 3's 4 heads of 256
 * 1.04x (4,096 rows) to 1.3x (512) faster, SmolLM2's 9/3 heads of 64 0.87x (4,096) to 0.94x
 * (512) as fast; the decode step keeps this kernel for every shape (its results and speed as
 * before; the AVX-512 build's V path is unmeasured against the chunk kernel): docs/perf-archive.md,
 * "One C attention". */

#define ATT_BLOCK 256      /* positions per block: the smallest (up to ATT_BLOCK_MAX: vec.h) */
#define ATT_MIN_CHUNKS 16
#define MAX_HEAD_DIM 256   /* (and MAX_GROUP heads per KV head: vec.h) */
#define ATT_INLINE_WORK 32768 /* query x key multiply-adds below which attention runs on the caller */


static float dot(const float *a, const float *b, int n) {
    float s;
    int i = dot_vec(a, b, n, &s);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* p[i] = exp(p[i] - m); returns the sum. */
static float exp_shift_sum(float *p, int n, float m) {
    float s;
    int i = exp_shift_sum_vec(p, n, m, &s);
    for (; i < n; i++) s += (p[i] = expf(p[i] - m));
    return s;
}

/* y += a * x */
static void axpy(float *y, float a, const float *x, int n) {
    for (int i = axpy_vec(y, a, x, n); i < n; i++) y[i] += a * x[i];
}


#define ATT_TILE 32 /* K rows converted to f32 at once (32 x 256 floats at most: L1-sized); 16 ran ~10% slower at D 64 */

typedef struct {
    const float *q;        /* [Hq, D], roped and scaled */
    const void *k, *v;     /* [Hkv] heads hs elements apart of rows D apart, float or f16 (uint16_t) */
    int64_t hs, n, nblk, block; /* hs: elements between heads; rows 0..n-1 are live, nblk blocks of `block` */
    int g, d, f16;
    float *part;           /* [Hkv, nblk, G, D + 2]: max, sum, unnormalized output */
} att_job;

/* reduce8, reduce16 and the AVX-512 build's weighted_sums: vec_x86.h, vec_avx512.h. */

/* s[t] = q . k_t for nt rows of k (f32, row stride d). */
static void scores(float *s, const float *q, const float *k, int nt, int d) {
    for (int t = scores_vec(s, q, k, nt, d); t < nt; t++) s[t] = dot(q, k + (int64_t)t * d, d);
}

/* out[d] += sum_t p[t] v_t for nt rows of v (f32). Even and odd rows go to two sets of
 * accumulators, kept in registers across the rows: one set alone is a chain of dependent
 * FMAs, which runs at half the FMA units' rate. */
static void weighted_sum(float *out, const float *p, const float *v, int nt, int d) {
    const int i0 = weighted_sum_vec(out, p, v, nt, d);
    for (int t = 0; t < nt; t++)
        for (int i = i0; i < d; i++) out[i] += p[t] * v[(int64_t)t * d + i];
}

/* max(p[0..n-1]); a serial compare chain here took as long as a block's scores. */
static float max_of(const float *p, int n) {
    float m;
    for (int i = max_of_vec(p, n, &m); i < n; i++) m = p[i] > m ? p[i] : m;
    return m;
}

/* f32 copies of n f16 values (F16C in the vector builds). */
static void load_f16(float *dst, const uint16_t *src, int64_t n) {
    for (int64_t i = f16_to_f32_vec(dst, src, n); i < n; i++) dst[i] = ds4k_f16_to_f32(src[i]);
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
    const char *p = (const char *)plane + (h * j->hs + t * j->d) * elem;
    for (int64_t b = 0; b < nt * j->d * elem; b += 64) __builtin_prefetch(p + b, 0, 3);
}

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
        const float *k = rows_f32(j, j->k, h * j->hs + (t0 + r) * d, m, tile);
        for (int g = 0; g < G; g++) scores(p[g] + r, j->q + (h * G + g) * d, k, m, d);
    }
    for (int g = 0; g < G; g++) {
        const float mx = max_of(p[g], nt);
        out[g][0] = mx;
        out[g][1] = exp_shift_sum(p[g], nt, mx);
        memset(out[g] + 2, 0, sizeof(float) * (size_t)d);
    }
    /* The AVX-512 build reads V once per row for all the heads (vec_avx512.h), where the shape allows. */
    if (weighted_sums_vec(out, 2, p, (const char *)j->v + (h * j->hs + t0 * d) * (j->f16 ? 2 : 4), j->f16, nt, d, G,
                          ATT_PREFETCH_TILES * ATT_TILE))
        return;
    /* outputs, one V tile at a time */
    for (int r = 0; r < nt; r += ATT_TILE) {
        const int m = nt - r < ATT_TILE ? nt - r : ATT_TILE;
        prefetch_tile(j, j->v, h, t0 + r + ATT_PREFETCH_TILES * ATT_TILE, t1);
        const float *v = rows_f32(j, j->v, h * j->hs + (t0 + r) * d, m, tile);
        for (int g = 0; g < G; g++) weighted_sum(out[g] + 2, p[g] + r, v, m, d);
    }
}

/* o[Hq, D] = softmax(q k^T * scale) v of one query over rows 0..n-1 of each KV head (a ring's
 * live rows in slot order: softmax does not mind), grouped: query head h*G+g uses KV head h
 * (llama.py's q.reshape(S, Hkv, G, D) order). 0, or -1 without memory for the blocks' parts. */
static int attn_decode(const float *q, float *o, const void *k, const void *v, int64_t hs, int f16, int64_t n, int hq,
                       int hkv, int d, float scale, int nth) {
    const int g = hq / hkv;
    float qs[hq * d];
    for (int e = 0; e < hq * d; e++) qs[e] = q[e] * scale; /* llama.py scales q, not scores */
    /* Longer blocks where there are plenty: each block is a chunk whose K and V streams
     * start cold, and with 2 threads a thread's blocks are not adjacent (SmolLM2 at 4K, 2
     * threads: attention alone 3.1 -> 2.4 ms, the step 6.0 -> 5.6 ms with 512-row blocks).
     * The size depends on n and the head count only, never on the thread count. */
    int64_t block = ATT_BLOCK;
    while (2 * block <= ATT_BLOCK_MAX && hkv * ((n + 2 * block - 1) / (2 * block)) >= ATT_MIN_CHUNKS) block *= 2;
    const int64_t nblk = (n + block - 1) / block;
    float *part = (float *)malloc(sizeof(float) * (size_t)(hkv * nblk * g * (d + 2)));
    if (part == NULL) return -1;
    att_job j = {qs, k, v, hs, n, nblk, block, g, d, f16, part};
    /* At a short context the whole attention is a few microseconds: waking the pool for it
     * costs more than it saves (the chunks, hence the results, are the same either way). */
    const int small = n * hkv * d * g < ATT_INLINE_WORK;
    ds4k_run_chunks(att_chunk, &j, hkv * j.nblk, small ? 1 : nth);
    for (int h = 0; h < hkv; h++) {
        for (int gi = 0; gi < g; gi++) {
            float *out = o + (h * g + gi) * d;
            float mx = -INFINITY, sum = 0.0f;
            for (int64_t b = 0; b < j.nblk; b++) {
                float bm = part[((h * j.nblk + b) * g + gi) * (d + 2)];
                if (bm > mx) mx = bm;
            }
            memset(out, 0, sizeof(float) * (size_t)d);
            for (int64_t b = 0; b < j.nblk; b++) {
                const float *pb = part + ((h * j.nblk + b) * g + gi) * (d + 2);
                float w = expf(pb[0] - mx);
                sum += pb[1] * w;
                axpy(out, w, pb + 2, d);
            }
            float inv = 1.0f / sum;
            for (int i = 0; i < d; i++) out[i] *= inv;
        }
    }
    free(part);
    return 0;
}

/* o[s][hq][d] (row stride ldo) = attention of the queries q[s][hq][d] (row stride ldq) at
 * positions qpos0 + s, s < S, grouped: query head h*G + g uses KV head h. Keys are positions
 * 0..qpos0+S-1 (from qpos0+s-window+1 for a window > 0): position p < kbase is row p % cap of
 * head h at k + h*hs (elements, rows d apart), p >= kbase row p - kbase of head h at
 * kn + h*hsn (rows rsn apart); the same for v (same hs) and vn (hsv, rsv). kv_f16: the rows
 * are f16, else f32.
 * 0 on success, -1 for a shape it does not take (d not a multiple of 8, d > ATTN_MAX_D, ...). */
static int attn(const float *q, int64_t ldq, float *o, int64_t ldo, const void *k, const void *v, int64_t hs,
                int64_t cap, const void *kn, int64_t hsn, int64_t rsn, const void *vn, int64_t hsv, int64_t rsv,
                int kv_f16, int64_t s,
                int64_t qpos0, int64_t kbase, int64_t window, int hq, int hkv, int d, float scale, int bf16, int nth) {
    if (s <= 0 || hkv <= 0 || hq % hkv || d <= 0 || d > ATTN_MAX_D || qpos0 < 0 || kbase < 0 ||
        kbase > qpos0 + s || (kbase > 0 && cap <= 0) || window < 0)
        return -1;
    /* One query whose keys are all in the buffer and fill its first slots (a decode step: a
     * global layer's positions 0..qpos0, or a ring holding exactly its window): the decode
     * kernel above, over those slots. */
    if (s == 1 && kbase == qpos0 + 1 && hq / hkv <= MAX_GROUP &&
        (qpos0 < cap ? window == 0 || qpos0 < window : window == cap))
        return attn_decode(q, o, k, v, hs, kv_f16, qpos0 < cap ? qpos0 + 1 : cap, hq, hkv, d, scale, nth);
    if (d % 8) return -1;
    attn_job j = {.q = q, .o = o, .k = k, .v = v, .kn = kn, .vn = vn, .ldq = ldq, .ldo = ldo, .hs = hs,
                  .cap = cap, .hsn = hsn, .rsn = rsn, .hsv = hsv, .rsv = rsv, .s = s, .qpos0 = qpos0, .kbase = kbase,
                  .window = window, .g = hq / hkv, .d = d, .dp = (d + ATTN_DC - 1) / ATTN_DC * ATTN_DC, .f16 = kv_f16,
                  .scale = scale};
    const int64_t m_all = s * j.g;
    j.nqb = (int)((m_all + ATTN_QB - 1) / ATTN_QB);
    j.qb = (int)((m_all + j.nqb - 1) / j.nqb);
    /* Split keys while chunks are few: by the widest block's key range, a shape-only figure. */
    int64_t first, end, widest = 0;
    for (int64_t qb = 0; qb < j.nqb; qb++) {
        int64_t r0 = qb * j.qb, r1 = r0 + j.qb < m_all ? r0 + j.qb : m_all;
        attn_keys(&j, r0, r1, &first, &end);
        if (end - first > widest) widest = end - first;
    }
    j.bf16 = ATTN_BF16 && bf16 && d % 32 == 0 && widest >= ATTN_BF16_MIN_KEYS;
    int64_t nsplit = (ATTN_MIN_CHUNKS + (int64_t)hkv * j.nqb - 1) / ((int64_t)hkv * j.nqb);
    const int64_t most = widest / ATTN_SPAN_MIN > 1 ? widest / ATTN_SPAN_MIN : 1;
    j.nsplit = (int)(nsplit < most ? nsplit : most);
    float *part = NULL;
    if (j.nsplit > 1) {
        j.part_stride = (2 + (int64_t)j.dp) * j.qb;
        part = (float *)malloc(sizeof(float) * (size_t)(j.part_stride * hkv * j.nqb * j.nsplit));
        if (part == NULL) return -1;
        j.part = part;
    }
    ds4k_run_chunks(attn_chunk, &j, (int64_t)hkv * j.nqb * j.nsplit, nth);
    if (part != NULL) {
        attn_merge(&j, hkv);
        free(part);
    }
    return 0;
}
