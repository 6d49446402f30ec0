/* glu.c: the gated FFN's activation, out = act(gate) * up, in one pass over a chunk's rows.
 *
 * Owns: glu, for the llama forward's [S, 2F] gate|up product (SiLU for llama/Qwen, tanh GELU
 * for Gemma). Leaves to callers (attn.py's glu(), the forward): checks and serializing calls.
 * Written in attn.c's vector vocabulary (av, av_exp), which isa.c includes first.
 *
 * Why: in torch this is two passes (the activation over a strided half, then the product),
 * ~1.4 ms per Gemma 3 layer of a 512-token chunk on one core, 4% of its forward. Results
 * match torch's to float rounding (~1e-6 relative): silu(x) = x / (1 + e^-x), gelu_tanh(x) =
 * x/2 (1 + tanh y) = x / (1 + e^-2y), y = sqrt(2/pi) (x + 0.044715 x^3). Rows are
 * independent, so the thread count never changes a result.
 */

#define GLU_ROWS 8 /* rows per pool chunk */

typedef struct {
    const float *gu;
    float *out;
    int64_t ld, rows, f;
    int gelu;
} glu_job;

/* x / (1 + e^-z): z = x for SiLU, z = 2y for tanh GELU, whose x/2 (1 + tanh y) is the same
 * value without 1 + tanh's cancellation for negative x. */
static inline av glu_act(av x, int gelu) {
    av z = x;
    if (gelu) {
        const av y = av_mul(av_set1(0.7978845608028654f), av_fma(av_mul(av_set1(0.044715f), x), av_mul(x, x), x));
        z = av_add(y, y);
    }
    return av_div(x, av_add(av_set1(1.0f), av_exp(av_sub(av_set1(0.0f), z))));
}

static void glu_chunk(void *vctx, int64_t c) {
    const glu_job *j = (const glu_job *)vctx;
    const int64_t r1 = (c + 1) * GLU_ROWS < j->rows ? (c + 1) * GLU_ROWS : j->rows;
    for (int64_t r = c * GLU_ROWS; r < r1; r++) {
        const float *g = j->gu + r * j->ld, *u = g + j->f;
        float *o = j->out + r * j->f;
        int64_t i = 0;
        for (; i + AW <= j->f; i += AW) av_store(o + i, av_mul(glu_act(av_load(g + i), j->gelu), av_load(u + i)));
        for (; i < j->f; i++) {
            const float x = g[i];
            const float z = j->gelu ? 2.0f * 0.7978845608028654f * (x + 0.044715f * x * x * x) : x;
            o[i] = x / (1.0f + expf(-z)) * u[i];
        }
    }
}

/* out[r][i] = act(gu[r][i]) * gu[r][f + i] for r < rows, i < f (gu rows ld floats apart,
 * out rows f apart); gelu: tanh GELU, else SiLU. 0, or -1 for a bad shape. */
static int glu(const float *gu, int64_t ld, float *out, int64_t rows, int64_t f, int gelu, int nth) {
    if (rows <= 0 || f <= 0 || ld < 2 * f) return -1;
    glu_job j = {gu, out, ld, rows, f, gelu};
    const int64_t chunks = (rows + GLU_ROWS - 1) / GLU_ROWS;
    /* A few rows (a short prefill) are microseconds of work: no pool hand-off. */
    ds4k_run_chunks(glu_chunk, &j, chunks, rows * f < 65536 ? 1 : nth);
    return 0;
}
