/* The worker threads of cpu_kernels.c: runs fn over [0, n) in chunks, the calling thread included.
 *
 * Why not OpenMP: a parallel region ends in a barrier that waits for every thread of the team, so on a
 * shared machine one worker that the scheduler has parked stalls each call by a time slice (measured:
 * 2-thread decode at 4.6 tok/s under load 4, against 70 with one thread). Here a call is done when all
 * of its chunks are, whoever ran them: the caller claims chunks as the workers do, so a parked worker
 * costs at most the chunk it holds, and a process without its workers (a fork) still finishes alone.
 * Idle workers spin a while (the next call usually comes within microseconds), then sleep.
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

typedef void (*range_fn)(const void *ctx, int64_t begin, int64_t end, int slot);

#define MAX_WORKERS 63
#define SPINS 300000 /* pause instructions before sleeping (libgomp spins as many) */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static int workers;             /* started, under mu */
static atomic_uint_fast64_t job; /* generation of the current call */
static atomic_int sleepers;
static atomic_flag running = ATOMIC_FLAG_INIT; /* a call in flight: a concurrent one runs on its own thread */
static atomic_int_fast64_t done; /* items of the current call finished */
/* the current call, read and claimed under mu */
static range_fn job_fn;
static const void *job_ctx;
static int64_t job_n, job_chunk, job_next;
static int job_threads;

/* The next chunk of call `gen` for `slot`: 0 when that call has none left (or is over). */
static int claim(uint64_t gen, int slot, range_fn *fn, const void **ctx, int64_t *begin, int64_t *end) {
    pthread_mutex_lock(&mu);
    const int ok = atomic_load(&job) == gen && slot < job_threads && job_next < job_n;
    if (ok) {
        *fn = job_fn, *ctx = job_ctx, *begin = job_next;
        job_next = job_next + job_chunk < job_n ? job_next + job_chunk : job_n;
        *end = job_next;
    }
    pthread_mutex_unlock(&mu);
    return ok;
}

static void work(uint64_t gen, int slot) {
    range_fn fn;
    const void *ctx;
    int64_t begin, end;
    while (claim(gen, slot, &fn, &ctx, &begin, &end)) {
        fn(ctx, begin, end, slot);
        atomic_fetch_add(&done, end - begin);
    }
}

static void *worker(void *arg) {
    const int slot = (int)(intptr_t)arg;
    uint64_t seen = atomic_load(&job);
    for (;;) {
        uint64_t gen;
        for (int spin = 0; (gen = atomic_load_explicit(&job, memory_order_acquire)) == seen; spin++) {
            if (spin < SPINS) {
                _mm_pause();
                continue;
            }
            pthread_mutex_lock(&mu);
            atomic_fetch_add(&sleepers, 1);
            while (atomic_load(&job) == seen) pthread_cond_wait(&wake, &mu);
            atomic_fetch_sub(&sleepers, 1);
            pthread_mutex_unlock(&mu);
            spin = 0;
        }
        seen = gen;
        work(gen, slot);
    }
    return NULL;
}

/* fn(ctx, begin, end, slot) over [0, n) in chunks of `chunk`, on up to `threads` threads (slot < threads). */
void pool_run(range_fn fn, const void *ctx, int64_t n, int64_t chunk, int threads) {
    if (threads <= 1 || n <= chunk || atomic_flag_test_and_set(&running)) {
        fn(ctx, 0, n, 0);
        return;
    }
    pthread_mutex_lock(&mu);
    while (workers < threads - 1 && workers < MAX_WORKERS) {
        pthread_t thread;
        if (pthread_create(&thread, NULL, worker, (void *)(intptr_t)(workers + 1)) != 0) break;
        pthread_detach(thread);
        workers++;
    }
    job_fn = fn, job_ctx = ctx, job_n = n, job_chunk = chunk, job_next = 0, job_threads = threads;
    atomic_store(&done, 0);
    const uint64_t gen = atomic_fetch_add(&job, 1) + 1;
    pthread_mutex_unlock(&mu);
    if (atomic_load(&sleepers) > 0) {
        pthread_mutex_lock(&mu);
        pthread_cond_broadcast(&wake);
        pthread_mutex_unlock(&mu);
    }
    work(gen, 0);
    while (atomic_load_explicit(&done, memory_order_acquire) < n) _mm_pause(); /* chunks still with workers */
    atomic_flag_clear(&running);
}
