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

#endif /* CP_ATTRIBUTION_BPF_H */
