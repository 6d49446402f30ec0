/* attn.c: causal grouped-query attention of a chunk of S query positions over a session's
 * KV rows (the llama forward's prefill chunks; decode steps of a plain llama go through
 * llama_step.c).
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
 * each K/V row is read once per block of up to ATTN_QB rows. Inside a block everything is
 * transposed, queries along the vector lanes: scores St[key][m] = sum_d K[key][d] Qt[d][m]
 * (a K element broadcast against a vector of queries), the online softmax's running max
 * and sum are vectors over m (no horizontal reductions), and Ot[d][m] += V[key][d]
 * St[key][m]. Keys go in blocks of ATTN_NK (flash attention's rescaling between blocks);
 * key blocks past a block's last query are skipped, and partly visible ones masked.
 *
 * Work is split into pool chunks of (KV head, query block, key span); when there are few
 * query blocks (a short chunk after a restore: 69 rows per head over 4K keys), each block's
 * keys are split into spans whose (max, sum, output) are merged afterwards in span order.
 * Chunk and span bounds depend only on the shape, so results never depend on the thread
 * count, and a replayed chunk computes exactly what the live one did.
 */

#define ATTN_QB 96         /* query rows per block (G*S rows of a short chunk fit one) */
#define ATTN_NK 64         /* keys per block: K and V tiles stay in L1 at D = 64 */
#define ATTN_SPAN_MIN 256  /* a key span is never split below this */
#define ATTN_MIN_CHUNKS 12 /* split keys until there are this many chunks (or spans run out): even for 2, 3, 4 threads */
#define ATTN_MAX_D 256

_Static_assert(ATTN_NK % 8 == 0, "key blocks must be whole micro-tiles (AJR divides 8)");

/* ---------------------------------------------------------------- native vectors (av) */
#if DS4K_ISA >= 2
typedef __m512 av;
#define AW 16  /* lanes */
#define AMV 3  /* query vectors per micro-tile */
#define AJR 8  /* keys (QK) or head dims (PV) per micro-tile: AMV x AJR accumulators */
static inline av av_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void av_store(float *p, av v) { _mm512_storeu_ps(p, v); }
static inline av av_set1(float a) { return _mm512_set1_ps(a); }
static inline av av_fma(av a, av b, av c) { return _mm512_fmadd_ps(a, b, c); }
static inline av av_mul(av a, av b) { return _mm512_mul_ps(a, b); }
static inline av av_add(av a, av b) { return _mm512_add_ps(a, b); }
static inline av av_sub(av a, av b) { return _mm512_sub_ps(a, b); }
static inline av av_max(av a, av b) { return _mm512_max_ps(a, b); }
static inline av av_div(av a, av b) { return _mm512_div_ps(a, b); }
/* a where lo <= q < hi, else -inf */
static inline av av_keep(av a, av q, float lo, float hi) {
    __mmask16 k = _mm512_cmp_ps_mask(q, _mm512_set1_ps(lo), _CMP_GE_OQ) &
                  _mm512_cmp_ps_mask(q, _mm512_set1_ps(hi), _CMP_LT_OQ);
    return _mm512_mask_blend_ps(k, _mm512_set1_ps(-INFINITY), a);
}
/* e^x, ~1 ulp (Cephes polynomial); exactly 0 below -87.3, so -inf gives 0. */
static inline av av_exp(av x) {
    __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_LT_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.3f));
    av n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    av r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    av p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_maskz_scalef_ps((__mmask16)~tiny, p, n);
}
#elif DS4K_ISA == 1
typedef __m256 av;
#define AW 8
#define AMV 3
#define AJR 4
static inline av av_load(const float *p) { return _mm256_loadu_ps(p); }
static inline void av_store(float *p, av v) { _mm256_storeu_ps(p, v); }
static inline av av_set1(float a) { return _mm256_set1_ps(a); }
static inline av av_fma(av a, av b, av c) { return _mm256_fmadd_ps(a, b, c); }
static inline av av_mul(av a, av b) { return _mm256_mul_ps(a, b); }
static inline av av_add(av a, av b) { return _mm256_add_ps(a, b); }
static inline av av_sub(av a, av b) { return _mm256_sub_ps(a, b); }
static inline av av_max(av a, av b) { return _mm256_max_ps(a, b); }
static inline av av_div(av a, av b) { return _mm256_div_ps(a, b); }
static inline av av_keep(av a, av q, float lo, float hi) {
    __m256 k = _mm256_and_ps(_mm256_cmp_ps(q, _mm256_set1_ps(lo), _CMP_GE_OQ),
                             _mm256_cmp_ps(q, _mm256_set1_ps(hi), _CMP_LT_OQ));
    return _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), a, k);
}
/* exp8 (simd.h), but exactly 0 below -87.3, so -inf gives 0 */
static inline av av_exp(av x) {
    return _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ), exp8(x));
}
#else
typedef float av;
#define AW 1
#define AMV 8
#define AJR 4
static inline av av_load(const float *p) { return *p; }
static inline void av_store(float *p, av v) { *p = v; }
static inline av av_set1(float a) { return a; }
static inline av av_fma(av a, av b, av c) { return a * b + c; }
static inline av av_mul(av a, av b) { return a * b; }
static inline av av_add(av a, av b) { return a + b; }
static inline av av_sub(av a, av b) { return a - b; }
static inline av av_max(av a, av b) { return a > b ? a : b; }
static inline av av_div(av a, av b) { return a / b; }
static inline av av_keep(av a, av q, float lo, float hi) { return q >= lo && q < hi ? a : -INFINITY; }
static inline av av_exp(av x) { return expf(x); }
#endif

