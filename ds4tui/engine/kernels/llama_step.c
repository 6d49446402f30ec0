/* llama_step.c: one llama-family decode step (batch 1) in a single call: embedding row to logits.
 *
 * Owns: the math of llama/model.py's forward for one token at position pos, for every
 * architecture that forward serves (llama, qwen2, qwen3, gemma3), against the same weights
 * (raw GGUF blocks or fp32, through gemv in qgemv.c), the same RoPE tables (half-split
 * rotation, rows already un-permuted by the loader; sliding layers have their own) and the
 * session's own K/V buffers, one [2 (K, V), Hkv, rows, D] per layer, f32 or f16 (the new K/V
 * rows are written in place, rounded to nearest-even f16 in an f16 buffer; attention converts
 * each row as it reads it, with F16C in the vector builds, so the cache is never converted as
 * a whole). What differs between architectures is a field of the table (ds4k.h), as in the
 * torch forward: an embedding scale, q/k/v biases, per-head q/k RMSNorm, norms after
 * attention and after the FFN, SwiGLU or GeGLU, the query scale, final logit soft-capping,
 * and sliding-window layers, whose K/V is a ring of the last `rows` positions (position p at
 * slot p % rows). Leaves to callers (llama_step.py): building the model table, the per-layer
 * K/V pointers, checks, serializing calls. Compiled once per ISA by isa.c; the vector paths
 * below are AVX2 in both vector builds. Attention is attn.c's (attn(), which hands a single
 * query over the buffer's rows to its decode kernel), the same call the chunk path makes.
 *
 * Why one call: the math per token is ~135M multiply-adds on SmolLM2, ~4 ms; the same step
 * as ~600 torch ops costs ~3 ms of dispatch on top (Gemma 3 270M: docs/perf-archive.md). One C call
 * also releases the GIL for the whole token, so the UI thread keeps running.
 *
 * A ring's rows are read in slot order, not position order; softmax is order-free, so only
 * the rounding of the sums differs from the torch forward's.
 */

/* How many parts a fused matrix has: those before the first empty one. */
static int nparts_of(const ds4k_mat *parts) {
    int n = 0;
    while (n < DS4K_MAX_PARTS && parts[n].rows > 0) n++;
    return n;
}

/* ---------------------------------------------------------------- vector math (dot: attn.c) */

/* out = x * rsqrt(mean(x^2) + eps) * w, like torch's F.rms_norm in fp32. */
static void rms_norm(float *out, const float *x, const float *w, int n, float eps) {
    float ss = dot(x, x, n);
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * r * w[i];
}

/* HF rotate_half on one head: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin). */
static void rope(float *x, const float *cos_row, const float *sin_row, int d) {
    int half = d / 2;
    for (int i = 0; i < half; i++) {
        float a = x[i], b = x[i + half], c = cos_row[i], s = sin_row[i];
        x[i] = a * c - b * s;
        x[i + half] = b * c + a * s;
    }
}

