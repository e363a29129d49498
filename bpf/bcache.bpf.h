/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * bcache's allocator refusing a read-miss insert: tracepoint bcache/bcache_alloc_fail (bch_bucket_alloc with wait
 * false found the free list empty; the read was served but not cached). Counted per cache device (the tracepoint's
 * dev is the cache device, ca->bdev->bd_dev) for cache devices watched below a volume; user space reads the
 * cumulative counts each tick to slow its promotion reads. Optional: the tracepoint exists only while the bcache
 * module is loaded. A classic tracepoint with the record layout of include/trace/events/bcache.h (6.1 and later:
 * the common header, then dev_t dev): no module BTF is needed.
 */
#ifndef CP_BCACHE_BPF_H
#define CP_BCACHE_BPF_H

#define CP_MAX_CACHE_DEVS 256

#ifndef CP_BCC /* the bcc build names the map its loader creates from this definition */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CP_MAX_CACHE_DEVS);
	__type(key, u32);   /* the cache device's dev_t, kernel encoding */
	__type(value, u64); /* allocation failures since the probe loaded */
} alloc_fails SEC(".maps");
#endif

struct cp_bcache_alloc_fail_rec {
	u64 common; /* struct trace_entry: type, flags, preempt_count, pid */
	u32 dev;
	u32 free;
	u32 free_inc;
	u32 blocked;
};

SEC("tracepoint/bcache/bcache_alloc_fail")
CP_TP_PROG(on_bcache_alloc_fail, struct cp_bcache_alloc_fail_rec)
{
	u32 dev = ctx->dev;
	if (!watch_of(dev, CP_ROLE_LOWER))
		return 0;
	u64 *n = bpf_map_lookup_elem(&alloc_fails, &dev);
	if (!n) {
		u64 one = 1;
		if (!bpf_map_update_elem(&alloc_fails, &dev, &one, BPF_NOEXIST))
			return 0;
		n = bpf_map_lookup_elem(&alloc_fails, &dev); /* another CPU inserted it first */
		if (!n)
			return 0;
	}
	__sync_fetch_and_add(n, 1);
	return 0;
}

#endif
