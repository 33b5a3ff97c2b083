/* tensorvm's parallel-for for the library products (tv_gemm.h, tv_vgemm.h): the caller takes unstarted work.

   tv_pool_run(chunks, threads, fn, ctx) runs fn(ctx, i) for every chunk i in [0, chunks) on the calling
   thread and up to threads - 1 pool workers. Unlike an OpenMP parallel region, whose end is a barrier
   that waits until every thread of the team has been scheduled, the caller claims chunks itself from the
   same counter as the workers and returns once every chunk is done: a worker whose core is busy with
   another process (and that has therefore not started) costs nothing, the caller does its chunks. Only
   a chunk a worker has already claimed is waited for, so chunks are kept small (a few per thread).

   Workers spin for TV_POOL_SPIN_NS after their last job (the gap between the kernel calls of one
   inference, like GOMP_SPINCOUNT for the OpenMP threads), then sleep on a condition variable; the
   caller wakes sleepers only when there are some.

   The job is one 64-bit word, generation << 32 | next chunk, so a worker that read an older job can
   never claim a chunk of a newer one (its compare-and-swap fails once the generation moves on). A job is
   published in three steps: the word is closed (the new generation, chunk TV_POOL_CLOSED), the job's
   function, context and chunk count are written, then the word opens at chunk 0. A claim reads the
   word, then the job, then swaps the word to the next chunk: if the job it read was not the word's, the
   word was closed before and the swap fails. All of it with sequentially consistent atomics.

   One pool per library (weak hidden symbols shared by the library's translation units). A nested call
   (from a chunk), or a call while another thread of the process runs a job on this pool, runs serially.
   After a fork the child starts with no workers. Shared libraries only (tv_gemm.h includes it, after
   defining tv_now_ns). */
#ifndef TV_POOL_H
#define TV_POOL_H

#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#define TV_POOL_MAX_WORKERS 255
#define TV_POOL_CLOSED 0xffffffffu
#ifndef TV_POOL_SPIN_NS
#define TV_POOL_SPIN_NS 20000
#endif

typedef void (*tv_pool_fn)(void* ctx, int64_t chunk);

typedef struct {
  uint64_t word;          /* generation << 32 | next chunk */
  tv_pool_fn fn;
  void* ctx;
  int64_t chunks;
  int64_t done;           /* chunks finished, of the current job */
  int32_t team;           /* threads the current job may use (caller included) */
  int32_t busy;           /* a caller is running a job */
  int32_t started;        /* workers started */
  int32_t sleepers;
  uint32_t sequence;      /* bumped once per job: what sleeping workers wait on */
  int32_t pid;            /* the process that started the workers */
  pthread_mutex_t lock;
  pthread_cond_t wake;
} tv_pool_state;

__attribute__((weak, visibility("hidden"))) tv_pool_state tv_pool = {
  .lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};
/* How many chunks the callers ran themselves and how many the workers ran (tv_pool_stats). */
__attribute__((weak, visibility("hidden"))) int64_t tv_pool_caller_chunks, tv_pool_worker_chunks, tv_pool_jobs;

#define TV_POOL_LOAD(p) __atomic_load_n((p), __ATOMIC_SEQ_CST)
#define TV_POOL_STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)
#define TV_POOL_ADD(p, v) __atomic_add_fetch((p), (v), __ATOMIC_SEQ_CST)

