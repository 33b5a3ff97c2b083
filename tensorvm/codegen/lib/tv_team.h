/* tensorvm's parallel-for for every parallel loop of a shared kernel library (the generated loops, outlined by
   c_emit.py, the softmax, the products of tv_gemm.h / tv_vgemm.h, the convolutions): the caller takes unstarted work.

   tv_team_run(chunks, threads, fn, ctx) runs fn(ctx, i) for every chunk i in [0, chunks) on the calling
   thread and up to threads - 1 pool workers. Unlike an OpenMP parallel region, whose end is a barrier
   that waits until every thread of the team has been scheduled, the caller claims chunks itself, as the
   workers do (its home range first, then any left: below), and returns once every chunk is done: a worker whose core is busy with
   another process (and that has therefore not started) costs nothing, the caller does its chunks. Only
   a chunk a worker has already claimed is waited for, so chunks are kept small (a few per thread).

   Workers spin for the pool's spin_ns after their last job (the gap between the kernel calls of one
   inference, like GOMP_SPINCOUNT for the OpenMP threads; TV_TEAM_SPIN_NS until tv_team_set_spin_here gives
   the host's rule, host.py: team_spin_ns), then sleep on a condition variable; the caller wakes sleepers
   only when there are some. The spin counts from the caller's last call, serial ones included (a kernel
   below its split threshold still calls tv_team_run with its budget of threads): a run of small serial
   kernels inside an inference (a squeeze-and-excitation block: mean, two 1 x 1 products, a multiply,
   20-60 us) is not idle time, and a worker that slept through it made the next split wait for its wake
   (wake_ns, 17-48 us measured on a 2-core VM) with the caller doing the work alone. While spinning a
   worker yields its core every TV_TEAM_YIELD_ROUNDS pauses, so that on an oversubscribed core the other
   process's thread runs instead of a worker that has no work.

   Home ranges: a job's chunks are cut into as many contiguous ranges as its team has threads (at most
   TV_TEAM_RANGES), and thread t (the caller 0, worker w) claims the chunks of range t first, in order,
   then those left in the others. With every core free each thread runs the same chunks call after call,
   so the weights and activations a chunk reads are in that core's caches from the call before (a product
   splits its panels, a convolution its pixels, the same way each call); a late thread's range is taken by
   the others as before. tv_team_mirror gives a chunk's place mirrored within its range (a product that
   reads its weight back and forth: each thread reverses its own part).

   Each range is one 64-bit word, generation << 32 | next chunk, and its end, so a thread that read an
   older job can never claim a chunk of a newer one (its compare-and-swap fails once the generation moves
   on). A job is published in three steps: its ranges' words are closed (the new generation, chunk
   TV_TEAM_CLOSED), the job's function and context and each range's end are written, then
   each word opens at its range's first chunk. A claim reads a range's word, then the job and the range's
   end, then swaps the word to the next chunk: if what it read was not the word's job, the word was closed
   before and the swap fails. A range the new job does not use keeps the old job's word, exhausted (every
   chunk of a job is claimed before the next is published), and its end: it is never claimed. The stores
   that publish are release stores and the claim's loads acquire loads, so a claim that read a job or an end
   written after the word was closed swaps against the closed word (a read-modify-write reads the latest
   value) and fails; a worker that sees the new sequence sees the job. The sequence's bump and the count of
   sleepers are sequentially consistent: a caller that bumps and a worker that goes to sleep cannot both
   miss each other. The job, the count of chunks done and the callers' time are each in a line of their
   own: a split then costs about two crossings between the cores (the job to a worker, its done back).

   One pool per process: every library has the code of a pool (weak hidden symbols shared by its
   translation units), but once the host hands it the process's pool with tv_team_attach (the pool
   library, pool/tv_pool.c, that tensorvm/codegen/pool.py loads once; runtime/library.py: load_cdll attaches
   it to every library it loads), its tv_team_run and tv_team_stats forward there, so that the kernels
   of every library tensorvm loads share one set of workers instead of each library's workers
   competing for the cores. A library nobody attaches (the standalone dynamic AOT library in an
   application) runs its own. A nested call (from a chunk, of this library or another one on the same
   pool), or a call while another thread of the process runs a job on the pool, runs serially. After a
   fork the child starts with no workers. Shared libraries only (tv_gemm.h, pool/tv_pool.c include it). */
#ifndef TV_TEAM_H
#define TV_TEAM_H

#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#ifndef TV_CLOCK_H
#include "tv_clock.h"
#endif

