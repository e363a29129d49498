// SPDX-License-Identifier: GPL-2.0-only
/*
 * filegen: file events at a fixed rate, for the daemon's cost curve (tests/bench/bench_daemon_cost.py compiles it at
 * run time with the system gcc). A Python loop cannot make 100 000 file system calls a second on two shared cores.
 *
 *   filegen DIR EVENTS_PER_S SECONDS FSYNC_EVERY POOL
 *
 * The "churn" mix, one cycle = these file events (system calls on files of DIR), repeated:
 *   create   open(O_CREAT|O_TRUNC|O_WRONLY) of a new file
 *   write    8 KiB into it (then close)
 *   fsync    of that file, every FSYNC_EVERY-th cycle only (allocates its blocks: a freed extent at its unlink)
 *   read     4 KiB of the file created POOL/2 cycles ago (open, pread, close)
 *   unlink   of the file created POOL cycles ago (a file lives POOL cycles)
 * so 4 + 1/FSYNC_EVERY events a cycle. The pace is held by the clock (sleeping whenever ahead by more than 1 ms);
 * the rate reached is what the output says, never assumed.
 *
 * Prints one line: events=N cycles=N seconds=S cpu_s=S (its own user + system time).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static void name_of(char *buf, size_t len, const char *dir, long i)
{
	snprintf(buf, len, "%s/f%09ld", dir, i);
}

static void die(const char *what, const char *path)
{
	fprintf(stderr, "filegen: %s %s: %s\n", what, path, strerror(errno));
	exit(1);
}

int main(int argc, char **argv)
{
	if (argc != 6) {
		fprintf(stderr, "usage: filegen DIR EVENTS_PER_S SECONDS FSYNC_EVERY POOL\n");
		return 2;
	}
	const char *dir = argv[1];
	double rate = atof(argv[2]), seconds = atof(argv[3]);
	long fsync_every = atol(argv[4]), pool = atol(argv[5]);
	static char buf[8192];
	char path[4096];
	long cycles = 0, events = 0;
	memset(buf, 'x', sizeof(buf));
	double t0 = now_s(), end = t0 + seconds;

	for (;;) {
		double t = now_s();
		if (t >= end)
			break;
		double ahead = events / rate - (t - t0); /* seconds of events done before their time */
		if (ahead > 0.001) {
			struct timespec d = {(time_t)ahead, (long)((ahead - (time_t)ahead) * 1e9)};
			nanosleep(&d, NULL);
			continue;
		}
		name_of(path, sizeof(path), dir, cycles);
		int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
		if (fd < 0)
			die("create", path);
		if (write(fd, buf, sizeof(buf)) != sizeof(buf))
			die("write", path);
		events += 2;
		if (fsync_every > 0 && cycles % fsync_every == 0) {
			if (fsync(fd))
				die("fsync", path);
			events++;
		}
		close(fd);
		if (cycles >= pool / 2) {
			name_of(path, sizeof(path), dir, cycles - pool / 2);
			fd = open(path, O_RDONLY);
			if (fd < 0 || pread(fd, buf, 4096, 0) < 0)
				die("read", path);
			close(fd);
			events++;
		}
		if (cycles >= pool) {
			name_of(path, sizeof(path), dir, cycles - pool);
			if (unlink(path))
				die("unlink", path);
			events++;
		}
		cycles++;
	}
	double took = now_s() - t0;
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	double cpu = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
	/* the files left are removed by the caller (their unlinks are not part of the run) */
	printf("events=%ld cycles=%ld seconds=%.3f cpu_s=%.3f\n", events, cycles, took, cpu);
	return 0;
}