/* ---------------------------------------------------------------- the job */

typedef struct {
    const float *q;           /* row s, head j at q + s * ldq + j * d */
    float *o;                 /* same layout, ldo */
    const void *k, *v;        /* the buffer: head h, slot r at (h * hs + r * d) elements */
    const void *kn, *vn;      /* new rows: head h, row i at (h * hsn + i * rsn) elements (vn: hsv, rsv) */
    int64_t ldq, ldo, hs, cap, hsn, rsn, hsv, rsv, s, qpos0, kbase, window;
    int g, d, f16, nqb, qb, nsplit;
    float scale;
    float *part;              /* nsplit > 1: per chunk, max[mp], sum[mp], Ot[d][mp] */
    int64_t part_stride;
} attn_job;

/* Keys [first, end) a query block sees at all (rows r0..r1-1). */
static void attn_keys(const attn_job *j, int64_t r0, int64_t r1, int64_t *first, int64_t *end) {
    const int64_t qlo = j->qpos0 + r0 / j->g, qhi = j->qpos0 + (r1 - 1) / j->g;
    *first = j->window > 0 && qlo - j->window + 1 > 0 ? qlo - j->window + 1 : 0;
    *end = qhi + 1;
}

/* Key (or value) p of head h as a float row; hn, rn: the strides of nbuf. */
static inline void attn_row(const attn_job *j, const void *buf, const void *nbuf, int64_t hn, int64_t rn, int64_t h,
                            int64_t p, float *dst) {
    int64_t off = p < j->kbase ? h * j->hs + (p % j->cap) * j->d : h * hn + (p - j->kbase) * rn;
    const int d = j->d;
    if (!j->f16) {
        memcpy(dst, (const float *)(p < j->kbase ? buf : nbuf) + off, sizeof(float) * (size_t)d);
        return;
    }
    const uint16_t *src = (const uint16_t *)(p < j->kbase ? buf : nbuf) + off;
    int i = 0;
#if DS4K_ISA >= 1
    for (; i + 8 <= d; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
#endif
    for (; i < d; i++) dst[i] = ds4k_f16_to_f32(src[i]);
}

/* St[key][m] = sum_i K[key][i] Qt[i][m] for AJR keys and nv query vectors. */
static inline __attribute__((always_inline)) void attn_qk_tile(const float *kf, const float *qt, float *st, int d,
                                                              int mp, const int nv) {
    av acc[AJR][AMV];
    for (int r = 0; r < AJR; r++)
        for (int v = 0; v < nv; v++) acc[r][v] = av_set1(0.0f);
    for (int i = 0; i < d; i++) {
        av qv[AMV];
        for (int v = 0; v < nv; v++) qv[v] = av_load(qt + (int64_t)i * mp + v * AW);
        for (int r = 0; r < AJR; r++) {
            av kb = av_set1(kf[r * d + i]);
            for (int v = 0; v < nv; v++) acc[r][v] = av_fma(kb, qv[v], acc[r][v]);
        }
    }
    for (int r = 0; r < AJR; r++)
        for (int v = 0; v < nv; v++) av_store(st + (int64_t)r * mp + v * AW, acc[r][v]);
}

/* Ot[i][m] = alpha[m] Ot[i][m] + sum_key V[key][i] St[key][m] for AJR dims and nv query vectors. */
static inline __attribute__((always_inline)) void attn_pv_tile(const float *vf, const float *st, float *ot,
                                                              const float *alpha, int nk, int d, int mp,
                                                              const int nv) {
    av acc[AJR][AMV];
    for (int v = 0; v < nv; v++) {
        av a = av_load(alpha + v * AW);
        for (int r = 0; r < AJR; r++) acc[r][v] = av_mul(a, av_load(ot + (int64_t)r * mp + v * AW));
    }
    for (int t = 0; t < nk; t++) {
        av pv[AMV];
        for (int v = 0; v < nv; v++) pv[v] = av_load(st + (int64_t)t * mp + v * AW);
        for (int r = 0; r < AJR; r++) {
            av vb = av_set1(vf[t * d + r]);
            for (int v = 0; v < nv; v++) acc[r][v] = av_fma(vb, pv[v], acc[r][v]);
        }
    }
    for (int r = 0; r < AJR; r++)
        for (int v = 0; v < nv; v++) av_store(ot + (int64_t)r * mp + v * AW, acc[r][v]);
}

static void attn_qk(const float *kf, const float *qt, float *st, int nk, int d, int mp) {
    for (int t = 0; t < nk; t += AJR)
        for (int m = 0; m < mp; m += AMV * AW) {
            const int nv = (mp - m) / AW < AMV ? (mp - m) / AW : AMV;
            switch (nv) {
#if AMV >= 8
            case 8: attn_qk_tile(kf + t * d, qt + m, st + (int64_t)t * mp + m, d, mp, 8); break;
            case 7: attn_qk_tile(kf + t * d, qt + m, st + (int64_t)t * mp + m, d, mp, 7); break;
            case 6: attn_qk_tile(kf + t * d, qt + m, st + (int64_t)t * mp + m, d, mp, 6); break;
            case 5: attn_qk_tile(kf + t * d, qt + m, st + (int64_t)t * mp + m, d, mp, 5); break;
            case 4: attn_qk_tile(kf + t * d, qt + m, st + (int64_t)t * mp + m, d, mp, 4); break;
#endif
#if AMV >= 3
            case 3: attn_qk_tile(kf + t * d, qt + m, st + (int64_t)t * mp + m, d, mp, 3); break;
#endif
            case 2: attn_qk_tile(kf + t * d, qt + m, st + (int64_t)t * mp + m, d, mp, 2); break;
            default: attn_qk_tile(kf + t * d, qt + m, st + (int64_t)t * mp + m, d, mp, 1); break;
            }
        }
}

static void attn_pv(const float *vf, const float *st, float *ot, const float *alpha, int nk, int d, int mp) {
    for (int i = 0; i < d; i += AJR)
        for (int m = 0; m < mp; m += AMV * AW) {
            const int nv = (mp - m) / AW < AMV ? (mp - m) / AW : AMV;
            float *o = ot + (int64_t)i * mp + m;
            switch (nv) {
#if AMV >= 8
            case 8: attn_pv_tile(vf + i, st + m, o, alpha + m, nk, d, mp, 8); break;
            case 7: attn_pv_tile(vf + i, st + m, o, alpha + m, nk, d, mp, 7); break;
            case 6: attn_pv_tile(vf + i, st + m, o, alpha + m, nk, d, mp, 6); break;
            case 5: attn_pv_tile(vf + i, st + m, o, alpha + m, nk, d, mp, 5); break;
            case 4: attn_pv_tile(vf + i, st + m, o, alpha + m, nk, d, mp, 4); break;
#endif
#if AMV >= 3
            case 3: attn_pv_tile(vf + i, st + m, o, alpha + m, nk, d, mp, 3); break;
#endif
            case 2: attn_pv_tile(vf + i, st + m, o, alpha + m, nk, d, mp, 2); break;
            default: attn_pv_tile(vf + i, st + m, o, alpha + m, nk, d, mp, 1); break;
            }
        }
}

static void attn_chunk(void *vctx, int64_t c) {
    const attn_job *j = (const attn_job *)vctx;
    const int g = j->g, d = j->d;
    const int64_t h = c / ((int64_t)j->nqb * j->nsplit), qb = c / j->nsplit % j->nqb, sp = c % j->nsplit;
    const int64_t m_all = j->s * g, r0 = qb * j->qb, r1 = r0 + j->qb < m_all ? r0 + j->qb : m_all;
    const int m = (int)(r1 - r0), mp = (m + AW - 1) / AW * AW;
    int64_t first, end;
    attn_keys(j, r0, r1, &first, &end);
    /* This span's key blocks: blocks [b0, b1) of the block's range. */
    const int64_t nblk = (end - first + ATTN_NK - 1) / ATTN_NK;
    const int64_t b0 = sp * nblk / j->nsplit, b1 = (sp + 1) * nblk / j->nsplit;

    /* ~350 KB at D = 256 (the stack: no allocation per chunk); ATTN_NK is a multiple of AJR. */
    float qt[d * mp], ot[d * mp], st[ATTN_NK * mp], kf[ATTN_NK * d], vf[ATTN_NK * d];
    float qpos[mp], mx[mp], sum[mp], alpha[mp];
    /* Qt[i][m] = q[m][i] * scale; padding rows (to whole vectors) are zeros at the last
     * row's position, never stored. */
    for (int r = 0; r < mp; r++) {
        const int64_t row = r0 + (r < m ? r : m - 1);
        qpos[r] = (float)(j->qpos0 + row / g);
        mx[r] = -INFINITY, sum[r] = 0.0f;
        const float *q = r < m ? j->q + row / g * j->ldq + (h * g + row % g) * d : NULL;
        for (int i = 0; i < d; i++) qt[i * mp + r] = q ? q[i] * j->scale : 0.0f;
    }
    memset(ot, 0, sizeof(float) * (size_t)(d * mp));
    const float lo_q = (float)(j->qpos0 + r0 / g), hi_q = (float)(j->qpos0 + (r1 - 1) / g);
    for (int64_t b = b0; b < b1; b++) {
        const int64_t p0 = first + b * ATTN_NK;
        const int nk = (int)(end - p0 < ATTN_NK ? end - p0 : ATTN_NK), nkp = (nk + AJR - 1) / AJR * AJR;
        for (int t = 0; t < nk; t++) {
            attn_row(j, j->k, j->kn, j->hsn, j->rsn, h, p0 + t, kf + t * d);
            attn_row(j, j->v, j->vn, j->hsv, j->rsv, h, p0 + t, vf + t * d);
        }
        /* Padding keys (to a whole micro-tile) are zeros, masked out below. */
        memset(kf + nk * d, 0, sizeof(float) * (size_t)((nkp - nk) * d));
        memset(vf + nk * d, 0, sizeof(float) * (size_t)((nkp - nk) * d));
        attn_qk(kf, qt, st, nkp, d, mp);
        /* Key p is visible to a query at position q when p <= q and (window) q < p + window. */
        const float last = (float)(p0 + nk - 1);
        const int all_visible = nk == nkp && last <= lo_q && (j->window <= 0 || hi_q < (float)p0 + (float)j->window);
        if (!all_visible) {
            for (int t = 0; t < nkp; t++) {
                const float p = (float)(p0 + t), hi = t < nk ? (j->window > 0 ? p + (float)j->window : INFINITY) : -INFINITY;
                for (int r = 0; r < mp; r += AW)
                    av_store(st + (int64_t)t * mp + r, av_keep(av_load(st + (int64_t)t * mp + r), av_load(qpos + r), p, hi));
            }
        }
        /* Online softmax over this block, a vector of queries at a time. */
        for (int r = 0; r < mp; r += AW) {
            av bm = av_load(st + r);
            for (int t = 1; t < nkp; t++) bm = av_max(bm, av_load(st + (int64_t)t * mp + r));
            av old = av_load(mx + r), nm = av_max(old, bm);
            /* A query with no visible key yet keeps max -inf; subtracting 0 then gives exp(-inf) = 0
             * instead of exp(-inf - -inf) = nan. */
            float tmp[AW], base[AW];
            av_store(tmp, nm);
            for (int l = 0; l < AW; l++) base[l] = tmp[l] == -INFINITY ? 0.0f : tmp[l];
            av bv = av_load(base);
            av a = av_exp(av_sub(old, bv)), s = av_set1(0.0f);
            for (int t = 0; t < nkp; t++) {
                av e = av_exp(av_sub(av_load(st + (int64_t)t * mp + r), bv));
                av_store(st + (int64_t)t * mp + r, e);
                s = av_add(s, e);
            }
            av_store(mx + r, nm);
            av_store(alpha + r, a);
            av_store(sum + r, av_fma(av_load(sum + r), a, s));
        }
        attn_pv(vf, st, ot, alpha, nkp, d, mp);
    }
    if (j->nsplit == 1) {
        for (int r = 0; r < m; r++) {
            const int64_t row = r0 + r;
            float *o = j->o + row / g * j->ldo + (h * g + row % g) * d;
            const float inv = 1.0f / sum[r];
            for (int i = 0; i < d; i++) o[i] = ot[i * mp + r] * inv;
        }
        return;
    }
    float *part = j->part + c * j->part_stride;
    memcpy(part, mx, sizeof(float) * (size_t)mp);
    memcpy(part + mp, sum, sizeof(float) * (size_t)mp);
    memcpy(part + 2 * mp, ot, sizeof(float) * (size_t)(d * mp));
}

/* Merge the spans of every (head, query block), in span order. */
static void attn_merge(const attn_job *j, int hkv) {
    const int g = j->g, d = j->d;
    const int64_t m_all = j->s * g;
    for (int64_t h = 0; h < hkv; h++)
        for (int64_t qb = 0; qb < j->nqb; qb++) {
            const int64_t r0 = qb * j->qb, r1 = r0 + j->qb < m_all ? r0 + j->qb : m_all;
            const int m = (int)(r1 - r0), mp = (m + AW - 1) / AW * AW;
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
                    const float w = expf(p[r] - top);
                    total += p[mp + r] * w;
                    for (int i = 0; i < d; i++) o[i] += w * p[2 * mp + i * mp + r];
                }
                const float inv = 1.0f / total;
                for (int i = 0; i < d; i++) o[i] *= inv;
            }
        }
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
                int64_t qpos0, int64_t kbase, int64_t window, int hq, int hkv, int d, float scale, int nth) {
    if (s <= 0 || hkv <= 0 || hq % hkv || d <= 0 || d % 8 || d > ATTN_MAX_D || qpos0 < 0 || kbase < 0 ||
        kbase > qpos0 + s || (kbase > 0 && cap <= 0) || window < 0)
        return -1;
    attn_job j = {.q = q, .o = o, .k = k, .v = v, .kn = kn, .vn = vn, .ldq = ldq, .ldo = ldo, .hs = hs,
                  .cap = cap, .hsn = hsn, .rsn = rsn, .hsv = hsv, .rsv = rsv, .s = s, .qpos0 = qpos0, .kbase = kbase,
                  .window = window, .g = hq / hkv, .d = d, .f16 = kv_f16, .scale = scale};
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
    int64_t nsplit = (ATTN_MIN_CHUNKS + (int64_t)hkv * j.nqb - 1) / ((int64_t)hkv * j.nqb);
    const int64_t most = widest / ATTN_SPAN_MIN > 1 ? widest / ATTN_SPAN_MIN : 1;
    j.nsplit = (int)(nsplit < most ? nsplit : most);
    float *part = NULL;
    if (j.nsplit > 1) {
        const int64_t mp = ((int64_t)j.qb + AW - 1) / AW * AW;
        j.part_stride = (2 + d) * mp;
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
