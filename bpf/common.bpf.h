/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Maps and helpers every unit shares: configuration, drop counters, the two rings, watches, file identity.
 */
#ifndef CP_COMMON_BPF_H
#define CP_COMMON_BPF_H

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2 * CP_WATCH_SLOTS);
	__type(key, u32);
	__type(value, struct cp_watch);
} watched SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CP_MAX_VOLUMES);
	__type(key, u32);
	__type(value, struct cp_volume);
} volumes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct cp_config);
} cp_config_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct cp_drops);
} drops SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 1 << 16); /* resized by user space before load: two halves of nslots */
	__type(key, u32);
	__type(value, struct cp_hot_slot);
} hot_slots SEC(".maps");

/*
 * One bit per slot of "hot_slots", set by the program that claims the slot: the drain reads the slots claimed in a
 * tick and nothing else. A table sized for max_files is mostly empty in any one tick; copying and comparing all of it
 * (16 MiB at the default max_files) cost 8 ms a tick on a host and ~70 ms in the lab guest. nslots is a multiple
 * of 64, so no word holds bits of both halves.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 1 << 11); /* resized by user space before load: 2 * nslots / 64 */
	__type(key, u32);
	__type(value, u64);
} hot_claimed SEC(".maps");

/*
 * The drain's grace period. Updating an element of a map-in-map from the bpf() syscall waits for every running
 * non-sleepable BPF program to finish (kernel/bpf/syscall.c, maybe_wait_bpf_programs(): synchronize_rcu(), since
 * Linux 5.0). After user space moves cp_config.hot_base to the other half and updates this map, no program still
 * counts into the old half: it is drained with nothing writing to it. No program uses these two maps.
 */
struct cp_grace_inner {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, u32);
} grace_inner SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 1);
	__type(key, u32);
	__array(values, struct cp_grace_inner);
} grace SEC(".maps") = {
	.values = {[0] = &grace_inner},
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, u32);
	__type(value, struct cp_dio);
} dio_task SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct cp_dio);
} dio_store SEC(".maps");

/* ext4's fsync in progress, per task: from ext4_sync_file_enter to its exit (task storage: a few loads where the
 * tid-keyed LRU hash cost ~600 ns per update and ~300 per lookup + delete on every fsync) */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct cp_sync_pending);
} sync_store SEC(".maps");

/* a file's end, aggregated in the kernel (see struct cp_delete_key in cachepilot.h); preallocated: an update from the
 * tracepoint allocates nothing */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1 << 16); /* resized by user space before load */
	__type(key, struct cp_delete_key);
	__type(value, struct cp_delete);
} deletes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20); /* resized by user space before load */
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20); /* resized by user space before load */
} barrier_events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CP_MAX_VOLUMES * CP_DROP_KINDS);
	__type(key, u32);
	__type(value, u64);
} vol_drops SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CP_MAX_VOLUMES * CP_SYNC_KINDS);
	__type(key, u32);
	__type(value, struct cp_sync);
} sync_calls SEC(".maps");

/* a thread is in at most one syscall: entries live from a durability call's entry to its exit (LRU: an exit missed
 * while attaching cannot leak an entry forever); the syscall tracepoints' (program type tracepoint) */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, u32);
	__type(value, struct cp_sync_pending);
} sync_pending SEC(".maps");

#include "helpers.bpf.h"

/*
 * Wakeups. A wakeup is an interrupt (irq_work) plus a context switch of the consumer; in a virtual machine it costs
 * microseconds. With the kernel's adaptive wakeup (one per record the consumer has caught up with), a 4 KiB write +
 * fsync loop woke the consumer once per journal commit: 4 000 polls a second, a third of a core in user space and
 * 10% of the loop's throughput (bench_probe, 2026-11-25). So a ring wakes its consumer only:
 * - when the unread data crosses a quarter of the ring (a quarter, half, three quarters: the consumer drains it
 *   before it fills), and
 * - for the events ring, when the last wakeup is at least the wake period old (cp_config.wake_every_ns, set at load;
 *   CP_WAKE_EVERY_NS when 0): a lone delete after a quiet moment still wakes a waiting poll at once, a burst wakes
 *   it once. A record that came after a wakeup and did not wake is read by the consumer's next pass (Probe.poll()
 *   never waits longer than CP_WAKE_EVERY_NS x 5 without looking). The daemon, which looks at most once a second
 *   whatever wakes it, sets a quarter of that: a wakeup still lands in every gap between its looks, and the kernel
 *   stops waking it (an irq_work and the wake-up of the epoll) up to 50 times a second for nothing.
 * User space waits edge-triggered (only these wakeups end a wait) and looks again without waiting when its
 * budget left records behind (EventRings._poll_once, controller/cachepilot/probe/poller.py).
 */
#define CP_WAKE_EVERY_NS (20ULL * 1000 * 1000)

u64 cp_events_woken_ns = 0; /* .bss: racy by design (two CPUs may both wake: one wakeup too many) */

static __always_inline bool crossed_quarter(void *ring, u64 len)
{
	u64 avail = bpf_ringbuf_query(ring, BPF_RB_AVAIL_DATA); /* includes this reserved record */
	u64 quarter = bpf_ringbuf_query(ring, BPF_RB_RING_SIZE) / 4;
	u64 rec = (len + 8 + 7) & ~7ULL; /* the record with its header, as the ring lays it out */
	u64 before = avail > rec ? avail - rec : 0;
	return quarter && avail / quarter != before / quarter;
}

/* the events ring: deletes, freed extents, journal commits, discards */
static __always_inline void submit(void *e, u64 len)
{
	struct cp_config *c = cfg();
	u64 every = c && c->wake_every_ns ? c->wake_every_ns : CP_WAKE_EVERY_NS;
	u64 now = bpf_ktime_get_ns();
	bool wake = now - cp_events_woken_ns >= every || crossed_quarter(&events, len);
	if (wake)
		cp_events_woken_ns = now;
	bpf_ringbuf_submit(e, wake ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP);
}

/* Block barriers can come by the hundred thousand a second: user space consumes them on its own schedule (each poll
 * takes both rings), woken only at the quarter crossings. */
static __always_inline void submit_barrier(void *e, u64 len)
{
	bpf_ringbuf_submit(e, crossed_quarter(&barrier_events, len) ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP);
}

#endif /* CP_COMMON_BPF_H */
