/* ds4k.h: what the kernel sources share (internal; Python sees only the exports of dispatch.c).
 *
 * Weight types use GGML's ids, so a GGUF tensor's type maps through unchanged. A weight
 * is row-major [rows, cols]; quant types pack 32 (or 256 for K-quants) weights per block
 * along a row, so a block never spans two rows.
 *
 * Build layout: isa.c (which includes dequant.c, qgemv.c, qgemm.c, attn.c, llama_step.c, rows.c, chunk.c, finite.c
 * and qdot.c) is
 * compiled once per instruction set, with DS4K_ISA = 0 (portable C), 1 (AVX2+FMA+F16C) or
 * 2 (AVX-512 F/BW/VL on top), each into its own ds4k_ops table; pool.c and dispatch.c are
 * compiled once without vector flags, and dispatch.c picks a table per call. Each ISA's
 * intrinsics are in its own files: simd_<isa>.h (types and small helpers, through simd.h) and
 * vec_<isa>.h (the vector parts of shared loops, through vec.h).
 */
#ifndef DS4K_H
#define DS4K_H

#include <stdint.h>
#include <string.h>

#define DS4K_F32 0
#define DS4K_F16 1
#define DS4K_Q4_0 2
#define DS4K_Q4_1 3
#define DS4K_Q5_0 6
#define DS4K_Q5_1 7
#define DS4K_Q8_0 8
#define DS4K_Q2_K 10
#define DS4K_Q4_K 12
#define DS4K_Q5_K 13
#define DS4K_Q6_K 14
#define DS4K_IQ2_XXS 16
#define DS4K_BF16 30

/* Weights per block and bytes per block of a type; 0 for a type the kernels do not read. */
static inline int ds4k_block_weights(int type) {
    switch (type) {
    case DS4K_F32: case DS4K_F16: case DS4K_BF16: return 1;
    case DS4K_Q4_0: case DS4K_Q4_1: case DS4K_Q5_0: case DS4K_Q5_1: case DS4K_Q8_0: return 32;
    case DS4K_Q2_K: case DS4K_Q4_K: case DS4K_Q5_K: case DS4K_Q6_K: case DS4K_IQ2_XXS: return 256;
    default: return 0;
    }
}

static inline int ds4k_block_bytes(int type) {
    switch (type) {
    case DS4K_F32: return 4;
    case DS4K_F16: case DS4K_BF16: return 2;
    case DS4K_Q4_0: return 18;
    case DS4K_Q4_1: return 20;
    case DS4K_Q5_0: return 22;
    case DS4K_Q5_1: return 24;
    case DS4K_Q8_0: return 34;
    case DS4K_Q2_K: return 84;
    case DS4K_Q4_K: return 144;
    case DS4K_Q5_K: return 176;
    case DS4K_Q6_K: return 210;
    case DS4K_IQ2_XXS: return 66;
    default: return 0;
    }
}

/* Bytes per row of `cols` weights; 0 for an unknown type or a row that is not whole blocks. */
static inline int64_t ds4k_row_bytes(int type, int64_t cols) {
    int qk = ds4k_block_weights(type);
    if (qk == 0 || cols <= 0 || cols % qk) return 0;
    return cols / qk * ds4k_block_bytes(type);
}

/* One matrix, or one row-stacked part of a fused one (a fused QKV whose V rows have another
 * type than Q and K, as in Q4_K_M files, is three parts). rows == 0: no part. */
typedef struct {
    const void *w;
    int32_t type;
    int32_t rows;
} ds4k_mat;

#define DS4K_MAX_PARTS 3

/* f16 / bf16 -> f32. The scalar conversion is exact for every f16 (subnormals renormalized,
 * inf/nan kept), as numpy's astype(float32) is. */
static inline uint16_t ds4k_rd16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }

