/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * cachepilot: the one contract between the BPF programs and user space.
 *
 * Every ring-buffer event and every map key/value layout lives here. The Python view of these structs
 * (controller/cachepilot/bpf_layout.py) is checked against the compiled object's BTF by tests/bpf/test_layout.py and
 * against this text by tests/unit/test_layouts.py, as is the table of event kinds (controller/cachepilot/records.py:
 * a new CP_EV_* gets its record there), so change them together.
 *
 * Conventions: dev is the kernel's dev_t (major << 20 | minor); timestamps are bpf_ktime_get_ns() (CLOCK_MONOTONIC);
 * sectors are 512 bytes; fs blocks are in the filesystem's block size.
 */
#ifndef CACHEPILOT_H
#define CACHEPILOT_H

#ifndef __VMLINUX_H__
#include <linux/types.h>
typedef __u8 u8;
typedef __u32 u32;
typedef __u64 u64;
#endif

/* ---- watched devices (array "watched", filled by user space) ----
 * A hash map lookup costs ~120 ns in the bio hook (jhash and a bucket walk): the watched devices live instead in an
 * array of two halves of CP_WATCH_SLOTS entries, linearly probed from index (dev * mul) >> (32 - CP_WATCH_BITS) of
 * the active half for at most CP_WATCH_PROBES entries (an empty one ends the search), mul an odd multiplier user
 * space chose so that every watched device fits (at most CP_WATCH_SLOTS / 4 of them). An entry is this device's when
 * its dev matches. A change is written into the inactive half,
 * then cp_config.watch_sel switches halves (and multiplier) in one store, then user space waits for a grace period
 * before the old half may be rewritten: a program never sees a half-written table. */
#define CP_ROLE_VOLUME 0x1 /* the cached block device: hotness, epochs, barriers, discards */
#define CP_ROLE_FS     0x2 /* a superblock s_dev: deletes, freed extents, fsync & co, journal commits */
#define CP_ROLE_LOWER  0x4 /* a backing or cache device below a volume: discards only */
#define CP_WATCH_BITS 10
#define CP_WATCH_SLOTS (1U << CP_WATCH_BITS)
#define CP_WATCH_PROBES 4

struct cp_watch {
	u32 dev;      /* the device (kernel dev_t) this entry is for; 0: a free entry */
	u32 roles;
	u32 volume;   /* dev of the (first) volume this device belongs to */
	u32 slot;     /* index of that volume's state in the "volumes" array */
	u32 fs_dev;   /* s_dev of the filesystem of that volume: the volume itself, or a device stacked on it (LVM,
		       * dm-linear, dm-crypt, a loop device with direct I/O): its files' pages reach the volume in bios */
	u32 _pad;
	u64 lower_of; /* CP_ROLE_LOWER: bit i set = a lower device of the volume in slot i (a device may be shared) */
};

#define CP_MAX_VOLUMES 64

/* ---- configuration (array "cp_config_map", one element, written by user space after load) ---- */
#define CP_CFG_IGNORE_SELF 0x1
#define CP_CFG_DIO_SYSCALLS 0x2 /* direct I/O marks live in "dio_task" (syscall hooks), else in task storage */
#define CP_CFG_SYNC_SYSCALLS 0x4 /* the fsync-family syscall hooks are attached: ext4's hooks leave their calls to them */
#define CP_CFG_BULK_DELETES 0x8 /* deletes go into the "deletes" hash map (read in bulk each tick), not the ring */

struct cp_config {
	u32 self_tgid; /* the loader's tgid in the initial PID namespace (what bpf_get_current_pid_tgid returns) */
	u32 flags;
	u64 nslots;   /* number of slots of "hot_slots" actually used (<= max_entries) */
	u64 clock_ns; /* CLOCK_MONOTONIC, refreshed by user space at every poll: the hotness table's last-access time
		       * (reading the clock per bio costs more than everything else in a virtual machine) */
	u64 nonce;    /* non-zero while the loader claims self_tgid (see CP_SELF_CLAIM_FD) */
	u64 hot_base; /* first slot of the half of "hot_slots" the programs count into (0 or nslots): user space
		       * drains the other half, after a grace period, while nothing writes to it (lossless) */
	u64 watch_sel; /* the watched table: low 32 bits the multiplier, bit 32 the active half */
	u64 wake_every_ns; /* the events ring's wakeup pace (0: CP_WAKE_EVERY_NS): a consumer that looks once a second
			    * has no use for 50 wakeups a second (see "Wakeups" in common.bpf.h) */
};