#define TV_TEAM_MAX_WORKERS 255
#define TV_TEAM_CLOSED 0xffffffffu
#define TV_TEAM_RANGES 16
#ifndef TV_TEAM_SPIN_NS
#define TV_TEAM_SPIN_NS 20000
#endif
#define TV_TEAM_YIELD_ROUNDS 64

typedef void (*tv_team_fn)(void* ctx, int64_t chunk);

typedef struct {
  uint64_t word;          /* generation << 32 | next chunk of the range (TV_TEAM_CLOSED while published) */
  int64_t end;            /* the range's end */
  char pad[48];           /* (a cache line per range: each thread claims from its own) */
} tv_team_range;

typedef struct {
  tv_team_range range[TV_TEAM_RANGES];
  /* The job, in one line: the caller writes it as it publishes, the workers spin on `sequence` and read the
     rest on the same miss. */
  _Alignas(64) uint32_t sequence; /* bumped once per job: what spinning and sleeping workers wait on */
  int32_t team;           /* threads the current job may use (caller included) */
  tv_team_fn fn;
  void* ctx;
  uint64_t generation;    /* of the current job (the caller's alone) */
  /* Chunks finished of the current job: the workers add, the caller waits (a line of its own). */
  _Alignas(64) int64_t done;
  /* When a caller with a budget of several threads last called (tv_now_ns): written at every such call,
     read now and then by spinning workers (a line of its own, so that neither slows the job's lines). */
  _Alignas(64) int64_t called_ns;
  /* The callers' and the settings. */
  _Alignas(64) int32_t busy; /* a caller is running a job */
  int32_t started;        /* workers started */
  int32_t sleepers;
  int32_t pid;            /* the process that started the workers (0: none yet, no fork handler) */
  int64_t spin_ns;        /* how long an idle worker spins before it sleeps (0: TV_TEAM_SPIN_NS) */
  int64_t fork_join_cycles; /* a split's cost measured on this machine (host.py: fork_join_cycles; 0: unmeasured) */
  pthread_mutex_t lock;
  pthread_cond_t wake;
} tv_team_state;

__attribute__((weak, visibility("hidden"))) tv_team_state tv_team = {
  .lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};
/* How many chunks the callers ran themselves and how many the workers ran (tv_team_stats). */
__attribute__((weak, visibility("hidden"))) int64_t tv_team_caller_chunks, tv_team_worker_chunks, tv_team_jobs;

#define TV_TEAM_LOAD(p) __atomic_load_n((p), __ATOMIC_SEQ_CST)
#define TV_TEAM_STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)
#define TV_TEAM_ADD(p, v) __atomic_add_fetch((p), (v), __ATOMIC_SEQ_CST)
/* A job's words are published with release stores and read with acquire loads (see the top): on x86 a
   sequentially consistent store is a locked exchange that waits for its line to cross to the caller's core,
   one such round trip per store, while release stores leave the core together. */
#define TV_TEAM_PUBLISH(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define TV_TEAM_READ(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)

static inline void tv_team_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* The home ranges of a job of `chunks` chunks on a team of `threads`, and the first chunk of range r. */
static inline int64_t tv_team_ranges(int64_t chunks, int64_t threads) {
  const int64_t ranges = threads < TV_TEAM_RANGES ? threads : TV_TEAM_RANGES;
  return ranges < chunks ? (ranges > 1 ? ranges : 1) : (chunks > 1 ? chunks : 1);
}
static inline int64_t tv_team_range_start(int64_t r, int64_t chunks, int64_t ranges) { return r * chunks / ranges; }

/* Chunk i's place mirrored within its home range (a job of `chunks` chunks on `threads` threads): the
   thread that runs a range's chunks first to last, runs the mirrored ones last to first. */
static inline int64_t tv_team_mirror(int64_t i, int64_t chunks, int64_t threads) {
  const int64_t ranges = tv_team_ranges(chunks, threads);
  const int64_t r = ((i + 1) * ranges - 1) / chunks;  /* (the last range whose start r * chunks / ranges <= i) */
  return tv_team_range_start(r, chunks, ranges) + tv_team_range_start(r + 1, chunks, ranges) - 1 - i;
}

/* Claim and run chunks of the current job, those of range `home` (modulo TV_TEAM_RANGES) first, then
   those left in the others, until none is left or the job changed; returns how many ran. */
