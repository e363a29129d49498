/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Block I/O of watched volumes: hotness, metadata, epochs and block barriers, discards, split bios.
 */
#ifndef CP_BLOCKIO_BPF_H
#define CP_BLOCKIO_BPF_H

static __always_inline void emit_block_barrier(u32 dev, u32 slot, struct cp_volume *v, u32 kind, u32 flags,
					      u64 size)
{
	u64 data = __sync_lock_test_and_set(&v->epoch_data_bytes, 0);
	u64 meta = __sync_lock_test_and_set(&v->epoch_meta_bytes, 0);
	u64 now = bpf_ktime_get_ns();

	v->epoch_start_ns = now;
	__sync_fetch_and_add(&v->barriers, 1);
	struct cp_ev_barrier *e = reserve_on(&barrier_events, sizeof(*e), CP_EV_BARRIER, dev, slot, now);
	if (!e)
		return;
	e->ino = 0;
	e->data_bytes = data;
	e->meta_bytes = meta;
	e->arg = size;
	e->pid = (u32)(bpf_get_current_pid_tgid() >> 32);
	e->kind = kind;
	e->flags = flags;
	e->closes = 1;
	submit_barrier(e, sizeof(*e));
}

/* a discard counts for every volume the device belongs to (a cache device shared by several volumes) */
struct discard_ctx {
	u64 mask;
	u64 sectors;
};

/* bpf_loop: the verifier checks the body once (an open-coded loop over 64 unknown bits explodes its state count); the
 * bcc build, which cannot load bpf_loop's callback (a subprogram), unrolls it */
#ifdef CP_BCC
static __always_inline long count_discard_slot(u32 i, struct discard_ctx *dc)
#else
static long count_discard_slot(u32 i, struct discard_ctx *dc)
#endif
{
	u32 slot = i;
	if (!(dc->mask & (1ULL << (i & 63))))
		return 0;
	struct cp_volume *v = bpf_map_lookup_elem(&volumes, &slot);
	if (v) {
		__sync_fetch_and_add(&v->discards, 1);
		__sync_fetch_and_add(&v->discard_sectors, dc->sectors);
	}
	return 0;
}

static __always_inline void count_discard(struct cp_watch *w, u64 sectors)
{
	struct discard_ctx dc = {.mask = w->lower_of, .sectors = sectors};
	if (w->roles & CP_ROLE_VOLUME && w->slot < CP_MAX_VOLUMES)
		dc.mask |= 1ULL << w->slot;
#ifdef CP_BCC
#pragma unroll
	for (u32 i = 0; i < CP_MAX_VOLUMES; i++)
		count_discard_slot(i, &dc);
#else
	bpf_loop(CP_MAX_VOLUMES, count_discard_slot, &dc, 0);
#endif
}

/* fast: this kernel has bpf_rdonly_cast (on_bio_queue), else on_bio_queue_compat; see core_fixes.bpf.h */
static __always_inline int bio_queue(struct bio *bio, bool fast)
{
	u32 dev = BTF_READ(bio, bi_bdev, bd_dev);
	struct cp_watch *w = find_watch(dev);
	if (!w)
		return 0;

	u32 opf = BTF_READ(bio, bi_opf);
	u32 op = opf & REQ_OP_MASK_;
	u64 size = BTF_READ(bio, bi_iter.bi_size);

	if (op == REQ_OP_DISCARD_) {
		/* a filesystem stacked on the volume: its discards are counted where they reach the volume */
		if (!(w->roles & (CP_ROLE_VOLUME | CP_ROLE_LOWER)))
			return 0;
		count_discard(w, size >> 9);
		struct cp_ev_discard *e = reserve_event(sizeof(*e), CP_EV_DISCARD, dev, w->slot, bpf_ktime_get_ns());
		if (!e)
			return 0;
		e->sector = BPF_CORE_READ(bio, bi_iter.bi_sector);
		e->nr_sectors = size >> 9;
		e->volume = w->volume;
		e->roles = w->roles;
		submit(e, sizeof(*e));
		return 0;
	}
	if (!(w->roles & CP_ROLE_VOLUME))
		return 0;
	if (op != REQ_OP_READ_ && op != REQ_OP_WRITE_)
		return 0;

	struct cp_volume *v = bpf_map_lookup_elem(&volumes, &w->slot);
	struct cp_config *c = cfg();
	if (!v || !c)
		return 0;

	u32 preflush = 1U << bpf_core_enum_value(enum req_flag_bits, __REQ_PREFLUSH);
	u32 fua = 1U << bpf_core_enum_value(enum req_flag_bits, __REQ_FUA);
	u32 meta = 1U << bpf_core_enum_value(enum req_flag_bits, __REQ_META);
	bool write = op == REQ_OP_WRITE_;
	u32 bflags = ((opf & preflush) ? CP_BAR_F_PREFLUSH : 0) | ((opf & fua) ? CP_BAR_F_FUA : 0);

	/* a flush before the payload closes the epoch before the payload is counted */
	if (write && (bflags & CP_BAR_F_PREFLUSH) && !(bflags & CP_BAR_F_FUA))
		emit_block_barrier(dev, w->slot, v, size ? CP_BAR_PREFLUSH : CP_BAR_EMPTY_FLUSH, bflags, size);

	if (size) {
		struct file_id id = {};
		bool is_file = !(opf & meta) && bio_file(c, bio, dev, w->fs_dev, &id, fast);
		if (is_file && !is_self())
			hot_add(&id, write, inv_bitmap(size), size >> 9);
		if (is_file) {
			if (write) {
				__sync_fetch_and_add(&v->data_write_bytes, size);
				__sync_fetch_and_add(&v->epoch_data_bytes, size);
			} else {
				__sync_fetch_and_add(&v->data_read_bytes, size);
			}
		} else {
			__sync_fetch_and_add(&v->meta_score, inv_bitmap(size));
			__sync_fetch_and_add(&v->meta_bytes, size);
			__sync_fetch_and_add(&v->meta_ios, 1);
			if (write)
				__sync_fetch_and_add(&v->epoch_meta_bytes, size);
		}
	}

	/* FUA makes the payload itself durable: it belongs to the epoch it closes */
	if (write && (bflags & CP_BAR_F_FUA))
		emit_block_barrier(dev, w->slot, v,
				   (bflags & CP_BAR_F_PREFLUSH) ? (size ? CP_BAR_PREFLUSH : CP_BAR_EMPTY_FLUSH) : CP_BAR_FUA,
				   bflags, size);
	return 0;
}

