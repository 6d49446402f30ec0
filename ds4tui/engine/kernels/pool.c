/* pool.c: the kernels' thread pool (ds4k_run_chunks).
 *
 * Owns: a few worker threads, started on first parallel call and never stopped, that
 * share one job at a time with the calling thread. Leaves to callers: serializing calls
 * (qgemv.py holds a lock around every entry point) and splitting work into chunks.
 *
 * A job is split into chunks that threads claim from a shared counter; the caller works
 * too and waits only for chunks already claimed. So a worker that the OS has not
 * scheduled yet (the machine is shared, 2 cores) never holds the caller up: the caller
 * just does its chunks. Claims carry the job's generation in the same 64-bit word
 * (gen << 32 | next chunk), so a worker that wakes late cannot claim a chunk of a job
 * that has already finished; and a finished job's word is closed (next chunk CLAIM_CLOSED)
 * before the next job's fields are written, so a worker preempted between loading the word
 * and its bounds check cannot claim a chunk by the next job's count (which ran a chunk of
 * the next job early and twice, and let the caller return before it was done). Idle
 * workers spin briefly, because decode posts the next job within microseconds, then sleep
 * on a condition variable: an idle app costs no CPU.
 */

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "ds4k.h"

#define MAX_THREADS 64
#define CLAIM_CLOSED 0xffffffffu /* next-chunk value of a finished job: above any chunk count */



static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* idle workers wait here for a job */
    pthread_cond_t cv_done; /* the caller waits here for the last claimed chunks */
    _Atomic uint64_t claim; /* gen << 32 | next unclaimed chunk */
    atomic_long done;       /* chunks finished in the current job */
    atomic_int sleeping;    /* workers inside (or entering) cond_wait */
    atomic_int caller_waits; /* the caller is inside (or entering) cond_wait on cv_done */
    ds4k_chunk_fn fn;
    void *ctx;
    int64_t nchunks;
    int nth;                /* threads of the current job: workers 1..nth-1 take part */
    int nworkers;
} pool = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER,
          .cv_done = PTHREAD_COND_INITIALIZER};

static pthread_mutex_t pool_start_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_long spin_ns = 300000; /* how long an idle worker spins before sleeping */
/* Threads of this process busy with other work for a while (a disk hit's reader, which
 * copies, hashes and checks the file's rows alongside the message's forward): jobs run on
 * that many fewer threads meanwhile. With every core in the job, one of them shares its core
 * with the reader, and the job's other threads wait for the chunks it claimed; measured on 2
 * cores, a hot disk hit of 4K tokens took ~2.5 ms longer that way (docs/perf-archive.md). */
static atomic_int reserved_threads;
/* How long the caller spins on chunks another thread still runs before sleeping. Sleeping
 * frees its core, so a preempted worker can be moved there (the machine is shared: other
 * processes, and the app's own UI thread, compete for 2 cores). */
#define CALLER_SPIN_NS 30000
#ifndef YIELD_AFTER_NS
#define YIELD_AFTER_NS 50000
#endif

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Claim and run chunks of job `gen` until none is left or the job is gone. */
static void work_on(uint32_t gen) {
    for (;;) {
        uint64_t c = atomic_load(&pool.claim);
        if ((uint32_t)(c >> 32) != gen || (int64_t)(uint32_t)c >= pool.nchunks) return;
        if (!atomic_compare_exchange_weak(&pool.claim, &c, c + 1)) continue;
        /* The claim succeeded, so this job cannot finish (nor fn/ctx change) before this
         * chunk is counted done. */
        pool.fn(pool.ctx, (int64_t)(uint32_t)c);
        if (atomic_fetch_add(&pool.done, 1) + 1 == pool.nchunks && atomic_load(&pool.caller_waits)) {
            pthread_mutex_lock(&pool.mu);
            pthread_cond_signal(&pool.cv_done);
            pthread_mutex_unlock(&pool.mu);
        }
    }
}

