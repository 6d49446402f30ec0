/* chunk.c: one layer of the llama forward for a chunk of S tokens, in a single call.
 *
 * Owns: llama_layer, the sequence llama/model.py's forward runs per layer for a chunk
 * (RMSNorm, the fused q/k/v product and its biases, per-head q/k norm and RoPE, the
 * chunk's K/V rows written into the session's buffer, attention, the output product, the
 * post-attention norm, the residual, RMSNorm, the gate/up product, the gated activation,
 * the down product, the post-FFN norm, the residual), calling the very kernels that
 * forward calls (gemm, rms_norm_rows, qk_rope, attn, glu), in the same order and with the
 * same arguments, so its results are bit-identical to it. What it saves is the forward's
 * ~15 Python and torch calls per layer between them: ~2 ms of a 29 ms forward of 18 tokens
 * on SmolLM2, all of it on the critical path while the pool's other threads wait
 * (docs/perf-archive.md, "The short forward in C").
 *
 * A sliding layer (Gemma 3's local layers) keeps its K/V as a ring of `rows` slots (position
 * p at slot p % rows): as in the forward, the chunk's rows (rounded to the buffer's type) are
 * kept aside, attention reads the ring for positions below the chunk and those rows for the
 * chunk's own, and only then do the chunk's last rows go into the ring.
 *
 * Leaves to callers (llama_step.py's FastDecoder.layer, the forward): the embedding, the
 * final norm and the head, the before-layer hook of a restore, and choosing this path (every
 * product through the file's blocks, the same parts as the forward's Linear.blocks; not a
 * replay's frozen global layers). x [S, H] is updated in place; with LAYER_LAST_ROW only its
 * last row is (the last layer when logits are wanted: no other row is read after it).
 */

#define LAYER_KV_ONLY 1  /* write the chunk's K/V rows and stop (the last layer, no logits) */
#define LAYER_LAST_ROW 2 /* after the K/V rows, only the last position goes on */

/* Floats of workspace llama_layer needs for a chunk of s rows. */
static int64_t llama_layer_workspace(const ds4k_llama *m, int64_t s) {
    const int64_t h = m->hidden, d = m->head_dim, nq = (int64_t)m->n_heads * d;
    const int64_t nqkv = nq + 2 * (int64_t)m->n_kv_heads * d, nqk = nq + (int64_t)m->n_kv_heads * d;
    /* h (normed x), qkv, qk (roped), att, o, gu, a; a sliding layer's new K and V rows */
    return s * (h + nqkv + nqk + nq + h + 2 * (int64_t)m->inter + m->inter + 2 * (int64_t)m->n_kv_heads * d);
}

static void add_rows(float *x, const float *o, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = x[i] + o[i];
}

/* x += o for n rows, o first normalized by `post_norm` (into `scratch`) where the layer has one. */
static int residual(const ds4k_llama *m, float *x, const float *o, const float *post_norm, float *scratch, int64_t n,
                    int nth) {
    if (post_norm) {
        int rc = rms_norm_rows(o, m->hidden, post_norm, scratch, n, m->hidden, m->eps, nth);
        if (rc) return rc;
        o = scratch;
    }
    add_rows(x, o, n * m->hidden);
    return 0;
}

/* The chunk's K/V rows of one head plane: row r of src (stride lds) to buffer row pos + r. */
static void write_rows(void *plane, int64_t pos, const float *src, int64_t lds, int64_t s, int d, int f16) {
    for (int64_t r = 0; r < s; r++) {
        if (f16)
            store_f16((uint16_t *)plane + (pos + r) * d, src + r * lds, d);
        else
            memcpy((float *)plane + (pos + r) * d, src + r * lds, (size_t)d * sizeof(float));
    }
}

/* The last min(s, rows) of the chunk's rows kn, vn ([Hkv][S][D], the buffer's type) into a
 * sliding layer's ring: position p at slot p % rows. */
static void ring_write(char *kb, char *vb, const char *kn, const char *vn, int64_t hkv, int64_t rows, int64_t d,
                       int64_t es, int64_t pos, int64_t s) {
    const int64_t keep = s < rows ? s : rows, row = d * es;
    for (int64_t g = 0; g < hkv; g++)
        for (int64_t r = s - keep; r < s; r++) {
            const int64_t slot = (pos + r) % rows;
            memcpy(kb + (g * rows + slot) * row, kn + (g * s + r) * row, (size_t)row);
            memcpy(vb + (g * rows + slot) * row, vn + (g * s + r) * row, (size_t)row);
        }
}

/* kv: this layer's buffer [2, Hkv, rows, D] (K planes, then V planes): a global layer's
 * context (rows >= pos + s) or a sliding layer's ring. */
