// SPDX-License-Identifier: GPL-2.0-only
/*
 * cachepilot kernel half: files, deletes, freed extents, barriers and discards of watched volumes.
 *
 * Hooks (all tracepoint based: this host refuses fentry and has no kprobes):
 *   tp_btf/block_bio_queue     every bio entering a block device: hotness, metadata bucket, epochs, barriers, discards
 *   tp_btf/block_split         a queued bio split by the block layer: each piece counts on its own
 *   tp_btf/iomap_dio_rw_begin  direct I/O attribution where the kernel has it (6.18); otherwise, chosen at load time,
 *   tracepoint/syscalls/sys_enter_{read,write,pread64,pwrite64,readv,writev,preadv,pwritev,preadv2,pwritev2}
 *   tp_btf/ext4_free_blocks, tp_btf/xfs_extent_free_defer   freed extents
 *   tp_btf/ext4_evict_inode    a file's end (deletes)  tp_btf/jbd2_end_commit   journal commits
 *   tracepoint/syscalls/sys_{enter,exit}_{fsync,fdatasync,sync_file_range,syncfs}   file-level durability calls
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "cachepilot.h"

char LICENSE[] SEC("license") = "GPL";

#define REQ_OP_MASK_ 0xff
#define REQ_OP_READ_ 0
#define REQ_OP_WRITE_ 1
#define REQ_OP_DISCARD_ 3
#define S_IFMT_ 00170000
#define S_IFREG_ 0100000
#define S_IFBLK_ 0060000
#define O_DIRECT_ 00040000
#define PAGE_SHIFT_ 12

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
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
	__uint(max_entries, 1 << 16); /* resized by user space before load */
	__type(key, u32);
	__type(value, struct cp_hot_slot);
} hot_slots SEC(".maps");

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
 * while attaching cannot leak an entry forever) */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, u32);
	__type(value, struct cp_sync_pending);
} sync_pending SEC(".maps");

static __always_inline struct cp_config *cfg(void)
{
	u32 zero = 0;
	return bpf_map_lookup_elem(&cp_config_map, &zero);
}

static __always_inline struct cp_drops *drop_counters(void)
{
	u32 zero = 0;
	return bpf_map_lookup_elem(&drops, &zero);
}

static __always_inline bool is_self(void)
{
	struct cp_config *c = cfg();
	if (!c || !(c->flags & CP_CFG_IGNORE_SELF))
		return false;
	return (u32)(bpf_get_current_pid_tgid() >> 32) == c->self_tgid;
}

static __always_inline void count_drop(u32 slot, u32 kind)
{
	u32 idx = slot * CP_DROP_KINDS + kind;
	u64 *n = bpf_map_lookup_elem(&vol_drops, &idx);
	if (n)
		*n += 1; /* per-CPU */
}

/* Reserve a ring-buffer event and fill its common header; a full ring is counted (globally and per volume and kind),
 * never silent. */
static __always_inline void *reserve_on(void *ring, u64 size, u32 type, u32 dev, u32 slot, u64 ts_ns)
{
	struct cp_ev_hdr *e = bpf_ringbuf_reserve(ring, size, 0);
	if (!e) {
		struct cp_drops *d = drop_counters();
		if (d)
			__sync_fetch_and_add(&d->ringbuf_full, 1);
		count_drop(slot, type);
		return NULL;
	}
	e->type = type;
	e->dev = dev;
	e->ts_ns = ts_ns;
	return e;
}

/* the events the controller must not miss: their own ring */
static __always_inline void *reserve_event(u64 size, u32 type, u32 dev, u32 slot, u64 ts_ns)
{
	return reserve_on(&events, size, type, dev, slot, ts_ns);
}

/* Rare events: the default (adaptive) wakeup, one per batch the consumer has not started on, so poll(-1) returns
 * after a lone delete. */
static __always_inline void submit(void *e)
{
	bpf_ringbuf_submit(e, 0);
}

/*
 * Block barriers can come by the hundred thousand a second: a wakeup per event would make the daemon's cost grow with
 * the barrier rate, so user space consumes them on its own schedule and is only woken when the ring is a quarter full.
 */
static __always_inline void submit_barrier(void *e)
{
	u64 avail = bpf_ringbuf_query(&barrier_events, BPF_RB_AVAIL_DATA);
	u64 size = bpf_ringbuf_query(&barrier_events, BPF_RB_RING_SIZE);
	bpf_ringbuf_submit(e, avail * 4 >= size ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP);
}

static __always_inline struct cp_watch *watch_of(u32 dev, u32 role)
{
	struct cp_watch *w = bpf_map_lookup_elem(&watched, &dev);
	if (!w || !(w->roles & role))
		return NULL;
	return w;
}

