/* rows.c: the llama forward's per-row steps between its products, one C pass each.
 *
 * Owns: glu (the gated FFN's act(gate) * up: SiLU for llama/Qwen, tanh GELU for Gemma),
 * rms_norm (x * w / sqrt(mean(x^2) + eps) over rows) and qk_rope (the q/k heads of a
 * fused product: per-head RMSNorm where the architecture has it, then RoPE, into a new
 * [S, heads, D] buffer). Leaves to callers (rows.py, the forward): checks, serializing calls.
 * Written in attn.c's vector vocabulary (av, av_exp), which isa.c includes first.
 *
 * Why: in torch each is several passes over the activations (RoPE: four products, two sums
 * and a cat; GELU over a strided half, then a product), together ~10% of a 512-token chunk's
 * forward on one core. Results: RoPE is the same operations as the torch code (each product
 * and sum rounded on its own: the build has -ffp-contract=off), so the same bits; RMSNorm
 * sums squares in another order than torch (~1e-7 relative); the activations match torch's
 * to ~1e-6: silu(x) = x / (1 + e^-x), gelu_tanh(x) = x/2 (1 + tanh y) = x / (1 + e^-2y),
 * y = sqrt(2/pi) (x + 0.044715 x^3), the second form without 1 + tanh's cancellation for
 * negative x. Rows are independent, so the thread count never changes a result.
 */

#define ROWS_PER_CHUNK 8
#define ROWS_INLINE_WORK 65536 /* elements below which a call stays on the calling thread */

typedef struct {
    const float *x, *w, *cos, *sin;
    float *out;
    int64_t ld, ldo, rows, n, heads;
    float eps;
    int gelu;
} rows_job;

static void rows_run(ds4k_chunk_fn fn, rows_job *j, int64_t work, int nth) {
    /* A few rows (a short prefill) are microseconds of work: no pool hand-off. */
    ds4k_run_chunks(fn, j, (j->rows + ROWS_PER_CHUNK - 1) / ROWS_PER_CHUNK, work < ROWS_INLINE_WORK ? 1 : nth);
}

/* ---------------------------------------------------------------- glu */

/* x / (1 + e^-z): z = x for SiLU, z = 2y for tanh GELU. */
static inline av glu_act(av x, int gelu) {
    av z = x;
    if (gelu) {
        const av y = av_mul(av_set1(0.7978845608028654f), av_fma(av_mul(av_set1(0.044715f), x), av_mul(x, x), x));
        z = av_add(y, y);
    }
    return av_div(x, av_add(av_set1(1.0f), av_exp(av_sub(av_set1(0.0f), z))));
}

static void glu_chunk(void *vctx, int64_t c) {
    const rows_job *j = (const rows_job *)vctx;
    const int64_t r1 = (c + 1) * ROWS_PER_CHUNK < j->rows ? (c + 1) * ROWS_PER_CHUNK : j->rows;
    for (int64_t r = c * ROWS_PER_CHUNK; r < r1; r++) {
        const float *g = j->x + r * j->ld, *u = g + j->n;
        float *o = j->out + r * j->ldo;
        int64_t i = 0;
        for (; i + AW <= j->n; i += AW) av_store(o + i, av_mul(glu_act(av_load(g + i), j->gelu), av_load(u + i)));
        for (; i < j->n; i++) {
            const float x = g[i];
            const float z = j->gelu ? 2.0f * 0.7978845608028654f * (x + 0.044715f * x * x * x) : x;
            o[i] = x / (1.0f + expf(-z)) * u[i];
        }
    }
}

/* out[r][i] = act(x[r][i]) * x[r][f + i] for r < rows, i < f (x rows ld floats apart,
 * out rows f apart); gelu: tanh GELU, else SiLU. 0, or -1 for a bad shape. */
static int glu(const float *x, int64_t ld, float *out, int64_t rows, int64_t f, int gelu, int nth) {
    if (rows <= 0 || f <= 0 || ld < 2 * f) return -1;
    rows_job j = {.x = x, .out = out, .ld = ld, .ldo = f, .rows = rows, .n = f, .gelu = gelu};
    rows_run(glu_chunk, &j, rows * f, nth);
    return 0;
}

/* ---------------------------------------------------------------- rms_norm */

/* 1 / sqrt(mean(x^2) + eps) of n floats. */
static float rows_rstd(const float *x, int64_t n, float eps) {
    av acc = av_set1(0.0f);
    int64_t i = 0;
    for (; i + AW <= n; i += AW) {
        av v = av_load(x + i);
        acc = av_fma(v, v, acc);
    }
    float lanes[AW], ss = 0.0f;
    av_store(lanes, acc);
    for (int l = 0; l < AW; l++) ss += lanes[l];
    for (; i < n; i++) ss += x[i] * x[i];
    return 1.0f / sqrtf(ss / (float)n + eps);
}

