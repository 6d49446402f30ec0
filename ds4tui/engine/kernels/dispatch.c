/* dispatch.c: the library's exported entry points, routed to one ISA's kernels per call.
 *
 * Owns: which ds4k_ops table runs a call (isa.c builds one per instruction set), named by
 * the configuration word every entry point takes first (ds4k.h: DS4K_CFG_*), and what this
 * CPU runs (__builtin_cpu_supports, read once when the library loads). The library holds no
 * setting of its own: a thread's choice of variant and of bf16 products is its caller's
 * (qgemv.py keeps it per thread), so two threads using different variants cannot switch each
 * other's. A word this CPU cannot run is refused (-1) before any kernel starts. Leaves to
 * callers: argument checks, the DS4TUI_KERNELS / DS4TUI_BF16 defaults and serializing calls
 * (pool.c runs one job at a time).
 */

#include <stdint.h>

#include "ds4k.h"

enum { ISA_SCALAR = 0, ISA_AVX2 = 1, ISA_AVX512 = 2 };

static int cpu_has(int isa) {
    if (isa == ISA_SCALAR) return 1;
#if defined(__x86_64__)
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    /* F16C has no __builtin_cpu_supports name in older compilers; every AVX2 CPU has it. */
    if (isa == ISA_AVX2) return avx2;
    if (isa == ISA_AVX512)
        return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl");
#endif
    return 0;
}

static int cpu_has_bf16(void) {
#if defined(__x86_64__) && DS4K_HAVE_BF16
    return __builtin_cpu_supports("avx512bf16");
#else
    return 0;
#endif
}

/* What this CPU runs, written once by the loader (constructors run before dlopen returns,
 * so before any call can read them) and never again. */
static int cpu_isa, cpu_bf16;

__attribute__((constructor)) static void detect_cpu(void) {
#if defined(__x86_64__)
    __builtin_cpu_init(); /* a constructor must call it before __builtin_cpu_supports */
#endif
    cpu_isa = ISA_SCALAR;
    for (int isa = ISA_AVX512; isa > ISA_SCALAR; isa--)
        if (cpu_has(isa)) {
            cpu_isa = isa;
            break;
        }
    cpu_bf16 = cpu_has_bf16();
}

static const ds4k_ops *table(int isa) {
#if defined(__x86_64__)
    if (isa == ISA_AVX512) return &ds4k_ops_avx512;
    if (isa == ISA_AVX2) return &ds4k_ops_avx2;
#endif
    return &ds4k_ops_scalar;
}

/* The table of configuration word `cfg` and its bf16 choice (*bf16: 1 only with the AVX-512
 * variant, whose build alone has bf16 tiles); NULL for a word this CPU cannot run. */
static const ds4k_ops *ops(int cfg, int *bf16) {
    const int isa = cfg & DS4K_CFG_ISA_MASK, want_bf16 = (cfg & DS4K_CFG_BF16) != 0;
    if ((cfg & ~(DS4K_CFG_ISA_MASK | DS4K_CFG_BF16)) || isa > cpu_isa || (want_bf16 && !cpu_bf16)) return NULL;
    *bf16 = want_bf16 && isa == ISA_AVX512;
    return table(isa);
}

/* The widest ISA this CPU runs: 2 AVX-512, 1 AVX2+FMA, 0 portable C. */
DS4K_EXPORT int ds4k_best_isa(void) { return cpu_isa; }

/* 1 when the CPU (and the compiler that built this library) has AVX512_BF16. */
DS4K_EXPORT int ds4k_cpu_bf16(void) { return cpu_bf16; }

/* Bumped when an entry point changes signature or meaning; qgemv.py checks it. */
DS4K_EXPORT int ds4k_abi(void) { return 8; }

/* build.py's key of the sources and flags this library was built from (-DDS4K_SOURCE_KEY):
 * qgemv.py loads a prebuilt library only when it matches the sources beside it. */
#ifndef DS4K_SOURCE_KEY
#define DS4K_SOURCE_KEY ""
#endif
DS4K_EXPORT const char *ds4k_source_key(void) { return DS4K_SOURCE_KEY; }

DS4K_EXPORT int ds4k_row_bytes_of(int type, int64_t cols) { return (int)ds4k_row_bytes(type, cols); }

/* Each entry point: cfg first (DS4K_CFG_*), -1 for a word this CPU cannot run. */
#define ROUTE(cfg, call)                                  \
    do {                                                  \
        int bf16;                                         \
        const ds4k_ops *route_ops = ops((cfg), &bf16);    \
        if (route_ops == NULL) return -1;                 \
        (void)bf16;                                       \
        return route_ops->call;                           \
    } while (0)

/* y[rows] = W x, W the parts stacked by rows (each ds4k_mat: blocks, type, rows). */
DS4K_EXPORT int ds4k_gemv(int cfg, const ds4k_mat *parts, int nparts, const float *x, float *y, int64_t cols, int nth) {
    ROUTE(cfg, gemv(parts, nparts, x, y, cols, nth));
}

/* Y[n, rows] = X[n, cols] W^T. */
DS4K_EXPORT int ds4k_gemm(int cfg, const ds4k_mat *parts, int nparts, const float *x, float *y, int64_t cols,
                          int64_t n, int nth) {
    ROUTE(cfg, gemm(parts, nparts, x, y, cols, n, bf16, nth));
}