/* b = 2^(6 - floor(log2 N)), N = 4 KiB pages clamped to 1..64 */
static __always_inline u32 inv_bitmap(u64 bytes)
{
	u64 n = (bytes + 4095) >> PAGE_SHIFT_;
	if (n >= 64)
		return 1;
	if (n >= 32)
		return 2;
	if (n >= 16)
		return 4;
	if (n >= 8)
		return 8;
	if (n >= 4)
		return 16;
	if (n >= 2)
		return 32;
	return 64;
}

static __always_inline u64 hash_key(u32 dev, u64 ino, u32 gen)
{
	u64 h = ino * 0x9E3779B97F4A7C15ULL;
	h ^= (((u64)dev << 32) | gen) * 0xC2B2AE3D27D4EB4FULL;
	h ^= h >> 29;
	h *= 0xBF58476D1CE4E5B9ULL;
	h ^= h >> 32;
	return h;
}

struct file_id {
	u64 ino;
	u64 size;
	u32 dev;
	u32 gen;
};

struct hot_ctx {
	u64 ino;
	u64 size;
	u64 now;
	u64 idx;
	u64 nslots;
	u32 dev;
	u32 gen;
	u32 score;
	u32 sectors;
	u32 write;
	u32 done;
};

/* Probe slot idx + i: claim it if free, count into it if it is this file's. 1 = done (counted or table end). */
static __always_inline long hot_try(u32 i, struct hot_ctx *h)
{
	u64 k64 = h->idx + i;
	if (k64 >= h->nslots)
		k64 -= h->nslots;
	u32 k = (u32)k64;
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
		}
	}
	if (t != h->ino || s->dev != h->dev || s->gen != h->gen)
		return 0;
	if (h->write) {
		__sync_fetch_and_add(&s->write_score, h->score);
		__sync_fetch_and_add(&s->write_sectors, h->sectors);
	} else {
		__sync_fetch_and_add(&s->read_score, h->score);
		__sync_fetch_and_add(&s->read_sectors, h->sectors);
	}
	s->last_ns = h->now;
	s->size = h->size;
	h->done = 1;
	return 1;
}

static long hot_try_far(u32 i, struct hot_ctx *h)
{
	return hot_try(i + CP_HOT_PROBES, h);
}

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
	struct hot_ctx h = {.ino = id->ino, .size = id->size, .now = c->clock_ns, .nslots = c->nslots, .dev = id->dev,
			    .gen = id->gen, .score = score, .sectors = sectors, .write = write};
	/* multiply-shift range reduction: no division on the hot path */
	h.idx = ((hash_key(id->dev, id->ino, id->gen) >> 32) * (h.nslots & 0xffffffff)) >> 32;
	for (int i = 0; i < CP_HOT_PROBES; i++)
		if (hot_try(i, &h))
			break;
	if (!h.done && h.nslots > CP_HOT_PROBES) {
		u64 more = h.nslots - CP_HOT_PROBES;
		bpf_loop(more < CP_HOT_PROBES_MAX - CP_HOT_PROBES ? more : CP_HOT_PROBES_MAX - CP_HOT_PROBES,
			 hot_try_far, &h, 0);
	}
	if (h.done)
		return;
	struct cp_drops *d = drop_counters();
	if (d)
		__sync_fetch_and_add(&d->hot_full, 1);
}


static __always_inline bool inode_id(struct inode *inode, struct file_id *id)
{
	umode_t mode;
	if (!inode)
		return false;
	mode = BPF_CORE_READ(inode, i_mode);
	if ((mode & S_IFMT_) != S_IFREG_)
		return false;
	id->ino = BPF_CORE_READ(inode, i_ino);
	id->dev = BPF_CORE_READ(inode, i_sb, s_dev);
	id->gen = BPF_CORE_READ(inode, i_generation);
	id->size = BPF_CORE_READ(inode, i_size);
	return true;
}

/* Same as inode_id for a BTF-typed inode pointer: direct loads instead of bpf_probe_read calls (hot path). */
static __always_inline bool inode_id_btf(struct inode *inode, struct file_id *id)
{
	if (!inode || (inode->i_mode & S_IFMT_) != S_IFREG_)
		return false;
	id->ino = inode->i_ino;
	id->dev = inode->i_sb->s_dev;
	id->gen = inode->i_generation;
	id->size = inode->i_size;
	return true;
}