#ifndef CP_BCC /* bpf_rdonly_cast needs BTF */
SEC("tp_btf/block_bio_queue")
int BPF_PROG(on_bio_queue, struct bio *bio)
{
	return bio_queue(bio, true);
}
#endif

SEC("tp_btf/block_bio_queue")
int BPF_PROG(on_bio_queue_compat, struct bio *bio)
{
	return bio_queue(bio, false);
}

/*
 * block_split(split, new_sector): the queued bio was counted once with its whole size; now it is two pieces:
 * `split` (sent on) and the remainder (bio->bi_private, already advanced), which is not traced again. Re-count the
 * score as two pieces: + b(split) + b(rest) - b(split + rest). Bytes and epochs are unchanged.
 */
SEC("tp_btf/block_split")
int BPF_PROG(on_bio_split, struct bio *split, unsigned int new_sector)
{
	u32 dev = BPF_CORE_READ(split, bi_bdev, bd_dev);
	struct cp_watch *w = watch_of(dev, CP_ROLE_VOLUME);
	struct cp_config *c = cfg();
	if (!w || !c)
		return 0;
	u32 opf = BPF_CORE_READ(split, bi_opf);
	u32 op = opf & REQ_OP_MASK_;
	if (op != REQ_OP_READ_ && op != REQ_OP_WRITE_)
		return 0;
	/* device-mapper traces its own remainder (the original bio, trimmed) with new_sector == its sector: that is dm
	 * working on the volume's bio, not the block layer splitting it; the bio counted once at the volume stays. */
	if (BPF_CORE_READ(split, bi_iter.bi_sector) == new_sector)
		return 0;
	struct bio *rest = BPF_CORE_READ(split, bi_private);
	if (!rest || BPF_CORE_READ(rest, bi_iter.bi_sector) != new_sector)
		return 0;
	u64 s1 = BPF_CORE_READ(split, bi_iter.bi_size);
	u64 r = BPF_CORE_READ(rest, bi_iter.bi_size);
	if (!s1 || !r)
		return 0;
	u32 delta = inv_bitmap(s1) + inv_bitmap(r) - inv_bitmap(s1 + r);
	u32 meta = 1U << bpf_core_enum_value(enum req_flag_bits, __REQ_META);
	struct file_id id = {};
	if (!(opf & meta) && bio_file(c, split, dev, w->fs_dev, &id, false)) {
		if (!is_self() && delta)
			hot_add(&id, op == REQ_OP_WRITE_, delta, 0);
	} else {
		struct cp_volume *v = bpf_map_lookup_elem(&volumes, &w->slot);
		if (v) {
			__sync_fetch_and_add(&v->meta_score, delta);
			__sync_fetch_and_add(&v->meta_ios, 1);
		}
	}
	return 0;
}

#endif /* CP_BLOCKIO_BPF_H */