/* out[rows, cols] = the weights, bit-identical to gguf.quants.dequantize. */
DS4K_EXPORT int ds4k_dequant(int cfg, int type, const void *w, float *out, int64_t rows, int64_t cols) {
    ROUTE(cfg, dequant(type, w, out, rows, cols));
}

DS4K_EXPORT int64_t ds4k_llama_workspace(int cfg, const ds4k_llama *m, int64_t ctx) {
    ROUTE(cfg, llama_workspace(m, ctx));
}

/* kv[i], rows[i]: layer i's K/V buffer [2, Hkv, rows[i], D] (a sliding layer's ring: row of
 * position p at p % rows[i]). flags: DS4K_STEP_*. */
DS4K_EXPORT int ds4k_llama_step(int cfg, const ds4k_llama *m, void *const *kv, const int64_t *rows, int kv_f16,
                                int64_t pos, int32_t token, int flags, float *logits, float *ws, int nth) {
    ROUTE(cfg, llama_step(m, kv, rows, kv_f16, pos, token, flags, logits, ws, nth));
}

/* Causal grouped attention of S query positions over KV rows in place (attn.c). */
DS4K_EXPORT int ds4k_attn(int cfg, const float *q, int64_t ldq, float *o, int64_t ldo, const void *k, const void *v,
                          int64_t hs, int64_t cap, const void *kn, int64_t hsn, int64_t rsn, const void *vn,
                          int64_t hsv, int64_t rsv, int kv_f16, int64_t s, int64_t qpos0, int64_t kbase,
                          int64_t window, int hq, int hkv, int d, float scale, int nth) {
    ROUTE(cfg, attn(q, ldq, o, ldo, k, v, hs, cap, kn, hsn, rsn, vn, hsv, rsv, kv_f16, s, qpos0, kbase, window, hq,
                    hkv, d, scale, bf16, nth));
}

/* out = act(gate) * up over the rows of a gate|up product (rows.c). */
DS4K_EXPORT int ds4k_glu(int cfg, const float *gu, int64_t ld, float *out, int64_t rows, int64_t f, int gelu,
                         int nth) {
    ROUTE(cfg, glu(gu, ld, out, rows, f, gelu, nth));
}

/* RMSNorm of rows (rows.c). */
DS4K_EXPORT int ds4k_rms_norm(int cfg, const float *x, int64_t ld, const float *w, float *out, int64_t rows, int64_t n,
                              float eps, int nth) {
    ROUTE(cfg, rms_norm(x, ld, w, out, rows, n, eps, nth));
}

/* Per-head RMSNorm (optional) and RoPE of the q/k heads of a fused product (rows.c). */
DS4K_EXPORT int ds4k_qk_rope(int cfg, const float *x, int64_t ld, const float *w, float eps, const float *cos,
                             const float *sin, float *out, int64_t rows, int64_t heads, int64_t d, int nth) {
    ROUTE(cfg, qk_rope(x, ld, w, eps, cos, sin, out, rows, heads, d, nth));
}

/* One llama layer of a chunk of S tokens, x [S, H] in place (chunk.c); kv: this layer's
 * [2, Hkv, ctx, D] buffer. */
DS4K_EXPORT int ds4k_llama_layer(int cfg, const ds4k_llama *m, int layer, void *kv, int64_t ctx, int kv_f16,
                                 int64_t pos, int64_t s, float *x, int flags, const float *qk_norm, float scale,
                                 float *ws, int nth) {
    ROUTE(cfg, llama_layer(m, layer, kv, ctx, kv_f16, pos, s, x, flags, qk_norm, scale, ws, bf16, nth));
}

DS4K_EXPORT int64_t ds4k_llama_layer_workspace(int cfg, const ds4k_llama *m, int64_t s) {
    ROUTE(cfg, llama_layer_workspace(m, s));
}

/* 1 when the n values at p (f16: elem_bytes 2, f32: 4) are all finite, 0 when one is NaN or
 * infinite, -1 for another element size or a word this CPU cannot run (finite.c). */
DS4K_EXPORT int ds4k_all_finite(int cfg, const void *p, int64_t n, int elem_bytes) {
    ROUTE(cfg, all_finite(p, n, elem_bytes));
}

/* Y[n, rows] = X[n, cols] W^T with each row of X quantized to 8 bits (Q8_K for Q2_K,
 * IQ2_XXS and Q4_K parts, ds4's Q8A for Q8_0) and integer block dot products (qdot.c);
 * -1 when a part's type has no integer path. */
DS4K_EXPORT int ds4k_qdot_gemm(int cfg, const ds4k_mat *parts, int nparts, const float *x, float *y, int64_t cols,
                               int64_t n, int nth) {
    ROUTE(cfg, qdot_gemm(parts, nparts, x, y, cols, n, nth));
}

/* x[n] as the activation blocks qdot uses: kind 1 Q8_K (292 bytes per 256), 2 Q8A (36 per 32). */
DS4K_EXPORT int ds4k_qdot_quantize(int cfg, int kind, const float *x, void *out, int64_t n) {
    ROUTE(cfg, qdot_quantize(kind, x, out, n));
}
