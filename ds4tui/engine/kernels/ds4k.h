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
