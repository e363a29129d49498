// SPDX-License-Identifier: GPL-2.0-only
/*
 * cachepilot kernel half for kernels without BTF: the CO-RE object's block I/O, direct-I/O mark, freed-extent, delete,
 * journal-commit, durability-call and bcache programs, compiled by bcc against the running kernel's headers
 * (controller/cachepilot/probe/bccload.py).
 *
 * One source for both builds: this file includes the CO-RE units (helpers, hotness, attribution, blockio, dio, freed,
 * sync, bcache) and gives the few CO-RE constructs they use a bcc meaning (CP_BCC):
 * - maps: bcc's compile creates no map. Each map name stands for a BPF_PSEUDO_MAP_FD load of a placeholder number
 *   (CP_FD_<name>, from the loader); the loader creates the maps with the CO-RE object's definitions and writes their
 *   file descriptors over the placeholders, so both builds share one set of maps (cachepilot.h's layouts) and all of
 *   user space (rings, hotness table, counters, watches).
 * - tp_btf programs become raw tracepoints (BPF_PROG: bcc's, over the raw arguments); BPF_CORE_READ and BTF_READ are
 *   chains of bpf_probe_read_kernel; CO-RE's field offsets and enum values are the headers' (offsetof, the enum
 *   itself). Classic tracepoints (the system calls', bcache's) are the same programs: their records' layouts are the
 *   kernel's ABI.
 * - task storage (needs BTF) becomes an LRU hash by thread id: only the syscall direct-I/O marks (dio_task) are built,
 *   and ext4's fsync in progress lives in "sync_task" (sync_pending's definition); the system call a task is in
 *   comes from the pt_regs at the top of its kernel stack (bpf_task_pt_regs needs a BTF task).
 * - iomap_dio_bio_end_io and bio_chain_endio: from the map cp_ksyms (user space reads kallsyms at load), not ksyms.
 * - no bpf_loop (bcc cannot load its callback, a subprogram): hotness probes CP_HOT_INLINE slots inline; the
 *   discard count is unrolled.
 * - no ring wakeup pacing (its clock is a global variable, which this build has not): records are submitted with the
 *   kernel's adaptive wakeup.
 * Not here (the CO-RE object only): bpf_rdonly_cast's fast block I/O variant, iomap's direct-I/O marks (6.18's
 * tracepoints; the syscall marks are built), XFS freed extents (the headers have no XFS structures).
 */
#define CP_BCC 1
#include <linux/fs.h>
#include <linux/blk_types.h>
#include <linux/blkdev.h>
#include <linux/bvec.h>
#include <linux/mm_types.h>
#include <linux/sched.h>
#include <linux/jbd2.h>
#include <linux/fdtable.h>
#include <asm/unistd.h>
#include "cachepilot.h"

#define CP_MAP(n) (*(char *)(long)bpf_pseudo_fd(1, n))
#define watched CP_MAP(CP_FD_watched)
#define volumes CP_MAP(CP_FD_volumes)
#define cp_config_map CP_MAP(CP_FD_cp_config_map)
#define drops CP_MAP(CP_FD_drops)
#define hot_slots CP_MAP(CP_FD_hot_slots)
#define hot_claimed CP_MAP(CP_FD_hot_claimed)
#define events CP_MAP(CP_FD_events)
#define barrier_events CP_MAP(CP_FD_barrier_events)
#define vol_drops CP_MAP(CP_FD_vol_drops)
#define cp_ksyms CP_MAP(CP_FD_cp_ksyms)
#define sync_calls CP_MAP(CP_FD_sync_calls)
#define sync_pending CP_MAP(CP_FD_sync_pending)
#define sync_task CP_MAP(CP_FD_sync_task)
#define dio_task CP_MAP(CP_FD_dio_task)
#define alloc_fails CP_MAP(CP_FD_alloc_fails)

#define SEC(name)
/* a raw tracepoint's arguments as the program's parameters: ctx is the array of the tracepoint's arguments */
#undef BPF_PROG
#define BPF_PROG(name, args...)                                                                                    \
	name(unsigned long long *ctx);                                                                             \
	static __always_inline int ____##name(unsigned long long *ctx, ##args);                                   \
	int name(unsigned long long *ctx)                                                                          \
	{                                                                                                          \
		return ____##name(___bpf_ctx_cast(args));                                                          \
	}                                                                                                          \
	static __always_inline int ____##name(unsigned long long *ctx, ##args)

