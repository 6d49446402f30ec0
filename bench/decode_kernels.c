/* decode_kernels.c: one thread's CPU time in two parts of the AVX-512 decode step, with random data.
 *
 * Build and run from the repo root (the kernels' sources are compiled in, AVX-512 variant):
 *   cc -O3 -std=c11 -D_GNU_SOURCE -ffp-contract=off -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl \
 *      -Ids4tui/engine/kernels bench/decode_kernels.c ds4tui/engine/kernels/pool.c -o /tmp/decode_kernels -lpthread -lm
 *   /tmp/decode_kernels head [STRIDE]    Gemma 3's tied head, 262,144 x 640 Q8_0 (178 MB), its pool chunks
 *                                        run in order (STRIDE 1) or as one of STRIDE threads meets them
 *                                        (every STRIDE-th chunk, then the next offset)
 *   With -I pointing at another checkout's ds4tui/engine/kernels, the same runs time that build.
 *   /tmp/decode_kernels attn [HQ HKV D N LAYERS [THREADS]]   decode attention over N f16 K/V
 *                                        rows per layer (default SmolLM2's shape: 9 3 64 4096 30, 1 thread)
 * Prints the best of the repeats in ms and in GB/s of weights or K/V read. CPU time of the
 * calling thread, so other processes on a shared machine do not inflate it; attention with
 * THREADS > 1 runs on the kernels' pool and is timed in wall time instead.
 */
#define DS4K_ISA 2
#define DS4K_OPS_NAME ds4k_ops_avx512
#include "isa.c"

#include <stdio.h>
#include <time.h>

#ifndef CHUNK_MAX /* kernel sources from before large matrices got larger chunks (A/B builds: -I elsewhere) */
#define CHUNK_MAX CHUNK_BYTES
#endif

static int wall_clock; /* 1: time with CLOCK_MONOTONIC (runs on the pool) */
static double cpu_s(void) {
    struct timespec t;
    clock_gettime(wall_clock ? CLOCK_MONOTONIC : CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static uint64_t rng = 88172645463325252ull;
static uint32_t next_u32(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)rng;
}

static int bench_head(int stride) {
    const int64_t rows = 262144, cols = 640, rb = ds4k_row_bytes(DS4K_Q8_0, cols);
    const size_t bytes = (size_t)(rows * rb);
    uint8_t *w = malloc(bytes);
    float *x = malloc(sizeof(float) * cols), *y = malloc(sizeof(float) * rows);
    if (!w || !x || !y || stride < 1) return 1;
    for (size_t i = 0; i < bytes; i++) w[i] = (uint8_t)next_u32();
    for (size_t i = 0; i < bytes; i += 34) w[i] = 0x00, w[i + 1] = 0x20; /* scale 2^-7: no NaN/inf */
    for (int64_t i = 0; i < cols; i++) x[i] = (float)(next_u32() % 1000) / 1000.0f - 0.5f;
    ds4k_mat m = {w, DS4K_Q8_0, (int32_t)rows};
    /* the chunks gemv() would make (its setup, for one part) */
    gemv_job job = {.parts = &m, .nparts = 1, .x = x, .xs = x, .y = y, .cols = cols};
    int64_t cb = rows * rb / 128;
    cb = cb < CHUNK_BYTES ? CHUNK_BYTES : cb > CHUNK_MAX ? CHUNK_MAX : cb;
    int64_t nchunks = ((rows * rb + cb - 1) / cb + 1) & ~(int64_t)1;
    job.chunk_rows[0] = ((rows + nchunks - 1) / nchunks + 1) & ~(int64_t)1;
    job.first[1] = (rows + job.chunk_rows[0] - 1) / job.chunk_rows[0];
    double best = 1e9;
    for (int it = 0; it < 20; it++) {
        const double t0 = cpu_s();
        for (int s = 0; s < stride; s++)
            for (int64_t c = s; c < job.first[1]; c += stride) gemv_chunk(&job, c);
        const double t = cpu_s() - t0;
        if (t < best) best = t;
    }
    printf("Q8_0 head 262144 x 640, %lld chunks of %lld rows, chunk stride %d: %.3f ms, %.1f GB/s (y[0] %g)\n",
           (long long)job.first[1], (long long)job.chunk_rows[0], stride, best * 1e3, bytes / best / 1e9, y[0]);
    return 0;
}

static int bench_attention(int hq, int hkv, int d, int64_t n, int layers, int nth) {
    wall_clock = nth > 1;
    if (nth < 1 || hkv <= 0 || hq % hkv || hq / hkv > MAX_GROUP || d > MAX_HEAD_DIM || n <= 0 || layers <= 0) return 1;
    const int64_t ctx = n + 64, plane = (int64_t)hkv * ctx * d;
    uint16_t **kv = malloc(sizeof(uint16_t *) * layers);
    float *q = malloc(sizeof(float) * hq * d), *att = malloc(sizeof(float) * hq * d);
    if (!kv || !q || !att) return 1;
    for (int l = 0; l < layers; l++) {
        if (!(kv[l] = malloc(sizeof(uint16_t) * 2 * plane))) return 1;
        for (int64_t i = 0; i < 2 * plane; i++) kv[l][i] = (uint16_t)(0x3000 + (next_u32() & 0x7ff)); /* 0.125..1 */
    }
    for (int i = 0; i < hq * d; i++) q[i] = (float)(next_u32() % 1000) / 4000.0f;
    double best = 1e9;
    for (int it = 0; it < 10; it++) {
        const double t0 = cpu_s();
        for (int l = 0; l < layers; l++)
            if (attn_decode(q, att, kv[l], kv[l] + plane, ctx * d, 1, n, hq, hkv, d, 1.0f, nth)) return 1;
        const double t = cpu_s() - t0;
        if (t < best) best = t;
    }
    const double bytes = (double)layers * 2 * hkv * n * d * 2;
    printf("attention %d/%d heads, D %d, %lld f16 rows x %d layers, %d thread(s): %.3f ms, %.1f GB/s of K/V (att[0] %g)\n",
           hq, hkv, d, (long long)n, layers, nth, best * 1e3, bytes / best / 1e9, att[0]);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "head")) return bench_head(argc > 2 ? atoi(argv[2]) : 1);
    if (argc >= 2 && !strcmp(argv[1], "attn"))
        return bench_attention(argc > 2 ? atoi(argv[2]) : 9, argc > 3 ? atoi(argv[3]) : 3, argc > 4 ? atoi(argv[4]) : 64,
                    argc > 5 ? atoll(argv[5]) : 4096, argc > 6 ? atoi(argv[6]) : 30, argc > 7 ? atoi(argv[7]) : 1);
    fprintf(stderr, "usage: decode_kernels head [STRIDE] | attn [HQ HKV D N LAYERS [THREADS]]\n");
    return 2;
}