#define PAGE_FILE 1  /* a page of a regular file on the bio's device: id is set */
#define PAGE_OTHER 0 /* another page-cache page (block device: metadata, journal; directories) */
#define PAGE_ANON -1 /* no file of this device: anonymous / ksm memory or another filesystem's file (a user buffer) */

/* A page of no regular file: a block device's own page cache (buffer heads: superblock, bitmaps, inode tables,
 * directory blocks and their read-ahead, the journal; often sent without REQ_META) is the volume's metadata, whichever
 * task sends it; anything else of this device too (directories); pages of other devices are user buffers. */
static __always_inline int non_file_page(umode_t mode, u32 host_dev, u32 bdev, u32 fsdev)
{
	if ((mode & S_IFMT_) == S_IFBLK_ || host_dev == bdev || host_dev == fsdev)
		return PAGE_OTHER;
	return PAGE_ANON;
}

/* What the page heading this bio belongs to. fsdev: the volume's filesystem, on the volume (== bdev) or stacked on it. */
static __always_inline int bio_page_file(struct bio *bio, u32 bdev, u32 fsdev, struct file_id *id)
{
	struct bio_vec *vec = bio->bi_io_vec;
	struct address_space *mapping;
	struct page *page;
	unsigned long head;

	if (!vec)
		return PAGE_OTHER;
	page = vec->bv_page;
	if (!page)
		return PAGE_OTHER;
	/* compound_head (aliases a list_head in BTF) and mapping (low bits flag anonymous / movable / ksm pages) are
	 * tested as scalars: one copy of the words from compound_head up to mapping */
	struct {
		unsigned long w[4];
	} words = {};
	u32 off_head = bpf_core_field_offset(struct page, compound_head);
	u32 off_map = bpf_core_field_offset(struct page, mapping);
	u32 nwords = (off_map - off_head) / 8;
	if (off_map <= off_head || nwords > 3)
		return PAGE_OTHER;
	bpf_probe_read_kernel(&words, sizeof(words), (void *)page + off_head);
	head = words.w[0];
	unsigned long raw = words.w[nwords & 3];
	if (head & 1) { /* tail page of a large folio: the head page has the mapping */
		struct page *hp = (struct page *)(head - 1);
		mapping = BPF_CORE_READ(hp, mapping);
		if (!mapping || ((unsigned long)mapping & 3))
			return PAGE_ANON;
		struct inode *host = BPF_CORE_READ(mapping, host);
		if (!inode_id(host, id))
			return non_file_page(BPF_CORE_READ(host, i_mode), BPF_CORE_READ(host, i_sb, s_dev), bdev, fsdev);
	} else {
		if (!raw || (raw & 3))
			return PAGE_ANON;
		mapping = page->mapping;
		if (!mapping || !mapping->host)
			return PAGE_ANON;
		if (!inode_id_btf(mapping->host, id))
			return non_file_page(mapping->host->i_mode, mapping->host->i_sb->s_dev, bdev, fsdev);
	}
	return id->dev == bdev || id->dev == fsdev ? PAGE_FILE : PAGE_ANON;
}

/* the completion of iomap's direct-I/O bios (ext4, XFS...; 6.1 and 6.18) and of a split piece (chained to its
 * original): their addresses, from kallsyms (0 if absent) */
extern const void iomap_dio_bio_end_io __ksym __weak;
extern const void bio_chain_endio __ksym __weak;

/* A direct-I/O bio of iomap carries its request: bi_private is the struct iomap_dio, whose iocb names the file. A piece
 * the block layer split off is chained to the original (bi_private). */
static __always_inline bool iomap_dio_file(struct bio *bio, u32 bdev, u32 fsdev, struct file_id *id)
{
	void *end_io = BPF_CORE_READ(bio, bi_end_io);
	void *priv = BPF_CORE_READ(bio, bi_private);
	if (!&iomap_dio_bio_end_io)
		return false;
	if (&bio_chain_endio && end_io == (void *)&bio_chain_endio && priv) {
		struct bio *parent = priv;
		end_io = BPF_CORE_READ(parent, bi_end_io);
		priv = BPF_CORE_READ(parent, bi_private);
	}
	if (end_io != (void *)&iomap_dio_bio_end_io || !priv)
		return false;
	struct iomap_dio *dio = priv;
	struct inode *inode = BPF_CORE_READ(dio, iocb, ki_filp, f_inode);
	return inode_id(inode, id) && (id->dev == bdev || id->dev == fsdev);
}

