/* Slot bookkeeping for the slab pool: which slots of one segment are free.
 *
 * Plain C, no Python, no locking: the pool lives in one process and is used
 * under the GIL (see NOTE [ Slot ownership and lifetime ] in slab.pyx). */
#ifndef FL_SLAB_H
#define FL_SLAB_H

#include <stddef.h>
#include <stdint.h>

/* The free slots of one segment: a LIFO stack, so the slot released last
 * (warm in cache) is handed out first, and a per-slot flag that catches a
 * slot given back twice. */
typedef struct fl_slots fl_slots;

/* A set of `n` slots, all free. NULL with errno ENOMEM or EINVAL (n == 0). */
fl_slots *fl_slots_new(uint32_t n);
void fl_slots_free(fl_slots *slots);

/* Take a free slot: its index, or -1 when none is free. */
int64_t fl_slots_take(fl_slots *slots);

/* Give slot `i` back. -1 with EINVAL when `i` is out of range or not taken. */
int fl_slots_give(fl_slots *slots, uint32_t i);

uint32_t fl_slots_free_count(const fl_slots *slots);
uint32_t fl_slots_count(const fl_slots *slots);

/* `size` rounded up to whole pages: every slot then starts on a page, so the
 * 64-byte offsets inside it are 64-byte aligned in memory. 0 on overflow. */
size_t fl_slab_round_slot(size_t size, size_t page);

/* Slot size for a batch of `need` bytes when the current slots are too
 * small: `need`, plus 1/8 headroom when `headroom` is non-zero (batches of
 * variable-size samples vary a little), rounded up to whole pages, and at
 * least `current`. 0 on overflow. */
size_t fl_slab_grown_slot_size(size_t current, size_t need, size_t page, int headroom);

/* Unmap this process's pages of the slot at `addr` (`size` bytes, whole
 * pages) without discarding them: its contents stay in the segment and a
 * later access maps them again (madvise MADV_DONTNEED of a shared mapping).
 * 0, or -1 with errno set. */
int fl_slab_unmap_pages(void *addr, size_t size);

#endif