/*
 * The loader may run in a PID namespace (a container): its getpid() is not the kernel's tgid. So it identifies
 * itself in the kernel's own terms: with a random nonce in the config, it calls sync_file_range(CP_SELF_CLAIM_FD,
 * nonce, 0, 0) (EBADF, no effect); the program records the caller's global tgid and clears the nonce. Only root can
 * read the config, so no one else can claim to be the loader.
 */
#define CP_SELF_CLAIM_FD -4242

/* ---- per-file hotness: open-addressed table in an mmap-able array ("hot_slots") ----
 * A slot is claimed by compare-and-swap of ino (0 = free; inode 0 does not exist), then dev and gen are written; a
 * racing reader that sees the slot half-written moves on (at worst the file gets two slots: deltas are additive).
 * The claim also sets the slot's bit in "hot_claimed"; user space copies and zeroes the claimed slots each tick.
 * 48 bytes per slot. */
struct cp_hot_slot {
	u64 ino;
	u32 dev; /* superblock s_dev */
	u32 gen;
	u32 read_score; /* sum of inverse-bitmap values b = 2^(6 - floor(log2 N)) */
	u32 write_score;
	u32 read_sectors;
	u32 write_sectors;
	u64 last_ns;
	u64 size; /* i_size at the last access */
};

#define CP_HOT_PROBES 8       /* probed inline */
#define CP_HOT_PROBES_MAX 1024 /* then through bpf_loop */

/* ---- per-volume state (array "volumes", slot assigned by user space in struct cp_watch) ----
 * meta_* and the totals are cumulative (user space takes differences); epoch_* are reset by each block barrier. */
struct cp_volume {
	u64 meta_score;
	u64 meta_bytes;
	u64 meta_ios;
	u64 data_read_bytes;
	u64 data_write_bytes;
	u64 epoch_data_bytes; /* file data written since the last block barrier */
	u64 epoch_meta_bytes; /* metadata / journal written since the last block barrier */
	u64 epoch_start_ns;
	u64 barriers;
	u64 discards;
	u64 discard_sectors;
};

/* ---- direct I/O attribution: task storage "dio_store" (iomap hook) or LRU hash "dio_task": tid -> struct cp_dio
 * (syscall hooks) ---- */
struct cp_dio {
	u64 ino;
	u32 dev;
	u32 gen;
	u64 size;
};

/* ---- deletes, aggregated in the kernel (hash map "deletes": struct cp_delete_key -> struct cp_delete) ----
 * A file's end is the one record every unlinked file makes: with CP_CFG_BULK_DELETES set, it goes into this map and
 * user space takes the whole map once a tick (BPF_MAP_LOOKUP_AND_DELETE_BATCH into arrays) instead of one ring
 * record, decoded into one object, per file. Only when the map is full does a delete take the ring (struct
 * cp_ev_delete), so none is lost; the consumer reads both. Sized by user space before load. */
struct cp_delete_key {
	u64 ino;
	u32 dev; /* superblock s_dev */
	u32 gen;
};

struct cp_delete {
	u64 size;
	u64 ts_ns;
	u32 pid;
	u32 pad;
};

/* ---- drop counters (array "drops", one element) ---- */
struct cp_drops {
	u64 ringbuf_full;
	u64 hot_full; /* no free slot within CP_HOT_PROBES_MAX probes: the access was not counted */
	u64 other;    /* a direct I/O mark that could not be stored (its bios then count as metadata) */
};

/* ---- per-(volume, kind) drop counters (per-CPU array "vol_drops", index slot * CP_DROP_KINDS + kind) ----
 * kind: an event type (enum cp_event_type) whose ring was full, or CP_DROP_SYNC (a durability call that could not be
 * tracked from its entry to its result). */
