/* dispatch.c: the library's exported entry points, routed to one ISA's kernels.
 *
 * Owns: which ds4k_ops table runs (isa.c builds one per instruction set), chosen at load
 * as the widest the CPU supports (__builtin_cpu_supports) and changeable with
 * ds4k_set_isa, which refuses a set the CPU lacks. Leaves to callers (qgemv.py): argument
 * checks, the DS4TUI_KERNELS override and serializing calls (a switch between calls is safe;
 * during one it is not).
 */

#include <stdint.h>

#include "ds4k.h"

enum { ISA_SCALAR = 0, ISA_AVX2 = 1, ISA_AVX512 = 2 };

static int cpu_has(int isa) {
    if (isa == ISA_SCALAR) return 1;
#if defined(__x86_64__)
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    /* F16C has no __builtin_cpu_supports name in older compilers; every AVX2 CPU has it. */
    if (isa == ISA_AVX2) return avx2;
    if (isa == ISA_AVX512)
        return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl");
#endif
    return 0;
}

static const ds4k_ops *table(int isa) {
#if defined(__x86_64__)
    if (isa == ISA_AVX512) return &ds4k_ops_avx512;
    if (isa == ISA_AVX2) return &ds4k_ops_avx2;
#endif
    return &ds4k_ops_scalar;
}

static int cpu_has_bf16(void) {
#if defined(__x86_64__) && DS4K_HAVE_BF16
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16");
#else
    return 0;
#endif
}

int ds4k_bf16_products = -1; /* -1: not decided yet (on where the CPU has it) */

static int active = -1;
DS4K_EXPORT int ds4k_best_isa(void);

static const ds4k_ops *ops(void) {
    if (active < 0) active = ds4k_best_isa();
    if (ds4k_bf16_products < 0) ds4k_bf16_products = cpu_has_bf16();
    return table(active);
}

/* The widest ISA this CPU runs: 2 AVX-512, 1 AVX2+FMA, 0 portable C. */
DS4K_EXPORT int ds4k_best_isa(void) {
    for (int isa = ISA_AVX512; isa > ISA_SCALAR; isa--)
        if (cpu_has(isa)) return isa;
    return ISA_SCALAR;
}

/* Use `isa` from now on; -1 (and no change) when the CPU cannot run it. */
DS4K_EXPORT int ds4k_set_isa(int isa) {
    if (isa < ISA_SCALAR || isa > ISA_AVX512 || !cpu_has(isa)) return -1;
    active = isa;
    return 0;
}

/* Long products in bf16 (1) or fp32 (0) from now on (the AVX-512 variant only); -1 and no
 * change when asked for bf16 on a CPU (or compiler) without AVX512_BF16. */
DS4K_EXPORT int ds4k_set_bf16(int on) {
    if (on && !cpu_has_bf16()) return -1;
    ds4k_bf16_products = on ? 1 : 0;
    return 0;
}

/* 1 when the CPU (and the compiler that built this library) has AVX512_BF16. */
DS4K_EXPORT int ds4k_cpu_bf16(void) { return cpu_has_bf16(); }

/* 1 when bf16 is on (long products take the bf16 tiles while the AVX-512 variant is active). */
DS4K_EXPORT int ds4k_bf16(void) {
    (void)ops();
    return ds4k_bf16_products == 1;
}

DS4K_EXPORT int ds4k_isa(void) {
    (void)ops();
    return active;
}

/* Bumped when an entry point changes signature or meaning; qgemv.py checks it. */
DS4K_EXPORT int ds4k_abi(void) { return 7; }

/* build.py's key of the sources and flags this library was built from (-DDS4K_SOURCE_KEY):
 * qgemv.py loads a prebuilt library only when it matches the sources beside it. */
#ifndef DS4K_SOURCE_KEY
#define DS4K_SOURCE_KEY ""
#endif
DS4K_EXPORT const char *ds4k_source_key(void) { return DS4K_SOURCE_KEY; }

DS4K_EXPORT int ds4k_row_bytes_of(int type, int64_t cols) { return (int)ds4k_row_bytes(type, cols); }

/* y[rows] = W x, W the parts stacked by rows (each ds4k_mat: blocks, type, rows). */
DS4K_EXPORT int ds4k_gemv(const ds4k_mat *parts, int nparts, const float *x, float *y, int64_t cols, int nth) {
    return ops()->gemv(parts, nparts, x, y, cols, nth);
}

