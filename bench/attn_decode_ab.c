/* attn_decode_ab.c: one query's attention through attn.c's two kernels, the decode one (what
 * attn() runs for a decode step) and the chunk one, on the same rows: which is faster for a shape.
 *
 * Build and run from the repo root (the kernels' sources are compiled in; DS4K_ISA 1 is the
 * AVX2 variant, 2 the AVX-512 one with -mavx512f -mavx512bw -mavx512vl added):
 *   cc -O3 -std=c11 -D_GNU_SOURCE -ffp-contract=off -DDS4K_ISA=1 -mavx2 -mfma -mf16c \
 *      -Ids4tui/engine/kernels bench/attn_decode_ab.c ds4tui/engine/kernels/pool.c -o /tmp/attn_decode_ab -lpthread -lm
 *   /tmp/attn_decode_ab HQ HKV D N LAYERS [THREADS]   e.g. 9 3 64 4096 30 (SmolLM2), 4 1 256 4096 3 (Gemma 3)
 * One call per layer over that layer's own f16 rows (N per KV head, so a deep context comes
 * from memory as in a real step), best of 15 repeats of all layers; CPU time of the calling
 * thread with THREADS 1 (what other processes on a shared machine do not inflate), wall time
 * otherwise. The chunk kernel is asked for the same query with its own row passed as a "new"
 * row (kbase = position), which attn() never hands to the decode kernel. Prints both times,
 * their ratio and the largest difference of the outputs.
 */
#ifndef DS4K_ISA
#define DS4K_ISA 1
#endif
#if DS4K_ISA == 2
#define DS4K_OPS_NAME ds4k_ops_avx512
#else
#define DS4K_OPS_NAME ds4k_ops_avx2
#endif
#include "isa.c"

#include <stdio.h>
#include <time.h>

static double now_s(int wall) {
    struct timespec t;
    clock_gettime(wall ? CLOCK_MONOTONIC : CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: %s HQ HKV D N LAYERS [THREADS]\n", argv[0]);
        return 2;
    }
    const int hq = atoi(argv[1]), hkv = atoi(argv[2]), d = atoi(argv[3]), layers = atoi(argv[5]);
    const int64_t n = atoll(argv[4]);
    const int nth = argc > 6 ? atoi(argv[6]) : 1;
    const size_t plane = (size_t)hkv * n * d;
    uint16_t **kv = malloc(sizeof(uint16_t *) * layers);
    for (int l = 0; l < layers; l++) {
        kv[l] = malloc(2 * plane * sizeof(uint16_t));
        for (size_t i = 0; i < 2 * plane; i++) kv[l][i] = f32_to_f16((float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f);
    }
    float *q = malloc(sizeof(float) * hq * d), *a = malloc(sizeof(float) * hq * d), *b = malloc(sizeof(float) * hq * d);
    for (int i = 0; i < hq * d; i++) q[i] = (float)((i * 7919) % 100) / 100.0f - 0.5f;
    const float scale = 1.0f / sqrtf((float)d);
    const int64_t pos = n - 1, hs = n * d;
    double best_decode = 1e9, best_chunk = 1e9;
    for (int rep = 0; rep < 15; rep++) {
        const double t0 = now_s(nth > 1);
        for (int l = 0; l < layers; l++)
            if (attn(q, hq * d, a, hq * d, kv[l], kv[l] + plane, hs, n, kv[l], 0, 0, kv[l] + plane, 0, 0, 1, 1, pos,
                     pos + 1, 0, hq, hkv, d, scale, 0, nth))
                return 1;
        const double t1 = now_s(nth > 1);
        for (int l = 0; l < layers; l++)
            if (attn(q, hq * d, b, hq * d, kv[l], kv[l] + plane, hs, n, kv[l] + pos * d, hs, d, kv[l] + plane + pos * d,
                     hs, d, 1, 1, pos, pos, 0, hq, hkv, d, scale, 0, nth))
                return 1;
        const double t2 = now_s(nth > 1);
        if (t1 - t0 < best_decode) best_decode = t1 - t0;
        if (t2 - t1 < best_chunk) best_chunk = t2 - t1;
    }
    float diff = 0.0f;
    for (int i = 0; i < hq * d; i++) diff = fmaxf(diff, fabsf(a[i] - b[i]));
    printf("%d/%d heads of %d, %lld rows, %d layers, %d thread(s), ISA %d: decode kernel %.3f ms, chunk kernel %.3f ms "
           "(chunk/decode %.2f), largest difference %.1e\n",
           hq, hkv, d, (long long)n, layers, nth, DS4K_ISA, best_decode * 1e3, best_chunk * 1e3, best_chunk / best_decode,
           diff);
    return 0;
}
