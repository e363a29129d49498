/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Helpers both builds share: configuration, drops, watches, event reservation, the file key and identity. The CO-RE
 * object (common.bpf.h defines the maps, then includes this) and the bcc source (cachepilot.bcc.c names the same maps
 * with macros for the file descriptors its loader fills in, and gives BPF_CORE_READ a bcc meaning).
 */
#ifndef CP_HELPERS_BPF_H
#define CP_HELPERS_BPF_H

/* a classic tracepoint's program over its record: bcc takes as a program only a function whose definition it sees in
 * its main file or from a macro expansion, so the units' plain ones are spelled through this */
#define CP_TP_PROG(name, record) int name(record *ctx)

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

static __always_inline struct cp_watch *find_watch(u32 dev)
{
	struct cp_config *c = cfg();
	if (!c || !dev)
		return NULL;
	u64 sel = c->watch_sel;
	u32 home = (dev * (u32)sel) >> (32 - CP_WATCH_BITS);
	u32 base = ((sel >> 32) & 1) * CP_WATCH_SLOTS;
	for (u32 i = 0; i < CP_WATCH_PROBES; i++) {
		u32 k = base + ((home + i) & (CP_WATCH_SLOTS - 1));
		struct cp_watch *w = bpf_map_lookup_elem(&watched, &k);
		if (!w || !w->dev)
			return NULL;
		if (w->dev == dev)
			return w;
	}
	return NULL;
}

static __always_inline struct cp_watch *watch_of(u32 dev, u32 role)
{
	struct cp_watch *w = find_watch(dev);
	if (!w || !(w->roles & role))
		return NULL;
	/* keep the test a branch: LLVM's BPF v1 (the bcc build) makes it a mask of the pointer, which the verifier
	 * refuses */
	asm volatile("" : "+r"(w));
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

/* the file behind a descriptor of the current task (a system call's argument) */
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

#endif /* CP_HELPERS_BPF_H */
