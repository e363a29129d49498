/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * A file's end, freed extents with their journal transaction, journal commits.
 */
#ifndef CP_FREED_BPF_H
#define CP_FREED_BPF_H

/* ---- freed extents, deletes, journal commits ---- */

/*
 * The journal transaction that frees these blocks: ext4_free_blocks runs under the caller's jbd2 handle
 * (current->journal_info), and mballoc keeps the blocks busy until exactly that handle's transaction commits
 * (ext4_mb_free_metadata records handle->h_transaction->t_tid; same on 6.1 and 6.18). Without a journal,
 * journal_info is only ext4's nesting counter (a small integer), so the superblock's journal is checked first; a handle
 * of another journal (never expected) falls back to the running transaction. Data blocks in data=writeback are
 * released at once: their tid is still the handle's (waiting for it is merely conservative).
 */
#ifdef CP_BCC
/* The headers have no struct ext4_sb_info (fs/ext4/ext4.h): the handle alone. Without a journal journal_info is ext4's
 * nesting counter, below EXT4_NOJOURNAL_MAX_REF_COUNT (4096), never a handle's address. */
static __always_inline bool ext4_free_tid(struct inode *inode, u32 *tid)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	handle_t *handle = BPF_CORE_READ(task, journal_info);
	transaction_t *txn = (unsigned long)handle >= 4096 ? BPF_CORE_READ(handle, h_transaction) : NULL;
	if (!txn)
		return false;
	*tid = BPF_CORE_READ(txn, t_tid);
	return true;
}
#else
static __always_inline bool ext4_free_tid(struct inode *inode, u32 *tid)
{
	struct ext4_sb_info *sbi = BPF_CORE_READ(inode, i_sb, s_fs_info);
	journal_t *journal = BPF_CORE_READ(sbi, s_journal);
	if (!journal)
		return false;
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	handle_t *handle = BPF_CORE_READ(task, journal_info);
	transaction_t *txn = handle ? BPF_CORE_READ(handle, h_transaction) : NULL;
	if (!txn || BPF_CORE_READ(txn, t_journal) != journal)
		txn = BPF_CORE_READ(journal, j_running_transaction);
	if (!txn)
		return false;
	*tid = BPF_CORE_READ(txn, t_tid);
	return true;
}
#endif

SEC("tp_btf/ext4_free_blocks")
int BPF_PROG(on_ext4_free_blocks, struct inode *inode, u64 block, unsigned long count, int flags)
{
	u32 dev = BPF_CORE_READ(inode, i_sb, s_dev);
	struct cp_watch *w = watch_of(dev, CP_ROLE_FS);
	if (!w)
		return 0;
	u32 tid = 0;
	bool has_tid = ext4_free_tid(inode, &tid);
	struct cp_ev_free *e = reserve_event(sizeof(*e), CP_EV_FREE, dev, w->slot, bpf_ktime_get_ns());
	if (!e)
		return 0;
	e->ino = BPF_CORE_READ(inode, i_ino);
	e->block = block;
	e->count = count;
	e->flags = flags;
	e->tid = tid;
	e->has_tid = has_tid;
	e->pad = 0;
	submit(e, sizeof(*e));
	return 0;
}

/*
 * XFS frees extents through deferred intents (after unlink, truncate, punch hole; in a background worker). Blocks are
 * reported as linear fs blocks (agno * agblocks + agbno), like ext4's. The owner is the inode when XFS records it
 * (data extents of a file), else 0 ("blocks were freed on this filesystem").
 */
#ifndef CP_BCC /* the headers have no XFS structures */
#define XFS_EFI_BMBT_BLOCK_ (1U << 2)
#define XFS_EFI_REALTIME_ (1U << 5)