static int llama_layer(const ds4k_llama *m, int li, void *kv, int64_t rows, int kv_f16, int64_t pos, int64_t s,
                       float *x, int flags, const float *qk_norm, float scale, float *ws, int bf16, int nth) {
    if (li < 0 || li >= m->n_layers || s <= 0 || pos < 0 || rows <= 0 || pos + s > m->rope_rows) return -1;
    const ds4k_layer *L = &m->layers[li];
    if (L->sliding ? m->window <= 0 : pos + s > rows) return -1;
    const int64_t H = m->hidden, d = m->head_dim, F = m->inter, hq = m->n_heads, hkv = m->n_kv_heads;
    const int64_t nq = hq * d, nqk = (hq + hkv) * d, nqkv = nqk + hkv * d;
    float *h = ws, *qkv = h + s * H, *qk = qkv + s * nqkv, *att = qk + s * nqk, *o = att + s * nq;
    float *gu = o + s * H, *a = gu + s * 2 * F, *fresh = a + s * F;
    int rc;

    if ((rc = rms_norm_rows(x, H, L->attn_norm, h, s, H, m->eps, nth))) return rc;
    if ((rc = gemm(L->qkv, nparts_of(L->qkv), h, qkv, H, s, bf16, nth))) return rc;
    if (L->bqkv)
        for (int64_t r = 0; r < s; r++) add_rows(qkv + r * nqkv, L->bqkv, nqkv);
    const int64_t rope_off = pos * (d / 2);
    const float *cos = (L->sliding ? m->local_cos : m->rope_cos) + rope_off;
    const float *sin = (L->sliding ? m->local_sin : m->rope_sin) + rope_off;
    if ((rc = qk_rope(qkv, nqkv, qk_norm, m->eps, cos, sin, qk, s, hq + hkv, d, nth))) return rc;

    const int64_t es = kv_f16 ? 2 : 4, plane = rows * d;
    char *kb = (char *)kv, *vb = kb + hkv * plane * es;
    const int64_t end = pos + s, first = (flags & LAYER_LAST_ROW) ? s - 1 : 0, n = s - first;
    float *xr = x + first * H;
    if (!L->sliding) {
        /* the chunk's rows into the context, then attention reads every key from there */
        for (int64_t g = 0; g < hkv; g++) {
            write_rows(kb + g * plane * es, pos, qk + nq + g * d, nqk, s, (int)d, kv_f16);
            write_rows(vb + g * plane * es, pos, qkv + nqk + g * d, nqkv, s, (int)d, kv_f16);
        }
        if (flags & LAYER_KV_ONLY) return 0;
        if ((rc = attn(qk + first * nqk, nqk, att, nq, kb, vb, plane, rows, kb, 0, 0, vb, 0, 0, kv_f16, n, end - n, end,
                       0, (int)hq, (int)hkv, (int)d, scale, bf16, nth)))
            return rc;
    } else {
        /* the chunk's rows aside ([Hkv][S][D]); the ring is read before they overwrite it */
        char *kn = (char *)fresh, *vn = kn + hkv * s * d * es;
        for (int64_t g = 0; g < hkv; g++) {
            write_rows(kn + g * s * d * es, 0, qk + nq + g * d, nqk, s, (int)d, kv_f16);
            write_rows(vn + g * s * d * es, 0, qkv + nqk + g * d, nqkv, s, (int)d, kv_f16);
        }
        if (!(flags & LAYER_KV_ONLY) &&
            (rc = attn(qk + first * nqk, nqk, att, nq, kb, vb, plane, rows, kn, s * d, d, vn, s * d, d, kv_f16, n,
                       end - n, pos, m->window, (int)hq, (int)hkv, (int)d, scale, bf16, nth)))
            return rc;
        ring_write(kb, vb, kn, vn, hkv, rows, d, es, pos, s);
        if (flags & LAYER_KV_ONLY) return 0;
    }
    if ((rc = gemm(&L->o, 1, att, o, nq, n, bf16, nth))) return rc;
    if ((rc = residual(m, xr, o, L->post_attn_norm, h, n, nth))) return rc;
    if ((rc = rms_norm_rows(xr, H, L->ffn_norm, h, n, H, m->eps, nth))) return rc;
    if ((rc = gemm(L->w13, nparts_of(L->w13), h, gu, H, n, bf16, nth))) return rc;
    if ((rc = glu(gu, 2 * F, a, n, F, m->act == DS4K_ACT_GELU_TANH, nth))) return rc;
    if ((rc = gemm(&L->w2, 1, a, o, F, n, bf16, nth))) return rc;
    return residual(m, xr, o, L->post_ffn_norm, h, n, nth);
}
