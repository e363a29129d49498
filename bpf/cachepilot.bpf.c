// SPDX-License-Identifier: GPL-2.0-only
/*
 * cachepilot kernel half: files, deletes, freed extents, barriers, discards and durability calls of watched volumes.
 * One object, built from focused units that share cachepilot.h (the contract with user space), core_fixes.bpf.h
 * (kernel-version differences) and common.bpf.h (maps and helpers):
 *   hotness.bpf.h      the per-file hotness table
 *   attribution.bpf.h  which file (or metadata) a bio belongs to
 *   blockio.bpf.h      tp_btf/block_bio_queue, tp_btf/block_split: hotness, metadata, epochs, block barriers, discards
 *   dio.bpf.h          direct-I/O marks: tp_btf/iomap_dio_{rw_begin,complete,rw_queued} (6.18) or the read/write
 *                      syscall tracepoints (6.1), attached only for stacked volumes when iomap's bios name their file
 *   freed.bpf.h        tp_btf/ext4_evict_inode (a file's end), tp_btf/ext4_free_blocks, tp_btf/xfs_extent_free_defer,
 *                      tp_btf/jbd2_end_commit
 *   sync.bpf.h         tp_btf/ext4_sync_file_{enter,exit} (every durability point on ext4), tp_btf/ext4_sync_fs,
 *                      sys_{enter,exit}_{sync_file_range,syncfs}, and sys_{enter,exit}_{fsync,fdatasync} (attached
 *                      only when a filesystem other than ext4 is watched): counted per volume and kind
 *   bcache.bpf.h       tracepoint/bcache/bcache_alloc_fail (optional: bcache loaded): read-miss inserts refused,
 *                      counted per watched cache device
 * All hooks are tracepoints (this host refuses fentry and has no kprobes).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "cachepilot.h"
#include "core_fixes.bpf.h"
#include "common.bpf.h"
#include "hotness.bpf.h"
#include "attribution.bpf.h"
#include "blockio.bpf.h"
#include "dio.bpf.h"
#include "freed.bpf.h"
#include "sync.bpf.h"
#include "bcache.bpf.h"

char LICENSE[] SEC("license") = "GPL";


/* keep every event layout in the object's BTF (the layout test and bpftool read them from there) */
struct cp_ev_hdr *cp_btf_ev_hdr __attribute__((unused));
struct cp_ev_free *cp_btf_ev_free __attribute__((unused));
struct cp_ev_delete *cp_btf_ev_delete __attribute__((unused));
struct cp_delete_key *cp_btf_delete_key __attribute__((unused));
struct cp_delete *cp_btf_delete __attribute__((unused));
struct cp_ev_barrier *cp_btf_ev_barrier __attribute__((unused));
struct cp_ev_discard *cp_btf_ev_discard __attribute__((unused));
struct cp_ev_commit *cp_btf_ev_commit __attribute__((unused));
struct cp_sync *cp_btf_sync __attribute__((unused));
struct cp_sync_pending *cp_btf_sync_pending __attribute__((unused));
