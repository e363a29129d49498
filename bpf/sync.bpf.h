/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Durability calls and points, counted in the kernel per volume and kind (only those that succeed).
 */
#ifndef CP_SYNC_BPF_H
#define CP_SYNC_BPF_H

/* ---- file-level durability calls: counted per volume and kind, only when they succeed ---- */

static __always_inline int sync_enter(long fd, u32 kind)
{
	if (is_self())
		return 0;
	struct file *f = fd_file(fd);
	if (!f)
		return 0;
	struct inode *inode = BPF_CORE_READ(f, f_inode);
	struct cp_watch *w = watch_of(BPF_CORE_READ(inode, i_sb, s_dev), CP_ROLE_FS);
	if (!w)
		return 0;
	u32 tid = (u32)bpf_get_current_pid_tgid();
	struct cp_sync_pending p = {.ino = kind == CP_BAR_SYNCFS ? 0 : BPF_CORE_READ(inode, i_ino), .slot = w->slot,
				    .kind = kind};
	if (bpf_map_update_elem(&sync_pending, &tid, &p, BPF_ANY))
		count_drop(w->slot, CP_DROP_SYNC);
	return 0;
}

static __always_inline void count_sync(u32 slot, u32 kind, u64 ino, u32 pid)
{
	if (slot >= CP_MAX_VOLUMES || kind >= CP_SYNC_KINDS)
		return;
	u32 idx = slot * CP_SYNC_KINDS + kind;
	struct cp_sync *c = bpf_map_lookup_elem(&sync_calls, &idx);
	if (c) { /* per-CPU: plain stores */
		c->calls += 1;
		c->last_ino = ino;
		c->last_pid = pid;
		c->ts_ns = bpf_ktime_get_ns();
	}
}

static __always_inline int sync_exit(long ret)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	u32 tid = (u32)pid_tgid;
	struct cp_sync_pending *p = bpf_map_lookup_elem(&sync_pending, &tid);
	if (!p)
		return 0;
	if (ret == 0)
		count_sync(p->slot, p->kind, p->ino, (u32)(pid_tgid >> 32));
	bpf_map_delete_elem(&sync_pending, &tid);
	return 0;
}