/* private to fs/iomap/direct-io.c: the request's iocb has been its first member since iomap's direct I/O began */
struct iomap_dio {
	struct kiocb *iocb;
};
#define CP_RD_(p, f)                                                                                              \
	({                                                                                                         \
		char _cp_b[sizeof((p)->f)] __attribute__((aligned(8))) = {};                                     \
		bpf_probe_read_kernel(_cp_b, sizeof(_cp_b), &(p)->f);                                             \
		*(typeof((p)->f) *)_cp_b;                                                                          \
	})
#define CP_RD2(s, a) CP_RD_(s, a)
#define CP_RD3(s, a, b) CP_RD_(CP_RD_(s, a), b)
#define CP_RD4(s, a, b, c) CP_RD_(CP_RD_(CP_RD_(s, a), b), c)
#define CP_RD5(s, a, b, c, d) CP_RD_(CP_RD_(CP_RD_(CP_RD_(s, a), b), c), d)
#define CP_RD_N(_1, _2, _3, _4, _5, N, ...) N
#define BPF_CORE_READ(...) CP_RD_N(__VA_ARGS__, CP_RD5, CP_RD4, CP_RD3, CP_RD2, _)(__VA_ARGS__)
#define bpf_core_enum_value(type, value) (value)
#define bpf_core_field_offset(type, field) offsetof(type, field)
#define CP_TYPED(p) NULL
#define BTF_READ BPF_CORE_READ
#define CP_KPTR(type, p) ((type *)(p)) /* only on the fast path, never built here */

/* the ABI constants core_fixes.bpf.h spells out for vmlinux.h, from the headers */
#define REQ_OP_MASK_ REQ_OP_MASK
#define REQ_OP_READ_ REQ_OP_READ
#define REQ_OP_WRITE_ REQ_OP_WRITE
#define REQ_OP_DISCARD_ REQ_OP_DISCARD
#define S_IFMT_ S_IFMT
#define S_IFREG_ S_IFREG
#define S_IFBLK_ S_IFBLK
#define PAGE_SHIFT_ PAGE_SHIFT
#define O_DIRECT_ O_DIRECT
#define O_DSYNC_ O_DSYNC
#define NR_WRITE_ __NR_write
#define NR_PWRITE64_ __NR_pwrite64
#define NR_WRITEV_ __NR_writev
#define NR_MSYNC_ __NR_msync
#define NR_FSYNC_ __NR_fsync
#define NR_FDATASYNC_ __NR_fdatasync
#define NR_SYNC_ __NR_sync
#define NR_PWRITEV_ __NR_pwritev
#define NR_PWRITEV2_ __NR_pwritev2

/* a system call tracepoint's record (include/trace/events/syscalls.h, the kernel's ABI): the common header, the
 * call's number, its arguments or its result, each a word */
struct trace_event_raw_sys_enter {
	u64 ent;
	long id;
	unsigned long args[6];
};
struct trace_event_raw_sys_exit {
	u64 ent;
	long id;
	long ret;
};

/* the system call the task is in (-1: none): its pt_regs sit at the top of its kernel stack (task_pt_regs) */
static __always_inline long current_syscall(void)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	char *stack = CP_RD_(task, stack);
	if (!stack)
		return -1;
	struct pt_regs *regs = (struct pt_regs *)(stack + THREAD_SIZE - TOP_OF_KERNEL_STACK_PADDING) - 1;
	return CP_RD_(regs, orig_ax);
}

#define CP_HOT_INLINE 32

static __always_inline void *cp_ksym(u32 i)
{
	u64 *a = bpf_map_lookup_elem(&cp_ksyms, &i);
	return a ? (void *)*a : NULL;
}
#define CP_KSYM_IOMAP_DIO_END_IO cp_ksym(CP_KSYM_IOMAP_DIO)
#define CP_KSYM_BIO_CHAIN_ENDIO cp_ksym(CP_KSYM_BIO_CHAIN)

static __always_inline void submit(void *e, u64 len)
{
	bpf_ringbuf_submit(e, 0);
}

static __always_inline void submit_barrier(void *e, u64 len)
{
	bpf_ringbuf_submit(e, 0);
}

#include "helpers.bpf.h"
#include "hotness.bpf.h"
#include "attribution.bpf.h"
#include "blockio.bpf.h"
#include "dio.bpf.h"
#include "freed.bpf.h"
#include "sync.bpf.h"
#include "bcache.bpf.h"
