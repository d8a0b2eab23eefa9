/* The floor of a native 10 Hz sampler: wake up on a drift-free schedule and pread each file
 * due on this tick, parse nothing.  Used by agent_threads.py beside the agent, which reads
 * its CPU time from /proc/<pid>/task/x/schedstat; runs until killed.
 *
 *     floor INTERVAL_S EVERY:PATH...     (EVERY: read on every n-th tick)
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: floor INTERVAL_S EVERY:PATH...\n");
    return 2;
  }
  long step = (long)(atof(argv[1]) * 1e9);
  int n = argc - 2;
  int *fds = calloc(n, sizeof *fds), *every = calloc(n, sizeof *every);
  for (int i = 0; i < n; i++) {
    char *colon = strchr(argv[i + 2], ':');
    if (!colon) {
      fprintf(stderr, "floor: %s: not EVERY:PATH\n", argv[i + 2]);
      return 2;
    }
    every[i] = atoi(argv[i + 2]);
    fds[i] = open(colon + 1, O_RDONLY | O_CLOEXEC);
    if (fds[i] < 0) {
      perror(colon + 1);
      return 1;
    }
  }
  static char buf[65536];
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  for (long k = 0;; k++) {
    t.tv_nsec += step;
    while (t.tv_nsec >= 1000000000L) {
      t.tv_nsec -= 1000000000L;
      t.tv_sec++;
    }
    clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL);
    for (int i = 0; i < n; i++)
      if (k % every[i] == 0 && pread(fds[i], buf, sizeof buf, 0) < 0) return 1;
  }
}