__attribute__((weak, visibility("hidden"))) int64_t tv_team_work(int32_t home) {
  int64_t ran = 0;
  for (int32_t step = 0; step < TV_TEAM_RANGES; ++step) {
    tv_team_range* range = &tv_team.range[(home + step) % TV_TEAM_RANGES];
    for (;;) {
      const uint64_t word = TV_TEAM_READ(&range->word);
      const uint32_t next = (uint32_t)word;
      if (next == TV_TEAM_CLOSED) return ran;  /* (a job is being published: this one is over) */
      const tv_team_fn fn = TV_TEAM_READ(&tv_team.fn);
      void* const ctx = TV_TEAM_READ(&tv_team.ctx);
      if ((int64_t)next >= TV_TEAM_READ(&range->end)) break;  /* (exhausted, or unused by this job) */
      uint64_t expected = word;
      if (!__atomic_compare_exchange_n(&range->word, &expected, word + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        continue;
      fn(ctx, (int64_t)next);
      __atomic_add_fetch(&tv_team.done, 1, __ATOMIC_RELEASE);
      ++ran;
    }
  }
  return ran;
}

/* How long an idle worker spins now before it sleeps (ns): the host's rule once set, else the default. */
static inline int64_t tv_team_spin(void) {
  const int64_t spin = TV_TEAM_LOAD(&tv_team.spin_ns);
  return spin > 0 ? spin : TV_TEAM_SPIN_NS;
}

__attribute__((weak, visibility("hidden"))) void* tv_team_worker(void* arg) {
  const int32_t index = (int32_t)(intptr_t)arg;  /* 1 .. workers: the caller is 0 */
  uint32_t seen = TV_TEAM_LOAD(&tv_team.sequence);
  for (;;) {
    const int64_t start = tv_now_ns();
    const int64_t spin = tv_team_spin();
    int spins = 0;
    while (TV_TEAM_READ(&tv_team.sequence) == seen) {
      tv_team_relax();
      if (++spins % TV_TEAM_YIELD_ROUNDS) continue;
      sched_yield();  /* (returns at once unless another thread waits for this core) */
      const int64_t called = TV_TEAM_READ(&tv_team.called_ns), since = called > start ? called : start;
      if (tv_now_ns() - since >= spin) {
        pthread_mutex_lock(&tv_team.lock);
        TV_TEAM_ADD(&tv_team.sleepers, 1);
        while (TV_TEAM_LOAD(&tv_team.sequence) == seen) pthread_cond_wait(&tv_team.wake, &tv_team.lock);
        TV_TEAM_ADD(&tv_team.sleepers, -1);
        pthread_mutex_unlock(&tv_team.lock);
      }
    }
    seen = TV_TEAM_READ(&tv_team.sequence);
    if (index < TV_TEAM_READ(&tv_team.team)) {
      const int64_t ran = tv_team_work(index);
      if (ran) TV_TEAM_ADD(&tv_team_worker_chunks, ran);
    }
  }
  return NULL;
}

/* In a forked child the parent's workers do not exist: it starts its own. (Run by fork in the child, so
   that a job does not pay a getpid system call to find out; glibc drops the handler if the library is
   unloaded.) */
static void tv_team_forked(void) {
  tv_team.started = 0, tv_team.sleepers = 0, tv_team.busy = 0;
  tv_team.pid = (int32_t)getpid();
}

/* Start workers until there are `want` (fewer if the system refuses threads); returns how many there are. */
static int32_t tv_team_start(int32_t want) {
  if (tv_team.pid == 0) {  /* (the first start: from now on a fork resets the workers) */
    tv_team.pid = (int32_t)getpid();
    pthread_atfork(NULL, NULL, tv_team_forked);
  }
  while (tv_team.started < want && tv_team.started < TV_TEAM_MAX_WORKERS) {
    pthread_t thread;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    const int failed = pthread_create(&thread, &attr, tv_team_worker, (void*)(intptr_t)(tv_team.started + 1));
    pthread_attr_destroy(&attr);
    if (failed) break;
    ++tv_team.started;
  }
  return tv_team.started;
}

/* fn(ctx, i) for i in [0, chunks), on the caller and up to threads - 1 workers of this library's pool (see
   the top). */
__attribute__((weak, visibility("hidden"))) void tv_team_run_here(int64_t chunks, int threads, tv_team_fn fn,
                                                                   void* ctx) {
  int32_t idle = 0;
  if (threads <= 1 || chunks <= 1 || chunks >= TV_TEAM_CLOSED
      || !__atomic_compare_exchange_n(&tv_team.busy, &idle, 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    /* a serial call with a budget of several threads keeps started workers spinning (see the top) */
    if (threads > 1 && TV_TEAM_LOAD(&tv_team.started) > 0) TV_TEAM_PUBLISH(&tv_team.called_ns, tv_now_ns());
    for (int64_t i = 0; i < chunks; ++i) fn(ctx, i);
    return;
  }
  const int32_t workers = tv_team_start(threads - 1 < TV_TEAM_MAX_WORKERS ? threads - 1 : TV_TEAM_MAX_WORKERS);
  const int32_t team = workers + 1 < threads ? workers + 1 : threads;
  /* (the ranges of the team asked for, as tv_team_mirror's callers count them; a thread not started
     leaves its range to the others) */
  const int64_t ranges = tv_team_ranges(chunks, threads);
  const uint64_t generation = tv_team.generation + 1;
  tv_team.generation = generation;
  for (int64_t r = 0; r < ranges; ++r) TV_TEAM_PUBLISH(&tv_team.range[r].word, generation << 32 | TV_TEAM_CLOSED);
  TV_TEAM_PUBLISH(&tv_team.fn, fn);
  TV_TEAM_PUBLISH(&tv_team.ctx, ctx);
  TV_TEAM_PUBLISH(&tv_team.done, 0);
  TV_TEAM_PUBLISH(&tv_team.team, team);
  for (int64_t r = 0; r < ranges; ++r) {
    TV_TEAM_PUBLISH(&tv_team.range[r].end, tv_team_range_start(r + 1, chunks, ranges));
    TV_TEAM_PUBLISH(&tv_team.range[r].word, generation << 32 | (uint64_t)tv_team_range_start(r, chunks, ranges));
  }
  TV_TEAM_ADD(&tv_team.sequence, 1);
  if (TV_TEAM_LOAD(&tv_team.sleepers) > 0) {
    pthread_mutex_lock(&tv_team.lock);
    pthread_cond_broadcast(&tv_team.wake);
    pthread_mutex_unlock(&tv_team.lock);
  }
  TV_TEAM_ADD(&tv_team_caller_chunks, tv_team_work(0));
  TV_TEAM_ADD(&tv_team_jobs, 1);
  /* Every chunk is claimed: wait for those that workers are still running. */
  for (int spins = 0; TV_TEAM_READ(&tv_team.done) < chunks; ++spins) {
    if (spins < 4096) tv_team_relax(); else sched_yield();
  }
  TV_TEAM_STORE(&tv_team.busy, 0);
}

__attribute__((weak, visibility("hidden"))) int32_t tv_team_stats_here(int64_t* out) {
  out[0] = TV_TEAM_LOAD(&tv_team_jobs);
  out[1] = TV_TEAM_LOAD(&tv_team_caller_chunks);
  out[2] = TV_TEAM_LOAD(&tv_team_worker_chunks);
  out[3] = TV_TEAM_LOAD(&tv_team.started);
  return 0;
}

__attribute__((weak, visibility("hidden"))) void tv_team_set_spin_here(int64_t ns) {
  TV_TEAM_STORE(&tv_team.spin_ns, ns > 0 ? ns : 0);
}

/* The cost of a split measured on this machine (host.py: fork_join_cycles, a power of two; 0: unmeasured),
   kept by the running pool rather than written into the kernels' text: a measurement (which a busy
   machine can disturb, and which differs a little in every process) never changes a library's text and
   with it the key its kernel cache entry is found by. Each library applies its own rules to it
   (tv_team_narrow_work, tv_team_chunk_elements), so a library keeps the rules of the host it was built
   for. */
__attribute__((weak, visibility("hidden"))) void tv_team_set_fork_join_here(int64_t cycles) {
  TV_TEAM_STORE(&tv_team.fork_join_cycles, cycles > 0 ? cycles : 0);
}

/* A pool's entry points, as the pool library hands them to every other library (tv_team_attach). */
typedef struct {
  void (*run)(int64_t chunks, int threads, tv_team_fn fn, void* ctx);
  int32_t (*stats)(int64_t* out);
  void (*set_spin)(int64_t ns);
  const void* state;  /* the pool's tv_team_state (tv_team_pool_id; its fork_join_cycles) */
  void (*set_fork_join)(int64_t cycles);
} tv_team_pool;

/* The layout of tv_team_state and tv_team_pool this library was built with. The host attaches a library
   to the process's pool only when its layout is the pool's (runtime/library.py: TEAM_ABI), so that a
   prebuilt library of an older layout runs its own pool instead of misreading the process's. */
#define TV_TEAM_ABI 2
__attribute__((weak)) int32_t tv_team_abi(void) { return TV_TEAM_ABI; }

/* The pool this library's jobs run on: NULL for its own (tv_team_run_here). */
__attribute__((weak, visibility("hidden"))) const tv_team_pool* tv_team_shared;

/* Run this library's jobs on `pool` (the process's, from pool/tv_pool.c), or on its own pool for NULL. Called
   by the host when it loads the library, before any kernel of it runs. */
__attribute__((weak)) int32_t tv_team_attach(const void* pool) {
  TV_TEAM_STORE(&tv_team_shared, (const tv_team_pool*)pool);
  return 0;
}

/* fn(ctx, i) for i in [0, chunks) on the process's pool where attached, else on this library's own. */
__attribute__((weak, visibility("hidden"))) void tv_team_run(int64_t chunks, int threads, tv_team_fn fn, void* ctx) {
  const tv_team_pool* pool = TV_TEAM_LOAD(&tv_team_shared);
  if (pool) pool->run(chunks, threads, fn, ctx);
  else tv_team_run_here(chunks, threads, fn, ctx);
}

/* (jobs run, chunks the callers ran, chunks the workers ran, workers started) of the pool this library's
   jobs run on: what ran where. */
__attribute__((weak)) int32_t tv_team_stats(int64_t* out) {
  const tv_team_pool* pool = TV_TEAM_LOAD(&tv_team_shared);
  return pool ? pool->stats(out) : tv_team_stats_here(out);
}

/* The measured cost of a split on the pool this library's jobs run on (0: unmeasured). */
static inline int64_t tv_team_fork_join(void) {
  const tv_team_pool* pool = TV_TEAM_LOAD(&tv_team_shared);
  const tv_team_state* state = pool ? (const tv_team_state*)pool->state : &tv_team;
  return TV_TEAM_LOAD(&state->fork_join_cycles);
}

/* host.py kernel_rules' three thresholds that follow the measured split, by the same rules over this
   library's TV_MACS_PER_CYCLE, TV_NARROW_MACS_PER_CYCLE and TV_WORK_LANES: a product or convolution splits
   from TV_TEAM_WIDE_SPLITS (host.py: WIDE_SPLITS) times a split's cost (at most TV_FORK_JOIN_CYCLES) in
   multiply-adds (parallel_work); a product of fewer rows than a vector's lanes splits
   from twice a split's cost (at most TV_FORK_JOIN_CYCLES) in its multiply-adds (parallel_work_narrow); a
   parallel loop's chunk holds at least a sixteenth of a split's cost in elements, half a vector per cycle
   (team_chunk_elements). `built`, the rule for an unmeasured host, where the pool has no measurement. */
#ifdef TV_FORK_JOIN_CYCLES
/* `splits` measured splits (at most TV_FORK_JOIN_CYCLES cycles) of work at `macs` multiply-adds a cycle;
   `built` where the pool has no measurement. */
static inline int64_t tv_team_split_work(int64_t built, int64_t splits, int64_t macs) {
  const int64_t cycles = tv_team_fork_join();
  if (cycles <= 0) return built;
  return (splits * cycles < TV_FORK_JOIN_CYCLES ? splits * cycles : TV_FORK_JOIN_CYCLES) * macs;
}
#endif
static inline int64_t tv_team_narrow_work(int64_t built) {
#if defined(TV_NARROW_MACS_PER_CYCLE) && defined(TV_FORK_JOIN_CYCLES)
  return tv_team_split_work(built, 2, TV_NARROW_MACS_PER_CYCLE);
#else
  return built;
#endif
}
static inline int64_t tv_team_wide_work(int64_t built) {
#if defined(TV_MACS_PER_CYCLE) && defined(TV_FORK_JOIN_CYCLES) && defined(TV_TEAM_WIDE_SPLITS)
  return tv_team_split_work(built, TV_TEAM_WIDE_SPLITS, TV_MACS_PER_CYCLE);
#else
  return built;
#endif
}
static inline int64_t tv_team_chunk_elements(int64_t built) {
#if defined(TV_WORK_LANES)
  const int64_t cycles = tv_team_fork_join();
  if (cycles > 0) {
    const int64_t least = cycles * (TV_WORK_LANES / 2 > 1 ? TV_WORK_LANES / 2 : 1) / 16;
    return least > 1 ? least : 1;
  }
#endif
  return built;
}

/* Which pool this library's jobs run on (equal for two libraries exactly when they share one). */
__attribute__((weak)) int64_t tv_team_pool_id(void) {
  const tv_team_pool* pool = TV_TEAM_LOAD(&tv_team_shared);
  return (int64_t)(intptr_t)(pool ? pool->state : (const void*)&tv_team);
}

#endif /* TV_TEAM_H */