/* out = x * rstd * w (w NULL: 1), n floats */
static void rows_scale(float *out, const float *x, const float *w, int64_t n, float rstd) {
    const av r = av_set1(rstd);
    int64_t i = 0;
    for (; i + AW <= n; i += AW) {
        av v = av_mul(av_load(x + i), r);
        av_store(out + i, w ? av_mul(v, av_load(w + i)) : v);
    }
    for (; i < n; i++) out[i] = w ? x[i] * rstd * w[i] : x[i] * rstd;
}

static void norm_chunk(void *vctx, int64_t c) {
    const rows_job *j = (const rows_job *)vctx;
    const int64_t r1 = (c + 1) * ROWS_PER_CHUNK < j->rows ? (c + 1) * ROWS_PER_CHUNK : j->rows;
    for (int64_t r = c * ROWS_PER_CHUNK; r < r1; r++) {
        const float *x = j->x + r * j->ld;
        rows_scale(j->out + r * j->ldo, x, j->w, j->n, rows_rstd(x, j->n, j->eps));
    }
}

/* out[r] = x[r] * w / sqrt(mean(x[r]^2) + eps) for r < rows (n floats each; x rows ld
 * apart, out rows n apart). 0, or -1 for a bad shape. */
static int rms_norm_rows(const float *x, int64_t ld, const float *w, float *out, int64_t rows, int64_t n, float eps,
                         int nth) {
    if (rows <= 0 || n <= 0 || ld < n) return -1;
    rows_job j = {.x = x, .w = w, .out = out, .ld = ld, .ldo = n, .rows = rows, .n = n, .eps = eps};
    rows_run(norm_chunk, &j, rows * n, nth);
    return 0;
}

/* ---------------------------------------------------------------- qk_rope */

static void rope_chunk(void *vctx, int64_t c) {
    const rows_job *j = (const rows_job *)vctx;
    const int64_t r1 = (c + 1) * ROWS_PER_CHUNK < j->rows ? (c + 1) * ROWS_PER_CHUNK : j->rows;
    const int64_t d = j->n, half = d / 2;
    float tmp[ATTN_MAX_D];
    for (int64_t r = c * ROWS_PER_CHUNK; r < r1; r++) {
        const float *cs = j->cos + r * half, *sn = j->sin + r * half;
        for (int64_t h = 0; h < j->heads; h++) {
            const float *x = j->x + r * j->ld + h * d;
            float *o = j->out + (r * j->heads + h) * d;
            if (j->w != NULL) { /* per-head RMSNorm first (qwen3, gemma3) */
                rows_scale(tmp, x, j->w + h * d, d, rows_rstd(x, d, j->eps));
                x = tmp;
            }
            /* (x1 cos - x2 sin, x2 cos + x1 sin), each product and sum rounded apart */
            int64_t i = 0;
            for (; i + AW <= half; i += AW) {
                av x1 = av_load(x + i), x2 = av_load(x + half + i), cv = av_load(cs + i), sv = av_load(sn + i);
                av_store(o + i, av_sub(av_mul(x1, cv), av_mul(x2, sv)));
                av_store(o + half + i, av_add(av_mul(x2, cv), av_mul(x1, sv)));
            }
            for (; i < half; i++) {
                const float x1 = x[i], x2 = x[half + i];
                o[i] = x1 * cs[i] - x2 * sn[i];
                o[half + i] = x2 * cs[i] + x1 * sn[i];
            }
        }
    }
}

/* out[s][h] = RoPE(norm(x[s][h])) for s < rows, h < heads (D floats each; x rows ld apart,
 * out [rows][heads][D]); w [heads][D] the per-head norm weight, or NULL for none; cos, sin
 * [rows][D/2]. 0, or -1 for a bad shape. */
static int qk_rope(const float *x, int64_t ld, const float *w, float eps, const float *cos, const float *sin, float *out,
                   int64_t rows, int64_t heads, int64_t d, int nth) {
    if (rows <= 0 || heads <= 0 || d <= 0 || d % 2 || d > ATTN_MAX_D || ld < heads * d) return -1;
    rows_job j = {.x = x, .w = w, .cos = cos, .sin = sin, .out = out, .ld = ld, .rows = rows, .n = d,
                  .heads = heads, .eps = eps};
    rows_run(rope_chunk, &j, rows * heads * d, nth);
    return 0;
}