/* a[i] = silu(g[i]) * u[i] */
static void swiglu(float *a, const float *g, const float *u, int n) {
    for (int i = swiglu_vec(a, g, u, n); i < n; i++) a[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* a[i] = gelu_tanh(g[i]) * u[i], through 0.5 (1 + tanh(z)) = 1 / (1 + exp(-2z)):
 * gelu_tanh(g) = g / (1 + exp(-2 sqrt(2/pi) (g + 0.044715 g^3))). */
static void geglu(float *a, const float *g, const float *u, int n) {
    const float c = -2.0f * 0.7978845608028654f, c3 = 0.044715f;
    for (int i = geglu_vec(a, g, u, n, c, c3); i < n; i++)
        a[i] = g[i] / (1.0f + expf(c * (g[i] + c3 * g[i] * g[i] * g[i]))) * u[i];
}

/* x[i] = cap * tanh(x[i] / cap), tanh(y) = 1 - 2 / (1 + exp(2y)) (exp8 clamps: +-1 at the ends). */
static void softcap(float *x, int64_t n, float cap) {
    const float inv = 1.0f / cap;
    for (int64_t i = softcap_vec(x, n, cap, inv); i < n; i++) x[i] = cap * tanhf(x[i] * inv);
}

/* ---------------------------------------------------------------- f16 K/V rows */

/* f32 -> f16, round to nearest even (what F16C's vcvtps2ph and torch's .half() do). */
static inline uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds past 65504: infinity */
    if (ax < 0x38800000u) { /* below 2^-14: a subnormal f16; adding 0.5 rounds to its 2^-24 grid */
        float a, r;
        uint32_t ri;
        memcpy(&a, &ax, 4);
        r = a + 0.5f;
        memcpy(&ri, &r, 4);
        return (uint16_t)(sign | (ri - 0x3f000000u));
    }
    /* rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even */
    return (uint16_t)(sign | ((ax + 0xc8000fffu + ((ax >> 13) & 1u)) >> 13));
}

static void store_f16(uint16_t *dst, const float *src, int n) {
    for (int i = f32_to_f16_vec(dst, src, n); i < n; i++) dst[i] = f32_to_f16(src[i]);
}

/* ---------------------------------------------------------------- the step */

/* Floats of workspace ds4k_llama_step needs when a layer holds at most `ctx` K/V rows. */
static int64_t llama_workspace(const ds4k_llama *m, int64_t ctx) {
    const int64_t h = m->hidden, d = m->head_dim, hq = m->n_heads, hkv = m->n_kv_heads;
    (void)ctx; /* attention keeps its blocks' parts itself (attn.c) */
    int64_t wide = (hq + 2 * hkv) * d;
    if (2 * (int64_t)m->inter > wide) wide = 2 * (int64_t)m->inter;
    return 3 * h + wide + hq * d + m->inter;
}

/* Run `token` at position pos. kv[i] is layer i's K/V buffer [2 (K, V), Hkv, rows[i], D],
 * float or f16 when kv_f16: a global layer's rows are positions (valid below pos on entry),
 * a sliding layer's a ring holding position p at slot p % rows[i] (the caller makes rows[i]
 * min(window, context), so the live rows are exactly the window). Writes the token's K/V
 * rows (global layers' not with DS4K_STEP_FROZEN_GLOBAL), and logits [vocab] unless logits
 * is NULL (then the last layer stops after its K/V, as llama.py does). Returns 0, or -1 for
 * bad arguments or shapes. */
static int llama_step(const ds4k_llama *m, void *const *kv, const int64_t *rows, int kv_f16, int64_t pos,
                      int32_t token, int flags, float *logits, float *ws, int nth) {
    const int hdim = m->hidden, d = m->head_dim, hq = m->n_heads, hkv = m->n_kv_heads, f = m->inter;
    if (pos < 0 || pos >= m->rope_rows || token < 0 || token >= m->vocab) return -1;
    if (hkv <= 0 || hq % hkv || hq / hkv > MAX_GROUP || d > MAX_HEAD_DIM || d % 2) return -1;
    if (m->act != DS4K_ACT_SILU && m->act != DS4K_ACT_GELU_TANH) return -1;
    for (int i = 0; i < m->n_layers; i++)
        if (kv[i] == NULL || rows[i] <= 0 || (!m->layers[i].sliding && pos >= rows[i])) return -1;
    float *x = ws, *hb = x + hdim, *tmp = hb + hdim;
    float *wide = tmp + hdim;                    /* qkv [(Hq + 2 Hkv) D] or gate|up [2F] */
    const int64_t nqkv = (int64_t)(hq + 2 * hkv) * d;
    int64_t wide_n = nqkv > 2 * (int64_t)f ? nqkv : 2 * (int64_t)f;
    float *att = wide + wide_n, *act = att + hq * d;
    const int64_t rope_off = pos * (d / 2);
    const float scale = m->attn_scale > 0.0f ? m->attn_scale : 1.0f / sqrtf((float)d);

    memcpy(x, m->embed + (int64_t)token * hdim, sizeof(float) * (size_t)hdim);
    if (m->embed_scale != 1.0f)
        for (int e = 0; e < hdim; e++) x[e] *= m->embed_scale;
    for (int i = 0; i < m->n_layers; i++) {
        const ds4k_layer *L = &m->layers[i];
        const int64_t cap = rows[i];
        const int64_t slot = L->sliding ? pos % cap : pos;
        const int64_t plane = (int64_t)hkv * cap * d; /* one of K or V of this layer */
        float *kc = (float *)kv[i], *vc = kc + plane;
        uint16_t *kch = (uint16_t *)kv[i], *vch = kch + plane;
        const float *cos_row = (L->sliding ? m->local_cos : m->rope_cos) + rope_off;
        const float *sin_row = (L->sliding ? m->local_sin : m->rope_sin) + rope_off;
        rms_norm(hb, x, L->attn_norm, hdim, m->eps);
        if (gemv(L->qkv, nparts_of(L->qkv), hb, wide, hdim, nth)) return -1;
        if (L->bqkv)
            for (int64_t e = 0; e < nqkv; e++) wide[e] += L->bqkv[e];
        if (L->q_norm) /* per head, before RoPE; in place (rms_norm reads all of x first) */
            for (int h = 0; h < hq + hkv; h++)
                rms_norm(wide + h * d, wide + h * d, h < hq ? L->q_norm : L->k_norm, d, m->eps);
        for (int h = 0; h < hq + hkv; h++) rope(wide + h * d, cos_row, sin_row, d);
        if (L->sliding || !(flags & DS4K_STEP_FROZEN_GLOBAL)) {
            for (int h = 0; h < hkv; h++) {
                const int64_t row = ((int64_t)h * cap + slot) * d;
                if (kv_f16) {
                    store_f16(kch + row, wide + (hq + h) * d, d);
                    store_f16(vch + row, wide + (hq + hkv + h) * d, d);
                } else {
                    memcpy(kc + row, wide + (hq + h) * d, sizeof(float) * (size_t)d);
                    memcpy(vc + row, wide + (hq + hkv + h) * d, sizeof(float) * (size_t)d);
                }
            }
        }
        if (i == m->n_layers - 1 && logits == NULL) return 0;
        /* One query over the rows in the buffer: positions 0..pos of a global layer, the last
         * `cap` positions of a ring (its window: every live slot), which attn() hands to its
         * decode kernel. */
        const void *kl = kv_f16 ? (const void *)kch : (const void *)kc, *vl = kv_f16 ? (const void *)vch : (const void *)vc;
        if (attn(wide, (int64_t)hq * d, att, (int64_t)hq * d, kl, vl, cap * d, cap, kl, 0, 0, vl, 0, 0, kv_f16, 1, pos,
                 pos + 1, L->sliding ? cap : 0, hq, hkv, d, scale, 0, nth))
            return -1;
        if (gemv(&L->o, 1, att, tmp, (int64_t)hq * d, nth)) return -1;
        if (L->post_attn_norm) rms_norm(tmp, tmp, L->post_attn_norm, hdim, m->eps);
        for (int e = 0; e < hdim; e++) x[e] += tmp[e];
        rms_norm(hb, x, L->ffn_norm, hdim, m->eps);
        if (gemv(L->w13, nparts_of(L->w13), hb, wide, hdim, nth)) return -1;
        if (m->act == DS4K_ACT_GELU_TANH) geglu(act, wide, wide + f, f);
        else swiglu(act, wide, wide + f, f);
        if (gemv(&L->w2, 1, act, tmp, f, nth)) return -1;
        if (L->post_ffn_norm) rms_norm(tmp, tmp, L->post_ffn_norm, hdim, m->eps);
        for (int e = 0; e < hdim; e++) x[e] += tmp[e];
    }
    rms_norm(hb, x, m->norm, hdim, m->eps);
    if (gemv(&m->head, 1, hb, logits, hdim, nth)) return -1;
    if (m->softcap > 0.0f) softcap(logits, m->vocab, m->softcap);
    return 0;
}
