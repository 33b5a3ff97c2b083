/* The process's pool (tv_team.h): one small shared library that tensorvm/codegen/pool.py builds and loads
   once per process; tv_pool() is the table of entry points the host hands to every kernel library it
   loads (tv_team_attach), so that all of them run their parallel loops on these workers.

   tv_pool_fork_join_ns measures what a split costs on this host: the median time of a job of `threads`
   chunks, each of which waits (up to TV_POOL_WAIT_NS) until every chunk has started, so that the job
   ends only once `threads` - 1 workers have joined it. With the workers spinning (jobs back to back) that
   is the fork-join cost of a split (host.py turns it into team_chunk_elements); with them asleep (a pause
   longer than their spin before each job) it includes waking them, which is what a worker's spin should
   not outlast (team_spin_ns). */
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "tv_clock.h"
#include "tv_team.h"

#define TV_POOL_WAIT_NS 1000000 /* a chunk gives up waiting for the others (a worker that is not scheduled) */
#define TV_POOL_MAX_ROUNDS 1024

static const tv_team_pool tv_pool_table = {tv_team_run_here, tv_team_stats_here, tv_team_set_spin_here, &tv_team,
                                            tv_team_set_fork_join_here};

const void* tv_pool(void) { return &tv_pool_table; }

/* How long the pool's idle workers spin now (ns; 0: TV_TEAM_SPIN_NS). */
int64_t tv_pool_spin_ns(void) { return TV_TEAM_LOAD(&tv_team.spin_ns); }

typedef struct {
  int64_t chunks;
  int64_t arrived;
} tv_pool_probe;

static void tv_pool_probe_chunk(void* ctx, int64_t chunk) {
  tv_pool_probe* probe = (tv_pool_probe*)ctx;
  (void)chunk;
  TV_TEAM_ADD(&probe->arrived, 1);
  const int64_t start = tv_now_ns();
  while (TV_TEAM_LOAD(&probe->arrived) < probe->chunks && tv_now_ns() - start < TV_POOL_WAIT_NS) tv_team_relax();
}

static int tv_pool_less(const void* a, const void* b) {
  const int64_t x = *(const int64_t*)a, y = *(const int64_t*)b;
  return (x > y) - (x < y);
}

/* The median nanoseconds of `rounds` jobs of `threads` chunks on `threads` threads (see the top); with
   `asleep`, each job after a pause of twice the workers' spin (they sleep when it starts). */
int64_t tv_pool_fork_join_ns(int32_t threads, int32_t rounds, int32_t asleep) {
  int64_t took[TV_POOL_MAX_ROUNDS];
  if (threads < 2 || rounds < 1) return 0;
  if (rounds > TV_POOL_MAX_ROUNDS) rounds = TV_POOL_MAX_ROUNDS;
  const int64_t spin = tv_team_spin();
  for (int32_t r = -1; r < rounds; ++r) { /* (round -1 starts the workers) */
    if (asleep) {
      const int64_t pause = 2 * spin + 100000;
      const struct timespec t = {pause / 1000000000, pause % 1000000000};
      nanosleep(&t, NULL);
    }
    tv_pool_probe probe = {threads, 0};
    const int64_t start = tv_now_ns();
    tv_team_run_here(threads, threads, tv_pool_probe_chunk, &probe);
    if (r >= 0) took[r] = tv_now_ns() - start;
  }
  qsort(took, (size_t)rounds, sizeof took[0], tv_pool_less);
  return took[rounds / 2];
}