static inline float ds4k_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: renormalize */
            int e = -1;
            do { e++; man <<= 1; } while (!(man & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline float ds4k_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline float ds4k_h2f(const uint8_t *p) { return ds4k_f16_to_f32(ds4k_rd16(p)); }

#define DS4K_HIDDEN __attribute__((visibility("hidden")))
#define DS4K_EXPORT __attribute__((visibility("default")))

/* Every exported entry point takes the caller's configuration word first (no library-wide
 * setting: two threads may run different variants, tests pin what they compare): the ISA
 * variant in the low byte (DS4K_ISA numbering), DS4K_CFG_BF16 for long products and deep
 * attention in bf16 (qgemm.c, attn.c: the AVX-512 build on a CPU with AVX512_BF16 only).
 * dispatch.c refuses a word this CPU cannot run; inside a variant the bf16 choice travels
 * as an argument. Compilers without the bf16 intrinsics build no such path. */
#define DS4K_CFG_ISA_MASK 0xff
#define DS4K_CFG_BF16 0x100
#if defined(__x86_64__) && ((defined(__clang__) && __clang_major__ >= 9) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 10))
#define DS4K_HAVE_BF16 1
#else
#define DS4K_HAVE_BF16 0
#endif

/* Runs fn(ctx, c) for every c in [0, nchunks) on up to nth threads (the caller included).
 * Which thread runs a chunk never changes a result: callers split work into chunks whose
 * bounds depend only on the problem size, so outputs are bit-identical for any nth. */
typedef void (*ds4k_chunk_fn)(void *ctx, int64_t chunk);
DS4K_HIDDEN void ds4k_run_chunks(ds4k_chunk_fn fn, void *ctx, int64_t nchunks, int nth);

/* The llama-family model table llama_step.c reads (mirrored by llama_step.py's ctypes classes).
 * Optional parts are NULL when the architecture has none (a plain llama: all of them). */
typedef struct {
    const float *attn_norm, *ffn_norm; /* [H] */
    ds4k_mat qkv[DS4K_MAX_PARTS];      /* [(Hq + 2 Hkv) D, H] in row parts: q rows, k rows, v rows */
    ds4k_mat o;                        /* [H, Hq D] */
    ds4k_mat w13[DS4K_MAX_PARTS];      /* [2 F, H] in row parts: gate rows, up rows */
    ds4k_mat w2;                       /* [H, F] */
    const float *bqkv;                 /* [(Hq + 2 Hkv) D] q/k/v biases (Qwen 2) */
    const float *q_norm, *k_norm;      /* [D] per-head RMSNorm weights of q and k (Qwen 3, Gemma 3) */
    const float *post_attn_norm;       /* [H] norm of the attention output (Gemma 3) */
    const float *post_ffn_norm;        /* [H] norm of the FFN output (Gemma 3) */
    int32_t sliding;                   /* 1: local RoPE tables, K/V rows as a ring */
    int32_t reserved;
} ds4k_layer;

#define DS4K_ACT_SILU 0      /* SwiGLU */
#define DS4K_ACT_GELU_TANH 1 /* GeGLU with the tanh GELU */

typedef struct {
    int32_t n_layers, hidden, inter, n_heads, n_kv_heads, head_dim, vocab, rope_rows;
    float eps;
    float embed_scale;                  /* embedding rows times this (1: none) */
    float attn_scale;                   /* q times this before q.k; 0: 1/sqrt(D) */
    float softcap;                      /* logits -> softcap * tanh(logits / softcap); 0: none */
    int32_t act;                        /* DS4K_ACT_* */
    int32_t window;                     /* sliding layers' window W (their rings hold min(W, context) rows); 0: none */
    const float *embed;                 /* fp32 [vocab, H] */
    const float *norm;                  /* [H] */
    ds4k_mat head;                      /* [vocab, H] */
    const float *rope_cos, *rope_sin;   /* [rope_rows, D/2]: global layers */
    const float *local_cos, *local_sin; /* [rope_rows, D/2]: sliding layers */
    const ds4k_layer *layers;
} ds4k_llama;

/* ds4k_llama_step flags. */
#define DS4K_STEP_FROZEN_GLOBAL 1 /* global layers read their rows and write none (a replay) */

/* One instruction set's entry points (isa.c fills one per build; dispatch.c picks one). */
typedef struct {
    int (*gemv)(const ds4k_mat *parts, int nparts, const float *x, float *y, int64_t cols, int nth);
    int (*gemm)(const ds4k_mat *parts, int nparts, const float *x, float *y, int64_t cols, int64_t n, int bf16,
                int nth);
    int (*dequant)(int type, const void *w, float *out, int64_t rows, int64_t cols);
    int (*llama_step)(const ds4k_llama *m, void *const *kv, const int64_t *rows, int kv_f16, int64_t pos,
                      int32_t token, int flags, float *logits, float *ws, int nth);
    int64_t (*llama_workspace)(const ds4k_llama *m, int64_t ctx);
    int (*attn)(const float *q, int64_t ldq, float *o, int64_t ldo, const void *k, const void *v, int64_t hs,
                int64_t cap, const void *kn, int64_t hsn, int64_t rsn, const void *vn, int64_t hsv, int64_t rsv,
                int kv_f16, int64_t s,
                int64_t qpos0, int64_t kbase, int64_t window, int hq, int hkv, int d, float scale, int bf16, int nth);
    int (*glu)(const float *gu, int64_t ld, float *out, int64_t rows, int64_t f, int gelu, int nth);
    int (*rms_norm)(const float *x, int64_t ld, const float *w, float *out, int64_t rows, int64_t n, float eps, int nth);
    int (*qk_rope)(const float *x, int64_t ld, const float *w, float eps, const float *cos, const float *sin,
                   float *out, int64_t rows, int64_t heads, int64_t d, int nth);
    int (*llama_layer)(const ds4k_llama *m, int layer, void *kv, int64_t ctx, int kv_f16, int64_t pos, int64_t s,
                       float *x, int flags, const float *qk_norm, float scale, float *ws, int bf16, int nth);
    int64_t (*llama_layer_workspace)(const ds4k_llama *m, int64_t s);
    int (*all_finite)(const void *p, int64_t n, int elem_bytes);
    int (*qdot_gemm)(const ds4k_mat *parts, int nparts, const float *x, float *y, int64_t cols, int64_t n, int nth);
    int (*qdot_quantize)(int kind, const float *x, void *out, int64_t n);
} ds4k_ops;

DS4K_HIDDEN extern const ds4k_ops ds4k_ops_scalar;
#if defined(__x86_64__)
DS4K_HIDDEN extern const ds4k_ops ds4k_ops_avx2;
DS4K_HIDDEN extern const ds4k_ops ds4k_ops_avx512;
#endif

#endif
