/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Direct-I/O marks: the file a task is doing direct I/O on, for bios that only carry the user's buffer.
 */
#ifndef CP_DIO_BPF_H
#define CP_DIO_BPF_H

/* ---- direct I/O attribution ---- */

static __always_inline void dio_set(struct file_id *id)
{
	u32 tid = (u32)bpf_get_current_pid_tgid();
	struct cp_dio *cur = bpf_map_lookup_elem(&dio_task, &tid);

	if (cur && cur->ino == id->ino && cur->dev == id->dev && cur->gen == id->gen) {
		cur->size = id->size;
		return;
	}
	struct cp_dio d = {.ino = id->ino, .dev = id->dev, .gen = id->gen, .size = id->size};
	if (bpf_map_update_elem(&dio_task, &tid, &d, BPF_ANY)) {
		struct cp_drops *dr = drop_counters();
		if (dr)
			__sync_fetch_and_add(&dr->other, 1);
	}
}

static __always_inline void dio_clear(void)
{
	u32 tid = (u32)bpf_get_current_pid_tgid();
	if (bpf_map_lookup_elem(&dio_task, &tid))
		bpf_map_delete_elem(&dio_task, &tid);
}

#ifndef CP_BCC /* iomap's direct-I/O tracepoints (6.18): task storage, which needs BTF */
/*
 * The task is about to do direct I/O on a file: bios it submits with pages that belong to no file (the user's buffer)
 * are that file's. The mark lives while the task submits that I/O: it ends when the I/O completes (synchronous) or is
 * queued (asynchronous: every bio has been submitted by then), so a later raw-device read is not the file's.
 */
SEC("tp_btf/iomap_dio_rw_begin")
int BPF_PROG(on_dio_begin, struct kiocb *iocb, struct iov_iter *iter, unsigned int dio_flags, size_t done_before)
{
	struct file *file = iocb->ki_filp;
	struct file_id id = {};
	struct cp_dio *d;

	if (!file || !inode_id_btf(file->f_inode, &id))
		id.ino = 0; /* not a regular file: clear the mark */
	d = bpf_task_storage_get(&dio_store, bpf_get_current_task_btf(), 0,
				 id.ino ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);
	if (!d) {
		struct cp_drops *dr = id.ino ? drop_counters() : NULL;
		if (dr)
			__sync_fetch_and_add(&dr->other, 1);
		return 0;
	}
	d->ino = id.ino;
	d->dev = id.dev;
	d->gen = id.gen;
	d->size = id.size;
	return 0;
}

static __always_inline void dio_end(struct inode *inode)
{
	struct cp_dio *d = bpf_task_storage_get(&dio_store, bpf_get_current_task_btf(), 0, 0);
	/* an asynchronous completion runs in whatever task it interrupted: only a mark for this very file is ended */
	if (d && inode && d->ino == inode->i_ino && d->dev == inode->i_sb->s_dev)
		d->ino = 0;
}

SEC("tp_btf/iomap_dio_complete")
int BPF_PROG(on_dio_complete, struct kiocb *iocb, int error, ssize_t ret)
{
	struct file *file = iocb->ki_filp;
	if (file)
		dio_end(file->f_inode);
	return 0;
}

SEC("tp_btf/iomap_dio_rw_queued")
int BPF_PROG(on_dio_queued, struct inode *inode, loff_t offset, u64 length)
{
	dio_end(inode);
	return 0;
}
#endif

/* the mark lives from the syscall's entry to its exit: the bios of a direct read or write are submitted in between */
static __always_inline int dio_syscall(long fd)
{
	struct file *f = fd_file(fd);
	struct file_id id;

	if (f && (BPF_CORE_READ(f, f_flags) & O_DIRECT_) && inode_id(BPF_CORE_READ(f, f_inode), &id) &&
	    watch_of(id.dev, CP_ROLE_VOLUME | CP_ROLE_FS))
		dio_set(&id);
	return 0;
}

#define DIO_SYSCALL(name)                                                \
	SEC("tracepoint/syscalls/sys_enter_" #name)                     \
	int sys_dio_##name(struct trace_event_raw_sys_enter *ctx)        \
	{                                                                \
		return dio_syscall(ctx->args[0]);                        \
	}                                                                \
	SEC("tracepoint/syscalls/sys_exit_" #name)                      \
	int sys_dio_exit_##name(struct trace_event_raw_sys_exit *ctx)    \
	{                                                                \
		dio_clear();                                             \
		return 0;                                                \
	}

DIO_SYSCALL(read)
DIO_SYSCALL(write)
DIO_SYSCALL(pread64)
DIO_SYSCALL(pwrite64)
DIO_SYSCALL(readv)
DIO_SYSCALL(writev)
DIO_SYSCALL(preadv)
DIO_SYSCALL(pwritev)
DIO_SYSCALL(preadv2)
DIO_SYSCALL(pwritev2)

#endif /* CP_DIO_BPF_H */