static __always_inline bool bio_file(struct cp_config *c, struct bio *bio, u32 bdev, u32 fsdev, struct file_id *id)
{
	int kind = bio_page_file(bio, bdev, fsdev, id);
	if (kind != PAGE_ANON)
		return kind == PAGE_FILE;
	if (iomap_dio_file(bio, bdev, fsdev, id))
		return true;
	/* a clone of a direct-I/O bio (device-mapper below a stacked filesystem): the task's direct-I/O mark */
	/* direct I/O: the pages belong to the user's buffer; use the file the task is doing direct I/O on */
	struct cp_dio *d;
	if (c->flags & CP_CFG_DIO_SYSCALLS) {
		u32 tid = (u32)bpf_get_current_pid_tgid();
		d = bpf_map_lookup_elem(&dio_task, &tid);
	} else {
		d = bpf_task_storage_get(&dio_store, bpf_get_current_task_btf(), 0, 0);
	}
	if (d && (d->dev == bdev || d->dev == fsdev) && d->ino) {
		id->ino = d->ino;
		id->dev = d->dev;
		id->gen = d->gen;
		id->size = d->size;
		return true;
	}
	return false;
}

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
	submit_barrier(e);
}

/* a discard counts for every volume the device belongs to (a cache device shared by several volumes) */
struct discard_ctx {
	u64 mask;
	u64 sectors;
};

/* bpf_loop: the verifier checks the body once (an open-coded loop over 64 unknown bits explodes its state count) */
static long count_discard_slot(u32 i, struct discard_ctx *dc)
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
	bpf_loop(CP_MAX_VOLUMES, count_discard_slot, &dc, 0);
}

SEC("tp_btf/block_bio_queue")
int BPF_PROG(on_bio_queue, struct bio *bio)
{
	u32 dev = bio->bi_bdev->bd_dev;
	struct cp_watch *w = bpf_map_lookup_elem(&watched, &dev);
	if (!w)
		return 0;

	u32 opf = bio->bi_opf;
	u32 op = opf & REQ_OP_MASK_;
	u64 size = bio->bi_iter.bi_size;

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
		submit(e);
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
		bool is_file = !(opf & meta) && bio_file(c, bio, dev, w->fs_dev, &id);
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
	if (!(opf & meta) && bio_file(c, split, dev, w->fs_dev, &id)) {
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

static __always_inline struct file *fd_file(long fd)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct fdtable *fdt = BPF_CORE_READ(task, files, fdt);
	struct file **fds;
	struct file *f = NULL;

	if (!fdt || fd < 0 || (unsigned long)fd >= BPF_CORE_READ(fdt, max_fds))
		return NULL;
	fds = BPF_CORE_READ(fdt, fd);
	if (bpf_probe_read_kernel(&f, sizeof(f), &fds[fd]))
		return NULL;
	return f;
}

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

/* ---- freed extents, deletes, journal commits ---- */

/*
 * The journal transaction that frees these blocks: ext4_free_blocks runs under the caller's jbd2 handle
 * (current->journal_info), and mballoc keeps the blocks busy until exactly that handle's transaction commits
 * (ext4_mb_free_metadata records handle->h_transaction->t_tid; same on 6.1 and 6.18). Without a journal,
 * journal_info is only ext4's nesting counter (a small integer), so the superblock's journal is checked first; a handle
 * of another journal (never expected) falls back to the running transaction. Data blocks in data=writeback are
 * released at once: their tid is still the handle's (waiting for it is merely conservative).
 */
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
	submit(e);
	return 0;
}

/*
 * XFS frees extents through deferred intents (after unlink, truncate, punch hole; in a background worker). Blocks are
 * reported as linear fs blocks (agno * agblocks + agbno), like ext4's. The owner is the inode when XFS records it
 * (data extents of a file), else 0 ("blocks were freed on this filesystem").
 */
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
	submit(e);
	return 0;
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
	struct cp_ev_delete *e = reserve_event(sizeof(*e), CP_EV_DELETE, id.dev, w->slot, bpf_ktime_get_ns());
	if (!e)
		return 0;
	e->ino = id.ino;
	e->size = BPF_CORE_READ(inode, i_size);
	e->gen = id.gen;
	e->pid = (u32)(bpf_get_current_pid_tgid() >> 32);
	submit(e);
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
	submit(e);
	return 0;
}

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
	if (p->kind & CP_SYNC_FS_LEVEL)
		return 0; /* not ours: the filesystem's exit hook counts it */
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
int sys_sync_file_range(struct trace_event_raw_sys_enter *ctx)
{
	if ((int)ctx->args[0] == CP_SELF_CLAIM_FD) {
		claim_self(ctx->args[1]);
		return 0;
	}
	return sync_enter(ctx->args[0], CP_BAR_SYNC_FILE_RANGE);
}