/* Y[n, rows] = X[n, cols] W^T. */
DS4K_EXPORT int ds4k_gemm(const ds4k_mat *parts, int nparts, const float *x, float *y, int64_t cols, int64_t n,
                          int nth) {
    return ops()->gemm(parts, nparts, x, y, cols, n, nth);
}

/* out[rows, cols] = the weights, bit-identical to gguf.quants.dequantize. */
DS4K_EXPORT int ds4k_dequant(int type, const void *w, float *out, int64_t rows, int64_t cols) {
    return ops()->dequant(type, w, out, rows, cols);
}

DS4K_EXPORT int64_t ds4k_llama_workspace(const ds4k_llama *m, int64_t ctx) { return ops()->llama_workspace(m, ctx); }

/* kv[i], rows[i]: layer i's K/V buffer [2, Hkv, rows[i], D] (a sliding layer's ring: row of
 * position p at p % rows[i]). flags: DS4K_STEP_*. */
DS4K_EXPORT int ds4k_llama_step(const ds4k_llama *m, void *const *kv, const int64_t *rows, int kv_f16, int64_t pos,
                                int32_t token, int flags, float *logits, float *ws, int nth) {
    return ops()->llama_step(m, kv, rows, kv_f16, pos, token, flags, logits, ws, nth);
}

/* Causal grouped attention of S query positions over KV rows in place (attn.c). */
DS4K_EXPORT int ds4k_attn(const float *q, int64_t ldq, float *o, int64_t ldo, const void *k, const void *v, int64_t hs,
                          int64_t cap, const void *kn, int64_t hsn, int64_t rsn, const void *vn, int64_t hsv, int64_t rsv,
                int kv_f16, int64_t s,
                          int64_t qpos0, int64_t kbase, int64_t window, int hq, int hkv, int d, float scale, int nth) {
    return ops()->attn(q, ldq, o, ldo, k, v, hs, cap, kn, hsn, rsn, vn, hsv, rsv, kv_f16, s, qpos0, kbase, window, hq,
                       hkv, d, scale, nth);
}

/* out = act(gate) * up over the rows of a gate|up product (rows.c). */
DS4K_EXPORT int ds4k_glu(const float *gu, int64_t ld, float *out, int64_t rows, int64_t f, int gelu, int nth) {
    return ops()->glu(gu, ld, out, rows, f, gelu, nth);
}

/* RMSNorm of rows (rows.c). */
DS4K_EXPORT int ds4k_rms_norm(const float *x, int64_t ld, const float *w, float *out, int64_t rows, int64_t n, float eps,
                              int nth) {
    return ops()->rms_norm(x, ld, w, out, rows, n, eps, nth);
}

/* Per-head RMSNorm (optional) and RoPE of the q/k heads of a fused product (rows.c). */
DS4K_EXPORT int ds4k_qk_rope(const float *x, int64_t ld, const float *w, float eps, const float *cos, const float *sin,
                             float *out, int64_t rows, int64_t heads, int64_t d, int nth) {
    return ops()->qk_rope(x, ld, w, eps, cos, sin, out, rows, heads, d, nth);
}

/* One llama layer of a chunk of S tokens, x [S, H] in place (chunk.c); kv: this layer's
 * [2, Hkv, ctx, D] buffer. */
DS4K_EXPORT int ds4k_llama_layer(const ds4k_llama *m, int layer, void *kv, int64_t ctx, int kv_f16, int64_t pos,
                                 int64_t s, float *x, int flags, const float *qk_norm, float scale, float *ws, int nth) {
    return ops()->llama_layer(m, layer, kv, ctx, kv_f16, pos, s, x, flags, qk_norm, scale, ws, nth);
}

DS4K_EXPORT int64_t ds4k_llama_layer_workspace(const ds4k_llama *m, int64_t s) {
    return ops()->llama_layer_workspace(m, s);
}

/* 1 when the n values at p (f16: elem_bytes 2, f32: 4) are all finite, 0 when one is NaN or
 * infinite, -1 for another element size (finite.c). */
DS4K_EXPORT int ds4k_all_finite(const void *p, int64_t n, int elem_bytes) { return ops()->all_finite(p, n, elem_bytes); }
