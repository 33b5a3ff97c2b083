/* The pool's publication and join under ThreadSanitizer (tests/codegen/test_team_race.py): jobs of 2..8
   chunks on 2..3 threads, each chunk reading what the caller wrote before the job and writing its own
   output, which the caller checks after the job. A missing release or acquire on the job's words or on
   the count of chunks done is a data race TSAN reports (checked by weakening them). Prints how many chunks
   the workers ran, so the test knows the workers took part. */
#include <stdio.h>
#include <stdlib.h>

#include "tv_team.h"

#define ROUNDS 4000
#define MOST_CHUNKS 8

static int64_t input[MOST_CHUNKS], output[MOST_CHUNKS];

static void chunk(void* ctx, int64_t i) {
  (void)ctx;
  /* (long enough that a spinning worker claims chunks before the caller has run them all) */
  const int64_t start = tv_now_ns();
  while (tv_now_ns() - start < 2000) tv_team_relax();
  output[i] = 2 * input[i] + 1;
}

int main(void) {
  tv_team_set_spin_here(1000000);
  for (int round = 0; round < ROUNDS; ++round) {
    const int chunks = 2 + round % (MOST_CHUNKS - 1);
    for (int i = 0; i < chunks; ++i) input[i] = round + i;
    tv_team_run_here(chunks, 2 + round % 2, chunk, NULL);
    for (int i = 0; i < chunks; ++i)
      if (output[i] != 2 * (int64_t)(round + i) + 1) {
        printf("wrong: round %d chunk %d\n", round, i);
        return 1;
      }
  }
  int64_t stats[4];
  tv_team_stats_here(stats);
  printf("jobs %lld worker_chunks %lld\n", (long long)stats[0], (long long)stats[2]);
  return 0;
}