/*
 * Durability points that are not fsync-family syscalls on the filesystem's own files all end in the filesystem's
 * fsync (vfs_fsync_range): writes on O_SYNC / O_DSYNC files or with RWF_DSYNC (generic_write_sync), msync(MS_SYNC),
 * io_uring's fsync, fsync through overlayfs (the upper file's fsync). ext4_sync_file_{enter,exit} sees them all with
 * the real file and the result; an fsync syscall on the file itself is left to the syscall hooks (its entry is
 * pending). The kind comes from the file's flags, else from the system call the task is in.
 */
#define O_DSYNC_ 00010000
#define NR_WRITE_ 1
#define NR_PWRITE64_ 18
#define NR_WRITEV_ 20
#define NR_MSYNC_ 26
#define NR_SYNC_ 162
#define NR_PWRITEV_ 296
#define NR_PWRITEV2_ 328

static __always_inline long current_syscall(void)
{
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
	return regs ? (long)BPF_CORE_READ(regs, orig_ax) : -1;
}

static __always_inline u32 implicit_sync_kind(struct file *file, int datasync)
{
	long nr;
	if (BPF_CORE_READ(file, f_flags) & O_DSYNC_) /* O_SYNC includes O_DSYNC */
		return CP_BAR_SYNC_WRITE;
	nr = current_syscall();
	if (nr == NR_MSYNC_)
		return CP_BAR_MSYNC;
	if (nr == NR_WRITE_ || nr == NR_PWRITE64_ || nr == NR_WRITEV_ || nr == NR_PWRITEV_ || nr == NR_PWRITEV2_)
		return CP_BAR_SYNC_WRITE; /* RWF_SYNC / RWF_DSYNC */
	return datasync ? CP_BAR_FDATASYNC : CP_BAR_FSYNC; /* io_uring, overlayfs, nfsd... */
}

SEC("tp_btf/ext4_sync_file_enter")
int BPF_PROG(on_ext4_sync_enter, struct file *file, int datasync)
{
	u32 tid = (u32)bpf_get_current_pid_tgid();
	if (is_self() || bpf_map_lookup_elem(&sync_pending, &tid))
		return 0; /* an fsync syscall's own: counted at its exit */
	struct inode *inode = file->f_inode;
	struct cp_watch *w = watch_of(inode->i_sb->s_dev, CP_ROLE_FS);
	if (!w)
		return 0;
	struct cp_sync_pending p = {.ino = inode->i_ino, .slot = w->slot,
				    .kind = implicit_sync_kind(file, datasync) | CP_SYNC_FS_LEVEL};
	if (bpf_map_update_elem(&sync_pending, &tid, &p, BPF_ANY))
		count_drop(w->slot, CP_DROP_SYNC);
	return 0;
}

SEC("tp_btf/ext4_sync_file_exit")
int BPF_PROG(on_ext4_sync_exit, struct inode *inode, int ret)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	u32 tid = (u32)pid_tgid;
	struct cp_sync_pending *p = bpf_map_lookup_elem(&sync_pending, &tid);
	if (!p || !(p->kind & CP_SYNC_FS_LEVEL))
		return 0;
	if (ret == 0)
		count_sync(p->slot, p->kind & ~CP_SYNC_FS_LEVEL, p->ino, (u32)(pid_tgid >> 32));
	bpf_map_delete_elem(&sync_pending, &tid);
	return 0;
}

/* sync(2) syncs every filesystem and cannot fail: one SYNC per watched filesystem it waited on */
SEC("tp_btf/ext4_sync_fs")
int BPF_PROG(on_ext4_sync_fs, struct super_block *sb, int wait)
{
	if (!wait || is_self() || current_syscall() != NR_SYNC_)
		return 0;
	struct cp_watch *w = watch_of(sb->s_dev, CP_ROLE_FS);
	if (w)
		count_sync(w->slot, CP_BAR_SYNC, 0, (u32)(bpf_get_current_pid_tgid() >> 32));
	return 0;
}

/* keep every event layout in the object's BTF (the layout test and bpftool read them from there) */
struct cp_ev_hdr *cp_btf_ev_hdr __attribute__((unused));
struct cp_ev_free *cp_btf_ev_free __attribute__((unused));
struct cp_ev_delete *cp_btf_ev_delete __attribute__((unused));
struct cp_ev_barrier *cp_btf_ev_barrier __attribute__((unused));
struct cp_ev_discard *cp_btf_ev_discard __attribute__((unused));
struct cp_ev_commit *cp_btf_ev_commit __attribute__((unused));
struct cp_sync *cp_btf_sync __attribute__((unused));
struct cp_sync_pending *cp_btf_sync_pending __attribute__((unused));