#define CP_DROP_KINDS 8
#define CP_DROP_SYNC 7

/* ---- file-level durability calls, counted in the kernel (per-CPU array "sync_calls",
 * index slot * CP_SYNC_KINDS + enum cp_barrier_kind) ----
 * An unprivileged user can make millions a second: never one event each. Only calls that succeeded count: the entry
 * of the syscall notes the file in "sync_pending" (tid -> struct cp_sync_pending), its exit counts it if it returned 0.
 * Cumulative; user space takes differences. */
#define CP_SYNC_KINDS 16

struct cp_sync {
	u64 calls;
	u64 last_ino;
	u64 ts_ns;
	u32 last_pid;
	u32 pad;
};

struct cp_sync_pending {
	u64 ino;
	u32 slot;
	u32 kind; /* | CP_SYNC_FS_LEVEL: noted by the filesystem's own fsync (ext4_sync_file_enter, in "sync_store") */
};

#define CP_SYNC_FS_LEVEL 0x100

/* ---- ring-buffer events ----
 * Two rings, so that a storm of one kind cannot starve the other: "events" carries what the controller must never
 * miss (freed extents, deletes, journal commits, discards), "barrier_events" the block barriers (an unprivileged fsync
 * loop makes flushes). */
enum cp_event_type {
	CP_EV_FREE = 1,
	CP_EV_DELETE = 2,
	CP_EV_BARRIER = 3,
	CP_EV_DISCARD = 4,
	CP_EV_COMMIT = 5,
};

/* barrier kinds: same numbers as cachepilot.events.BarrierKind */
enum cp_barrier_kind {
	CP_BAR_PREFLUSH = 1,
	CP_BAR_FUA = 2,
	CP_BAR_EMPTY_FLUSH = 3,
	CP_BAR_FSYNC = 4,
	CP_BAR_FDATASYNC = 5,
	CP_BAR_SYNC_FILE_RANGE = 6,
	CP_BAR_SYNCFS = 7,
	CP_BAR_SYNC = 8,       /* sync(2) */
	CP_BAR_SYNC_WRITE = 9, /* a write on an O_SYNC / O_DSYNC file, or with RWF_SYNC / RWF_DSYNC */
	CP_BAR_MSYNC = 10,     /* msync(MS_SYNC) */
};

#define CP_BAR_F_PREFLUSH 0x1
#define CP_BAR_F_FUA      0x2

struct cp_ev_hdr {
	u32 type;
	u32 dev;
	u64 ts_ns;
};

struct cp_ev_free { /* ext4_free_blocks, xfs_extent_free_defer */
	struct cp_ev_hdr hdr;
	u64 ino;
	u64 block;
	u64 count;
	u32 flags;   /* ext4 EXT4_FREE_BLOCKS_*; bit 0 = metadata */
	u32 tid;     /* the journal transaction the blocks were freed in (valid if has_tid) */
	u32 has_tid; /* 0: no journal transaction (no journal, XFS) */
	u32 pad;
};

struct cp_ev_delete { /* a regular file's end: evicted with no link left */
	struct cp_ev_hdr hdr;
	u64 ino;
	u64 size;
	u32 gen;
	u32 pid;
};

struct cp_ev_barrier {
	struct cp_ev_hdr hdr;
	u64 ino;        /* 0 for block-level barriers */
	u64 data_bytes; /* epoch: file data written to the volume since the previous block barrier */
	u64 meta_bytes; /* epoch: metadata / journal written since the previous block barrier */
	u64 arg;        /* sync_file_range flags; bio size for block barriers */
	u32 pid;
	u32 kind;       /* enum cp_barrier_kind */
	u32 flags;      /* CP_BAR_F_* */
	u32 closes;     /* 1 if this barrier closed (reset) the epoch */
};

struct cp_ev_discard {
	struct cp_ev_hdr hdr;
	u64 sector;
	u64 nr_sectors;
	u32 volume; /* dev of the volume the device belongs to */
	u32 roles;
};

struct cp_ev_commit { /* jbd2_end_commit */
	struct cp_ev_hdr hdr;
	u32 transaction;
	u32 pad;
};

#endif /* CACHEPILOT_H */
