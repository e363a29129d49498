/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Kernel ABI constants and kernel-version differences, in one place. Each works around a change between the kernels
 * the object runs on (the lab's stock 6.1, this host's 6.18); CO-RE relocates field offsets, this covers the rest:
 * - struct page (include/linux/mm_types.h): compound_head and mapping are read as raw words (attribution.bpf.h):
 *   compound_head shares its word with lru, a list_head in BTF, and mapping's low bits flag anonymous / movable / KSM
 *   pages (PAGE_MAPPING_*), so neither can be followed as the typed pointer BTF describes.
 * - iomap_dio_bio_end_io (fs/iomap/direct-io.c; global on 6.18) and bio_chain_endio (block/bio.c, static) are not
 *   part of any ABI: they are weak typeless ksyms resolved from kallsyms (0 when absent: then the direct-I/O marks
 *   attribute iomap's bios, and user space attaches them at once).
 * - The iomap_dio_rw_begin / iomap_dio_complete / iomap_dio_rw_queued tracepoints are absent from 6.1: the direct-I/O
 *   marks then come from the read/write syscall tracepoints (chosen by user space at load time).
 * - System call numbers and pt_regs->orig_ax are x86-64's (the object is built with __TARGET_ARCH_x86).
 * - bpf_rdonly_cast (Linux 6.2, "bpf: Add a kfunc for generic type cast"): turns a kernel pointer held as a plain word
 *   (a bio's bi_private, a page's mapping word) into a typed pointer that is read with plain loads, where 6.1 needs one
 *   bpf_probe_read_kernel call per field (~20-40 ns each; ten on a direct-I/O read). It is a weak kfunc: libbpf 1.1
 *   leaves it unresolved on 6.1, so only programs that never call it may load there. The hot path therefore comes
 *   twice, on_bio_queue (with it) and on_bio_queue_compat (without), and user space loads the one the kernel can run.
 */
#ifndef CP_CORE_FIXES_BPF_H
#define CP_CORE_FIXES_BPF_H

#define REQ_OP_MASK_ 0xff
#define REQ_OP_READ_ 0
#define REQ_OP_WRITE_ 1
#define REQ_OP_DISCARD_ 3
#define S_IFMT_ 00170000
#define S_IFREG_ 0100000
#define S_IFBLK_ 0060000
#define O_DIRECT_ 00040000
#define PAGE_SHIFT_ 12

/* the completion of iomap's direct-I/O bios (ext4, XFS...; 6.1 and 6.18) and of a split piece (chained to its
 * original): their addresses, from kallsyms (0 if absent) */
extern const void iomap_dio_bio_end_io __ksym __weak;
extern const void bio_chain_endio __ksym __weak;
/* their addresses (NULL if absent); the bcc build reads them from a map user space fills from kallsyms */
#define CP_KSYM_IOMAP_DIO_END_IO ((void *)&iomap_dio_bio_end_io)
#define CP_KSYM_BIO_CHAIN_ENDIO ((void *)&bio_chain_endio)

extern void *bpf_rdonly_cast(void *obj, __u32 btf_id) __ksym __weak;

/* a BTF-typed pointer the program may load through (tp_btf arguments and what they point to); the bcc build has none */
#define CP_TYPED(p) (p)
/* a read through tp_btf arguments: plain loads here, probe reads in the bcc build (BTF_READ(bio, bi_bdev, bd_dev)) */
#define CP_BTF2(s, a) ((s)->a)
#define CP_BTF3(s, a, b) ((s)->a->b)
#define CP_BTF_N(_1, _2, _3, N, ...) N
#define BTF_READ(...) CP_BTF_N(__VA_ARGS__, CP_BTF3, CP_BTF2, _)(__VA_ARGS__)

/* p (a kernel address held as a scalar) as a read-only `type *` (only where the caller passed fast = true) */
#define CP_KPTR(type, p) ((type *)bpf_rdonly_cast((void *)(p), bpf_core_type_id_kernel(type)))

#define O_DSYNC_ 00010000
#define NR_WRITE_ 1
#define NR_PWRITE64_ 18
#define NR_WRITEV_ 20
#define NR_MSYNC_ 26
#define NR_FSYNC_ 74
#define NR_FDATASYNC_ 75
#define NR_SYNC_ 162
#define NR_PWRITEV_ 296
#define NR_PWRITEV2_ 328

static __always_inline long current_syscall(void)
{
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
	return regs ? (long)BPF_CORE_READ(regs, orig_ax) : -1;
}

#endif /* CP_CORE_FIXES_BPF_H */
