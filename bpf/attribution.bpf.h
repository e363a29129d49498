/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Which file (or the volume's metadata) a bio belongs to: its pages, iomap's direct-I/O request, the task's mark.
 */
#ifndef CP_ATTRIBUTION_BPF_H
#define CP_ATTRIBUTION_BPF_H

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

/* The file a page-cache page's mapping word names. typed: the same mapping as a typed pointer when the bio's BTF gave
 * one (plain loads); fast: bpf_rdonly_cast makes one from the word (see core_fixes.bpf.h); else bpf_probe_read_kernel. */
static __always_inline int mapping_file(unsigned long raw, struct address_space *typed, u32 bdev, u32 fsdev,
					struct file_id *id, bool fast)
{
	struct inode *host;

	if (!raw || (raw & 3)) /* none, or anonymous / movable / ksm */
		return PAGE_ANON;
	if (fast)
		typed = CP_KPTR(struct address_space, raw);
	if (typed) {
		host = typed->host;
		if (!host)
			return PAGE_ANON;
		if (!inode_id_btf(host, id))
			return non_file_page(host->i_mode, host->i_sb->s_dev, bdev, fsdev);
	} else {
		host = BPF_CORE_READ((struct address_space *)raw, host);
		if (!host)
			return PAGE_ANON;
		if (!inode_id(host, id))
			return non_file_page(BPF_CORE_READ(host, i_mode), BPF_CORE_READ(host, i_sb, s_dev), bdev, fsdev);
	}
	return id->dev == bdev || id->dev == fsdev ? PAGE_FILE : PAGE_ANON;
}

/* compound_head (aliases a list_head in BTF) and mapping (low bits flag anonymous / movable / ksm pages) are tested as
 * scalars: one copy of the words from compound_head up to mapping. Returns mapping's word; *head compound_head's. */
static __always_inline bool page_words(struct page *page, unsigned long *head, unsigned long *mapping)
{
	struct {
		unsigned long w[4];
	} words = {};
	u32 off_head = bpf_core_field_offset(struct page, compound_head);
	u32 off_map = bpf_core_field_offset(struct page, mapping);
	u32 nwords = (off_map - off_head) / 8;
	if (off_map <= off_head || nwords > 3)
		return false;
	if (bpf_probe_read_kernel(&words, sizeof(words), (void *)page + off_head))
		return false;
	*head = words.w[0];
	*mapping = words.w[nwords & 3];
	return true;
}

/* What the page heading this bio belongs to. fsdev: the volume's filesystem, on the volume (== bdev) or stacked on it. */
static __always_inline int bio_page_file(struct bio *bio, u32 bdev, u32 fsdev, struct file_id *id, bool fast)
{
	struct bio_vec *vec = BTF_READ(bio, bi_io_vec);
	struct page *page = vec ? BTF_READ(vec, bv_page) : NULL;
	unsigned long head, raw;

	if (!page)
		return PAGE_OTHER;
	if (!page_words(page, &head, &raw))
		return PAGE_OTHER;
	if (!(head & 1))
		return mapping_file(raw, CP_TYPED(vec->bv_page->mapping), bdev, fsdev, id, fast);
	/* a tail page of a large folio: the head page has the mapping */
	if (!page_words((struct page *)(head - 1), &head, &raw))
		return PAGE_ANON;
	return mapping_file(raw, NULL, bdev, fsdev, id, fast);
}

/* A direct-I/O bio of iomap carries its request: bi_private is the struct iomap_dio, whose iocb names the file. A piece
 * the block layer split off is chained to the original (bi_private). */
static __always_inline bool iomap_dio_file(struct bio *bio, u32 bdev, u32 fsdev, struct file_id *id, bool fast)
{
	void *end_io, *priv;
	struct inode *inode;

	if (!CP_KSYM_IOMAP_DIO_END_IO)
		return false;
	end_io = fast ? (void *)bio->bi_end_io : (void *)BPF_CORE_READ(bio, bi_end_io);
	priv = fast ? bio->bi_private : BPF_CORE_READ(bio, bi_private);
	if (CP_KSYM_BIO_CHAIN_ENDIO && end_io == CP_KSYM_BIO_CHAIN_ENDIO && priv) {
		if (fast) {
			struct bio *parent = CP_KPTR(struct bio, priv);
			end_io = (void *)parent->bi_end_io;
			priv = parent->bi_private;
		} else {
			struct bio *parent = priv;
			end_io = (void *)BPF_CORE_READ(parent, bi_end_io);
			priv = BPF_CORE_READ(parent, bi_private);
		}
	}
	if (end_io != CP_KSYM_IOMAP_DIO_END_IO || !priv)
		return false;
	if (fast) {
		inode = CP_KPTR(struct iomap_dio, priv)->iocb->ki_filp->f_inode;
		if (!inode_id_btf(inode, id))
			return false;
	} else {
		inode = BPF_CORE_READ((struct iomap_dio *)priv, iocb, ki_filp, f_inode);
		if (!inode_id(inode, id))
			return false;
	}
	return id->dev == bdev || id->dev == fsdev;
}

static __always_inline bool bio_file(struct cp_config *c, struct bio *bio, u32 bdev, u32 fsdev, struct file_id *id,
				     bool fast)
{
	/* iomap's direct-I/O request first where that costs two plain loads (the pages of a direct-I/O bio are the user's
	 * buffer; reading their struct page is the costlier test) */
	if (fast && iomap_dio_file(bio, bdev, fsdev, id, fast))
		return true;
	int kind = bio_page_file(bio, bdev, fsdev, id, fast);
	if (kind != PAGE_ANON)
		return kind == PAGE_FILE;
	if (!fast && iomap_dio_file(bio, bdev, fsdev, id, fast))
		return true;
	/* direct I/O whose bio does not name its file (a clone device-mapper made below a stacked filesystem; 6.1's
	 * syscall marks): the pages belong to the user's buffer; use the file the task is doing direct I/O on (the
	 * bcc build has only the syscall marks: iomap's are in task storage, which needs BTF) */
	struct cp_dio *d;
#ifndef CP_BCC
	if (!(c->flags & CP_CFG_DIO_SYSCALLS)) {
		d = bpf_task_storage_get(&dio_store, bpf_get_current_task_btf(), 0, 0);
	} else
#endif
	{
		u32 tid = (u32)bpf_get_current_pid_tgid();
		d = bpf_map_lookup_elem(&dio_task, &tid);
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

#endif /* CP_ATTRIBUTION_BPF_H */
