/* fma_peak.c: the FMA peak of this machine's cores (docs/perf-archive.md, "The machine's FMA peak").
 *
 *   cc -O2 -mavx512f -mfma bench/fma_peak.c -o /tmp/fma_peak -lpthread && /tmp/fma_peak 2
 *
 * Each thread runs 10 independent chains of 512-bit FMAs (enough to fill two pipes of
 * 4-cycle latency) and reports GFLOP/s of its own CPU time, so time spent descheduled on a
 * shared machine does not count; GFLOP/s / 64 is the clock the core ran at (2 FMA pipes x
 * 16 lanes x 2 FLOP per cycle).
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define STEPS 400000000L
#define CHAINS 10

static double cpu_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *run(void *out) {
    const __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
    __m512 a0 = _mm512_set1_ps(.1f), a1 = _mm512_set1_ps(.2f), a2 = _mm512_set1_ps(.3f), a3 = _mm512_set1_ps(.4f),
           a4 = _mm512_set1_ps(.5f), a5 = _mm512_set1_ps(.6f), a6 = _mm512_set1_ps(.7f), a7 = _mm512_set1_ps(.8f),
           a8 = _mm512_set1_ps(.9f), a9 = _mm512_set1_ps(.15f);
    double t0 = cpu_s();
    for (long k = 0; k < STEPS; k++) {
        a0 = _mm512_fmadd_ps(a0, x, y), a1 = _mm512_fmadd_ps(a1, x, y), a2 = _mm512_fmadd_ps(a2, x, y);
        a3 = _mm512_fmadd_ps(a3, x, y), a4 = _mm512_fmadd_ps(a4, x, y), a5 = _mm512_fmadd_ps(a5, x, y);
        a6 = _mm512_fmadd_ps(a6, x, y), a7 = _mm512_fmadd_ps(a7, x, y), a8 = _mm512_fmadd_ps(a8, x, y);
        a9 = _mm512_fmadd_ps(a9, x, y);
    }
    double gflops = (double)STEPS * CHAINS * 32 / (cpu_s() - t0) / 1e9;
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                             _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(_mm512_add_ps(a6, a7), _mm512_add_ps(a8, a9))));
    printf("thread: %.1f GFLOP/s of its CPU time (%.2f GHz x 64 FLOP/cycle) [%g]\n", gflops, gflops / 64,
           (double)_mm512_reduce_add_ps(s));
    *(double *)out = gflops;
    return NULL;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1;
    if (n < 1 || n > 64) return 1;
    pthread_t th[64];
    double g[64], total = 0;
    for (int i = 0; i < n; i++) pthread_create(&th[i], NULL, run, &g[i]);
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL), total += g[i];
    printf("%d threads: %.1f GFLOP/s peak\n", n, total);
    return 0;
}
