/* ds4k.h: what the kernel sources share (internal; Python sees only the ds4k_* exports).
 *
 * Weight types use GGML's ids, so a GGUF tensor's type maps through unchanged. A weight
 * is row-major [rows, cols]; quant types pack 32 weights per block along a row.
 */
#ifndef DS4K_H
#define DS4K_H

#include <stdint.h>

#define DS4K_F32 0
#define DS4K_F16 1
#define DS4K_Q4_1 3
#define DS4K_Q8_0 8

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define DS4K_AVX2 1
#include <immintrin.h>
#else
#define DS4K_AVX2 0
#endif

#include <string.h>

/* f16 helpers shared by the kernels. The scalar conversion is exact for every
 * f16 (subnormals renormalized, inf/nan kept); ds4k_h2f uses the F16C instruction
 * when the vector build has it (same results). */
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

static inline float ds4k_h2f(const uint8_t *p) {
#if DS4K_AVX2
    return _cvtsh_ss(ds4k_rd16(p));
#else
    return ds4k_f16_to_f32(ds4k_rd16(p));
#endif
}

#define DS4K_HIDDEN __attribute__((visibility("hidden")))

/* Runs fn(ctx, c) for every c in [0, nchunks) on up to nth threads (the caller included).
 * Which thread runs a chunk never changes a result: callers split work into chunks whose
 * bounds depend only on the problem size, so outputs are bit-identical for any nth. */
typedef void (*ds4k_chunk_fn)(void *ctx, int64_t chunk);
DS4K_HIDDEN void ds4k_run_chunks(ds4k_chunk_fn fn, void *ctx, int64_t nchunks, int nth);

/* y[rows] = W[rows, cols] x[cols]; 0 on success, -1 for an unsupported type or shape. */
DS4K_HIDDEN int ds4k_gemv(int type, const void *w, const float *x, float *y, int64_t rows,
                          int64_t cols, int nth);

#endif