static void *worker_main(void *arg) {
    const int index = (int)(intptr_t)arg; /* 1..: the caller is thread 0 */
    uint32_t seen = (uint32_t)(atomic_load(&pool.claim) >> 32);
    for (;;) {
        int64_t t0 = now_ns();
        int spins = 0;
        uint32_t gen;
        while ((gen = (uint32_t)(atomic_load(&pool.claim) >> 32)) == seen) {
            cpu_relax();
            if (++spins % 256 != 0) continue;
            int64_t idle = now_ns() - t0;
            /* Within a step the next job comes within microseconds. A longer gap means
             * the caller is between tokens or preempted (the machine is shared): then
             * give the core away, the caller may be queued right here. */
            if (idle > YIELD_AFTER_NS) sched_yield();
            if (idle > atomic_load(&spin_ns)) {
                pthread_mutex_lock(&pool.mu);
                atomic_fetch_add(&pool.sleeping, 1);
                while ((uint32_t)(atomic_load(&pool.claim) >> 32) == seen)
                    pthread_cond_wait(&pool.cv, &pool.mu);
                atomic_fetch_sub(&pool.sleeping, 1);
                pthread_mutex_unlock(&pool.mu);
            }
        }
        seen = gen;
        if (index < pool.nth) work_on(gen);
    }
    return NULL;
}

/* Start workers up to nworkers (never shrinks). Returns workers live. */
static int pool_ensure(int nworkers) {
    if (nworkers > MAX_THREADS - 1) nworkers = MAX_THREADS - 1;
    pthread_mutex_lock(&pool_start_mu);
    while (pool.nworkers < nworkers) {
        pthread_t th;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&th, &attr, worker_main, (void *)(intptr_t)(pool.nworkers + 1));
        pthread_attr_destroy(&attr);
        if (rc != 0) break;
        pool.nworkers++;
    }
    int n = pool.nworkers;
    pthread_mutex_unlock(&pool_start_mu);
    return n;
}

void ds4k_run_chunks(ds4k_chunk_fn fn, void *ctx, int64_t nchunks, int nth) {
    const int reserved = atomic_load(&reserved_threads);
    if (reserved > 0) nth = nth - reserved < 1 ? 1 : nth - reserved;
    if (nth > 1) pool_ensure(nth - 1);
    if (nth <= 1 || pool.nworkers == 0 || nchunks <= 1) {
        for (int64_t c = 0; c < nchunks; c++) fn(ctx, c);
        return;
    }
    pool.fn = fn;
    pool.ctx = ctx;
    pool.nchunks = nchunks;
    pool.nth = nth;
    atomic_store(&pool.done, 0);
    uint32_t gen = (uint32_t)(atomic_load(&pool.claim) >> 32) + 1;
    atomic_store(&pool.claim, (uint64_t)gen << 32); /* publishes fn/ctx/nchunks (seq_cst) */
    if (atomic_load(&pool.sleeping) > 0) {
        pthread_mutex_lock(&pool.mu);
        pthread_cond_broadcast(&pool.cv);
        pthread_mutex_unlock(&pool.mu);
    }
    work_on(gen);
    int64_t t0 = 0;
    for (int spins = 0; atomic_load(&pool.done) < nchunks; spins++) {
        cpu_relax();
        if (spins % 64 != 63) continue;
        if (t0 == 0) t0 = now_ns();
        if (now_ns() - t0 < CALLER_SPIN_NS) continue;
        pthread_mutex_lock(&pool.mu);
        atomic_store(&pool.caller_waits, 1);
        while (atomic_load(&pool.done) < nchunks) pthread_cond_wait(&pool.cv_done, &pool.mu);
        atomic_store(&pool.caller_waits, 0);
        pthread_mutex_unlock(&pool.mu);
    }
    /* Close the job before the next one's fields are written: a worker that loaded the last
     * claim word and was preempted before its bounds check would otherwise compare it with
     * the next job's chunk count and win its CAS on this job's word. */
    atomic_store(&pool.claim, ((uint64_t)gen << 32) | CLAIM_CLOSED);
}

DS4K_EXPORT void ds4k_set_spin_ns(long ns) { atomic_store(&spin_ns, ns < 0 ? 0 : ns); }
/* delta > 0 when such work starts, -delta when it ends. */
DS4K_EXPORT void ds4k_reserve_threads(int delta) { atomic_fetch_add(&reserved_threads, delta); }
DS4K_EXPORT int ds4k_reserved_threads(void) { return atomic_load(&reserved_threads); }