SEC("tp_btf/xfs_extent_free_defer")
int BPF_PROG(on_xfs_extent_free, struct xfs_mount *mp, struct xfs_extent_free_item *xefi)
{
	u32 dev = mp->m_super->s_dev;
	struct cp_watch *w = watch_of(dev, CP_ROLE_FS);
	if (!w)
		return 0;
	u64 fsb = xefi->xefi_startblock;
	u32 flags = xefi->xefi_flags;
	u8 agblklog = mp->m_sb.sb_agblklog;
	u64 block = fsb;
	if (!(flags & XFS_EFI_REALTIME_) && agblklog < 64)
		block = (fsb >> agblklog) * mp->m_sb.sb_agblocks + (fsb & ((1ULL << agblklog) - 1));
	u64 owner = xefi->xefi_owner;
	struct cp_ev_free *e = reserve_event(sizeof(*e), CP_EV_FREE, dev, w->slot, bpf_ktime_get_ns());
	if (!e)
		return 0;
	e->ino = owner >> 62 ? 0 : owner; /* XFS_RMAP_OWN_* special owners are negative */
	e->block = block;
	e->count = xefi->xefi_blockcount;
	e->flags = (flags & XFS_EFI_BMBT_BLOCK_) ? 1 : 0;
	e->tid = 0;
	e->has_tid = 0; /* XFS: a log sequence, not a jbd2 tid; FITRIM skips busy extents itself */
	e->pad = 0;
	submit(e, sizeof(*e));
	return 0;
}
#endif

/*
 * A delete into the "deletes" map when user space asked for them in bulk (CP_CFG_BULK_DELETES); false when it did not,
 * or the map is full: then the ring carries it. The bcc build has no such map: its deletes always take the ring.
 */
static __always_inline bool delete_in_map(struct file_id *id, u64 size, u64 now, u32 pid)
{
#ifdef CP_BCC
	return false;
#else
	struct cp_config *c = cfg();
	if (!c || !(c->flags & CP_CFG_BULK_DELETES))
		return false;
	struct cp_delete_key k = {.ino = id->ino, .dev = id->dev, .gen = id->gen};
	struct cp_delete v = {.size = size, .ts_ns = now, .pid = pid};
	return bpf_map_update_elem(&deletes, &k, &v, BPF_ANY) == 0;
#endif
}

/*
 * A file's end: the inode is evicted with no link left. Whatever caused it (the last unlink of a closed file, the last
 * close of an unlinked open file, a rename over it, an O_TMPFILE never linked, orphan clean-up at mount), this is when
 * its blocks are freed; an inode merely dropped from the cache still has links and is not reported.
 */
SEC("tp_btf/ext4_evict_inode")
int BPF_PROG(on_ext4_evict, struct inode *inode)
{
	struct file_id id;
	struct cp_watch *w;
	if (is_self() || !inode_id(inode, &id) || !(w = watch_of(id.dev, CP_ROLE_FS)))
		return 0;
	if (BPF_CORE_READ(inode, i_nlink) != 0)
		return 0;
	u64 size = BPF_CORE_READ(inode, i_size), now = bpf_ktime_get_ns();
	u32 pid = (u32)(bpf_get_current_pid_tgid() >> 32);
	if (delete_in_map(&id, size, now, pid))
		return 0;
	struct cp_ev_delete *e = reserve_event(sizeof(*e), CP_EV_DELETE, id.dev, w->slot, now);
	if (!e)
		return 0;
	e->ino = id.ino;
	e->size = size;
	e->gen = id.gen;
	e->pid = pid;
	submit(e, sizeof(*e));
	return 0;
}

SEC("tp_btf/jbd2_end_commit")
int BPF_PROG(on_jbd2_end_commit, journal_t *journal, transaction_t *txn)
{
	u32 dev = BPF_CORE_READ(journal, j_fs_dev, bd_dev);
	struct cp_watch *w = watch_of(dev, CP_ROLE_FS);
	if (!w)
		return 0;
	struct cp_ev_commit *e = reserve_event(sizeof(*e), CP_EV_COMMIT, dev, w->slot, bpf_ktime_get_ns());
	if (!e)
		return 0;
	e->transaction = BPF_CORE_READ(txn, t_tid);
	e->pad = 0;
	submit(e, sizeof(*e));
	return 0;
}

#endif /* CP_FREED_BPF_H */