#define SYNC_ENTER(name, kind)                                           \
	SEC("tracepoint/syscalls/sys_enter_" #name)                     \
	int sys_##name(struct trace_event_raw_sys_enter *ctx)            \
	{                                                                \
		return sync_enter(ctx->args[0], kind);                   \
	}
#define SYNC_EXIT(name)                                                  \
	SEC("tracepoint/syscalls/sys_exit_" #name)                      \
	int sys_exit_##name(struct trace_event_raw_sys_exit *ctx)        \
	{                                                                \
		return sync_exit(ctx->ret);                              \
	}

SYNC_ENTER(fsync, CP_BAR_FSYNC)
SYNC_EXIT(fsync)
SYNC_ENTER(fdatasync, CP_BAR_FDATASYNC)
SYNC_EXIT(fdatasync)
SYNC_ENTER(syncfs, CP_BAR_SYNCFS)
SYNC_EXIT(syncfs)
SYNC_EXIT(sync_file_range)

/* the loader's claim of its own tgid (CP_SELF_CLAIM_FD in cachepilot.h) */
static __always_inline void claim_self(u64 nonce)
{
	struct cp_config *c = cfg();
	if (c && c->nonce && nonce == c->nonce) {
		c->self_tgid = (u32)(bpf_get_current_pid_tgid() >> 32);
		c->nonce = 0;
	}
}

SEC("tracepoint/syscalls/sys_enter_sync_file_range")
CP_TP_PROG(sys_sync_file_range, struct trace_event_raw_sys_enter)
{
	if ((int)ctx->args[0] == CP_SELF_CLAIM_FD) {
		claim_self(ctx->args[1]);
		return 0;
	}
	return sync_enter(ctx->args[0], CP_BAR_SYNC_FILE_RANGE);
}

/*
 * On ext4 every durability point ends in the filesystem's fsync (ext4_sync_file, via vfs_fsync_range): the fsync and
 * fdatasync system calls, writes on O_SYNC / O_DSYNC files or with RWF_DSYNC (generic_write_sync), msync(MS_SYNC),
 * io_uring's fsync, fsync through overlayfs (the upper file's fsync). ext4_sync_file_{enter,exit} sees them all with
 * the real file and the result (ext4's result is the system call's). The fsync-family syscall tracepoints above are
 * attached only when a filesystem other than ext4 is watched (user space decides); then an fsync syscall on ext4 is
 * left to them (its entry is pending). The kind comes from the system call the task is in, else the file's flags.
 */

static __always_inline u32 implicit_sync_kind(struct file *file, int datasync)
{
	long nr = current_syscall();
	if (nr == NR_FSYNC_)
		return CP_BAR_FSYNC;
	if (nr == NR_FDATASYNC_)
		return CP_BAR_FDATASYNC;
	if (nr == NR_MSYNC_)
		return CP_BAR_MSYNC;
	if (BPF_CORE_READ(file, f_flags) & O_DSYNC_) /* O_SYNC includes O_DSYNC */
		return CP_BAR_SYNC_WRITE;
	if (nr == NR_WRITE_ || nr == NR_PWRITE64_ || nr == NR_WRITEV_ || nr == NR_PWRITEV_ || nr == NR_PWRITEV2_)
		return CP_BAR_SYNC_WRITE; /* RWF_SYNC / RWF_DSYNC */
	return datasync ? CP_BAR_FDATASYNC : CP_BAR_FSYNC; /* io_uring, overlayfs, nfsd... */
}

/* this task's ext4 fsync in progress (created if asked): task storage, or in the bcc build (task storage needs BTF) an
 * LRU hash by thread id with sync_pending's definition ("sync_task", created by its loader) */
#ifdef CP_BCC
static __always_inline struct cp_sync_pending *sync_task_get(bool create)
{
	u32 tid = (u32)bpf_get_current_pid_tgid();
	struct cp_sync_pending *p = bpf_map_lookup_elem(&sync_task, &tid);
	if (p || !create)
		return p;
	struct cp_sync_pending zero = {};
	bpf_map_update_elem(&sync_task, &tid, &zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(&sync_task, &tid);
}
#else
static __always_inline struct cp_sync_pending *sync_task_get(bool create)
{
	return bpf_task_storage_get(&sync_store, bpf_get_current_task_btf(), 0,
				    create ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);
}
#endif

SEC("tp_btf/ext4_sync_file_enter")
int BPF_PROG(on_ext4_sync_enter, struct file *file, int datasync)
{
	struct cp_config *c = cfg();
	if (!c || is_self())
		return 0;
	if (c->flags & CP_CFG_SYNC_SYSCALLS) {
		u32 tid = (u32)bpf_get_current_pid_tgid();
		if (bpf_map_lookup_elem(&sync_pending, &tid))
			return 0; /* an fsync syscall's own: counted at its exit */
	}
	struct inode *inode = BTF_READ(file, f_inode);
	struct cp_watch *w = watch_of(BTF_READ(inode, i_sb, s_dev), CP_ROLE_FS);
	if (!w)
		return 0;
	struct cp_sync_pending *p = sync_task_get(true);
	if (!p) {
		count_drop(w->slot, CP_DROP_SYNC);
		return 0;
	}
	p->ino = BTF_READ(inode, i_ino);
	p->slot = w->slot;
	p->kind = implicit_sync_kind(file, datasync) | CP_SYNC_FS_LEVEL;
	return 0;
}

SEC("tp_btf/ext4_sync_file_exit")
int BPF_PROG(on_ext4_sync_exit, struct inode *inode, int ret)
{
	struct cp_sync_pending *p = sync_task_get(false);
	if (!p || !(p->kind & CP_SYNC_FS_LEVEL))
		return 0;
	if (ret == 0)
		count_sync(p->slot, p->kind & ~CP_SYNC_FS_LEVEL, p->ino, (u32)(bpf_get_current_pid_tgid() >> 32));
	p->kind = 0;
	return 0;
}

/* sync(2) syncs every filesystem and cannot fail: one SYNC per watched filesystem it waited on */
SEC("tp_btf/ext4_sync_fs")
int BPF_PROG(on_ext4_sync_fs, struct super_block *sb, int wait)
{
	if (!wait || is_self() || current_syscall() != NR_SYNC_)
		return 0;
	struct cp_watch *w = watch_of(BTF_READ(sb, s_dev), CP_ROLE_FS);
	if (w)
		count_sync(w->slot, CP_BAR_SYNC, 0, (u32)(bpf_get_current_pid_tgid() >> 32));
	return 0;
}

#endif /* CP_SYNC_BPF_H */
