/* SPDX-License-Identifier: Apache-2.0 */
/*
 * userfaultfd and pagemap definitions newer than Debian 12's linux-libc-dev
 * (6.1). Values are the kernel's UAPI; each block names the release that
 * added it. Defined only where the system headers lack them.
 */
#ifndef FARMEM_UFFD_COMPAT_H
#define FARMEM_UFFD_COMPAT_H

#include <linux/types.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>

#ifndef USERFAULTFD_IOC_NEW                         /* 6.1: /dev/userfaultfd */
#define USERFAULTFD_IOC     0xAA
#define USERFAULTFD_IOC_NEW _IO(USERFAULTFD_IOC, 0x00)
#endif

#ifndef UFFD_USER_MODE_ONLY                         /* 5.11 */
#define UFFD_USER_MODE_ONLY 1
#endif

#ifndef UFFD_FEATURE_WP_UNPOPULATED                 /* 6.4 */
#define UFFD_FEATURE_WP_UNPOPULATED (1 << 13)
#endif
#ifndef UFFD_FEATURE_POISON                         /* 6.6 */
#define UFFD_FEATURE_POISON         (1 << 14)
#endif
#ifndef UFFD_FEATURE_WP_ASYNC                       /* 6.7 */
#define UFFD_FEATURE_WP_ASYNC       (1 << 15)
#endif
#ifndef UFFD_FEATURE_MOVE                           /* 6.8 */
#define UFFD_FEATURE_MOVE           (1 << 16)
#endif

#ifndef _UFFDIO_MOVE                                /* 6.8 */
#define _UFFDIO_MOVE (0x05)
struct uffdio_move {
	__u64 dst;
	__u64 src;
	__u64 len;
#define UFFDIO_MOVE_MODE_DONTWAKE        ((__u64)1 << 0)
#define UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES ((__u64)1 << 1)
	__u64 mode;
	__s64 move;
};
#define UFFDIO_MOVE _IOWR(UFFDIO, _UFFDIO_MOVE, struct uffdio_move)
#endif

#ifndef _UFFDIO_POISON                              /* 6.6 */
#define _UFFDIO_POISON (0x08)
struct uffdio_poison {
	struct uffdio_range range;
#define UFFDIO_POISON_MODE_DONTWAKE ((__u64)1 << 0)
	__u64 mode;
	__s64 updated;
};
#define UFFDIO_POISON _IOWR(UFFDIO, _UFFDIO_POISON, struct uffdio_poison)
#endif

#ifndef UFFDIO_CONTINUE_MODE_WP                     /* 6.3 */
#define UFFDIO_CONTINUE_MODE_WP ((__u64)1 << 1)
#endif

#ifndef PAGEMAP_SCAN                                /* 6.7: <linux/fs.h> */
#define PAGE_IS_WPALLOWED   (1 << 0)
#define PAGE_IS_WRITTEN     (1 << 1)
#define PAGE_IS_FILE        (1 << 2)
#define PAGE_IS_PRESENT     (1 << 3)
#define PAGE_IS_SWAPPED     (1 << 4)
#define PAGE_IS_PFNZERO     (1 << 5)
#define PAGE_IS_HUGE        (1 << 6)
#define PAGE_IS_SOFT_DIRTY  (1 << 7)
struct page_region {
	__u64 start;
	__u64 end;
	__u64 categories;
};
#define PM_SCAN_WP_MATCHING   (1 << 0)
#define PM_SCAN_CHECK_WPASYNC (1 << 1)
struct pm_scan_arg {
	__u64 size;
	__u64 flags;
	__u64 start;
	__u64 end;
	__u64 walk_end;
	__u64 vec;
	__u64 vec_len;
	__u64 max_pages;
	__u64 category_inverted;
	__u64 category_mask;
	__u64 category_anyof_mask;
	__u64 return_mask;
};
#define PAGEMAP_SCAN _IOWR('f', 16, struct pm_scan_arg)
#endif

#endif /* FARMEM_UFFD_COMPAT_H */
