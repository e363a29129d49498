/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Per-file hotness: the open-addressed table user space drains each tick.
 */
#ifndef CP_HOTNESS_BPF_H
#define CP_HOTNESS_BPF_H

struct hot_ctx {
	u64 ino;
	u64 size;
	u64 now;
	u64 idx;
	u64 nslots;
	u64 base; /* the active half's first slot */
	u32 dev;
	u32 gen;
	u32 score;
	u32 sectors;
	u32 write;
	u32 done;
};

/* Add to a u32 counter of a slot. The bcc build's LLVM targets BPF v1 (bcc sets no CPU), which has no 32-bit atomics:
 * it adds to the aligned 64-bit word holding the counter (read/write pairs, drained each tick: no carry across). */
#ifdef CP_BCC
#define HOT_ADD32(s, member, v)                                                                                   \
	__sync_fetch_and_add((u64 *)((char *)(s) + (offsetof(struct cp_hot_slot, member) & ~7)),                 \
			     (u64)(v) << ((offsetof(struct cp_hot_slot, member) & 4) * 8))
#else
#define HOT_ADD32(s, member, v) __sync_fetch_and_add(&(s)->member, (v))
#endif

static __always_inline void hot_mark_claimed(u32 k)
{
	u32 w = k >> 6;
	u64 *word = bpf_map_lookup_elem(&hot_claimed, &w);

	if (word)
		__sync_fetch_and_or(word, 1ULL << (k & 63));
}

/* Probe slot idx + i: claim it if free, count into it if it is this file's. 1 = done (counted or table end). */
static __always_inline long hot_try(u32 i, struct hot_ctx *h)
{
	u64 k64 = h->idx + i;
	if (k64 >= h->nslots)
		k64 -= h->nslots;
	u32 k = (u32)(k64 + h->base);
	struct cp_hot_slot *s = bpf_map_lookup_elem(&hot_slots, &k);
	u64 t;
	if (!s)
		return 1;
	t = s->ino;
	if (t == 0) {
		t = __sync_val_compare_and_swap(&s->ino, 0, h->ino);
		if (t == 0) { /* claimed */
			s->dev = h->dev;
			s->gen = h->gen;
			t = h->ino;
			hot_mark_claimed(k);
		}
	}
	if (t != h->ino || s->dev != h->dev || s->gen != h->gen)
		return 0;
	if (h->write) {
		HOT_ADD32(s, write_score, h->score);
		HOT_ADD32(s, write_sectors, h->sectors);
	} else {
		HOT_ADD32(s, read_score, h->score);
		HOT_ADD32(s, read_sectors, h->sectors);
	}
	s->last_ns = h->now;
	s->size = h->size;
	h->done = 1;
	return 1;
}

#ifndef CP_BCC
static long hot_try_far(u32 i, struct hot_ctx *h)
{
	return hot_try(i + CP_HOT_PROBES, h);
}
#endif

/* slots probed inline: the bcc build probes no further (bcc cannot load bpf_loop's callback, a subprogram) */
#ifndef CP_HOT_INLINE
#define CP_HOT_INLINE CP_HOT_PROBES
#endif

/*
 * Open addressing with linear probing at a 0.76 load factor has long probe tails: the first CP_HOT_PROBES slots are
 * probed inline (the common case), the rest of the run through bpf_loop (checked once by the verifier), up to
 * CP_HOT_PROBES_MAX, so a tick with max_files files fits.
 */
static __always_inline void hot_add(struct file_id *id, bool write, u32 score, u32 sectors)
{
	struct cp_config *c = cfg();

	if (!c || !c->nslots || !id->ino)
		return;
	struct hot_ctx h = {.ino = id->ino, .size = id->size, .now = c->clock_ns, .nslots = c->nslots,
			    .base = c->hot_base, .dev = id->dev, .gen = id->gen, .score = score, .sectors = sectors,
			    .write = write};
	/* multiply-shift range reduction: no division on the hot path */
	h.idx = ((hash_key(id->dev, id->ino, id->gen) >> 32) * (h.nslots & 0xffffffff)) >> 32;
	for (int i = 0; i < CP_HOT_INLINE; i++)
		if (hot_try(i, &h))
			break;
#ifndef CP_BCC
	if (!h.done && h.nslots > CP_HOT_PROBES) {
		u64 more = h.nslots - CP_HOT_PROBES;
		bpf_loop(more < CP_HOT_PROBES_MAX - CP_HOT_PROBES ? more : CP_HOT_PROBES_MAX - CP_HOT_PROBES,
			 hot_try_far, &h, 0);
	}
#endif
	if (h.done)
		return;
	struct cp_drops *d = drop_counters();
	if (d)
		__sync_fetch_and_add(&d->hot_full, 1);
}

#endif /* CP_HOTNESS_BPF_H */