static inline void tv_pool_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* Claim and run chunks of the current job until none is left or the job changed; returns how many ran. */
__attribute__((weak, visibility("hidden"))) int64_t tv_pool_work(void) {
  int64_t ran = 0;
  for (;;) {
    const uint64_t word = TV_POOL_LOAD(&tv_pool.word);
    const uint32_t next = (uint32_t)word;
    if (next == TV_POOL_CLOSED) return ran;
    const tv_pool_fn fn = TV_POOL_LOAD(&tv_pool.fn);
    void* const ctx = TV_POOL_LOAD(&tv_pool.ctx);
    const int64_t chunks = TV_POOL_LOAD(&tv_pool.chunks);
    if ((int64_t)next >= chunks) return ran;
    uint64_t expected = word;
    if (!__atomic_compare_exchange_n(&tv_pool.word, &expected, word + 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
      continue;
    fn(ctx, (int64_t)next);
    TV_POOL_ADD(&tv_pool.done, 1);
    ++ran;
  }
}

__attribute__((weak, visibility("hidden"))) void* tv_pool_worker(void* arg) {
  const int32_t index = (int32_t)(intptr_t)arg;  /* 1 .. workers: the caller is 0 */
  uint32_t seen = TV_POOL_LOAD(&tv_pool.sequence);
  for (;;) {
    const int64_t start = tv_now_ns();
    int spins = 0;
    while (TV_POOL_LOAD(&tv_pool.sequence) == seen) {
      tv_pool_relax();
      if (++spins % 64 == 0 && tv_now_ns() - start > TV_POOL_SPIN_NS) {
        pthread_mutex_lock(&tv_pool.lock);
        TV_POOL_ADD(&tv_pool.sleepers, 1);
        while (TV_POOL_LOAD(&tv_pool.sequence) == seen) pthread_cond_wait(&tv_pool.wake, &tv_pool.lock);
        TV_POOL_ADD(&tv_pool.sleepers, -1);
        pthread_mutex_unlock(&tv_pool.lock);
      }
    }
    seen = TV_POOL_LOAD(&tv_pool.sequence);
    if (index < TV_POOL_LOAD(&tv_pool.team)) {
      const int64_t ran = tv_pool_work();
      if (ran) TV_POOL_ADD(&tv_pool_worker_chunks, ran);
    }
  }
  return NULL;
}

/* Start workers until there are `want` (fewer if the system refuses threads); returns how many there are. */
static int32_t tv_pool_start(int32_t want) {
  if (tv_pool.pid != (int32_t)getpid()) {  /* a forked child: the parent's workers do not exist here */
    tv_pool.started = 0, tv_pool.sleepers = 0;
    tv_pool.pid = (int32_t)getpid();
  }
  while (tv_pool.started < want && tv_pool.started < TV_POOL_MAX_WORKERS) {
    pthread_t thread;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    const int failed = pthread_create(&thread, &attr, tv_pool_worker, (void*)(intptr_t)(tv_pool.started + 1));
    pthread_attr_destroy(&attr);
    if (failed) break;
    ++tv_pool.started;
  }
  return tv_pool.started;
}

/* fn(ctx, i) for i in [0, chunks), on the caller and up to threads - 1 workers (see the top). */
__attribute__((weak, visibility("hidden"))) void tv_pool_run(int64_t chunks, int threads, tv_pool_fn fn, void* ctx) {
  int32_t idle = 0;
  if (threads <= 1 || chunks <= 1 || chunks >= TV_POOL_CLOSED
      || !__atomic_compare_exchange_n(&tv_pool.busy, &idle, 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    for (int64_t i = 0; i < chunks; ++i) fn(ctx, i);
    return;
  }
  const int32_t workers = tv_pool_start(threads - 1 < TV_POOL_MAX_WORKERS ? threads - 1 : TV_POOL_MAX_WORKERS);
  const int32_t team = workers + 1 < threads ? workers + 1 : threads;
  const uint64_t generation = (TV_POOL_LOAD(&tv_pool.word) >> 32) + 1;
  TV_POOL_STORE(&tv_pool.word, generation << 32 | TV_POOL_CLOSED);
  TV_POOL_STORE(&tv_pool.fn, fn);
  TV_POOL_STORE(&tv_pool.ctx, ctx);
  TV_POOL_STORE(&tv_pool.chunks, chunks);
  TV_POOL_STORE(&tv_pool.done, 0);
  TV_POOL_STORE(&tv_pool.team, team);
  TV_POOL_STORE(&tv_pool.word, generation << 32);
  TV_POOL_ADD(&tv_pool.sequence, 1);
  if (TV_POOL_LOAD(&tv_pool.sleepers) > 0) {
    pthread_mutex_lock(&tv_pool.lock);
    pthread_cond_broadcast(&tv_pool.wake);
    pthread_mutex_unlock(&tv_pool.lock);
  }
  TV_POOL_ADD(&tv_pool_caller_chunks, tv_pool_work());
  TV_POOL_ADD(&tv_pool_jobs, 1);
  /* Every chunk is claimed: wait for those that workers are still running. */
  for (int spins = 0; TV_POOL_LOAD(&tv_pool.done) < chunks; ++spins) {
    if (spins < 4096) tv_pool_relax(); else sched_yield();
  }
  TV_POOL_STORE(&tv_pool.busy, 0);
}

/* (jobs run, chunks the callers ran, chunks the workers ran, workers started): what ran where. */
__attribute__((weak)) int32_t tv_pool_stats(int64_t* out) {
  out[0] = TV_POOL_LOAD(&tv_pool_jobs);
  out[1] = TV_POOL_LOAD(&tv_pool_caller_chunks);
  out[2] = TV_POOL_LOAD(&tv_pool_worker_chunks);
  out[3] = TV_POOL_LOAD(&tv_pool.started);
  return 0;
}

#endif /* TV_POOL_H */
