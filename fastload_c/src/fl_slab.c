#include "fl_slab.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>

struct fl_slots {
    uint32_t count;
    uint32_t nfree;
    uint32_t *stack;  /* free slot indices; the top is stack[nfree - 1] */
    uint8_t *taken;
};

fl_slots *fl_slots_new(uint32_t n)
{
    if (n == 0) {
        errno = EINVAL;
        return NULL;
    }
    fl_slots *slots = calloc(1, sizeof *slots);
    if (slots == NULL)
        return NULL;
    slots->stack = malloc((size_t)n * sizeof *slots->stack);
    slots->taken = calloc(n, 1);
    if (slots->stack == NULL || slots->taken == NULL) {
        fl_slots_free(slots);
        errno = ENOMEM;
        return NULL;
    }
    slots->count = n;
    slots->nfree = n;
    /* Lowest index on top, so a fresh pool fills its segment front to back. */
    for (uint32_t i = 0; i < n; i++)
        slots->stack[i] = n - 1 - i;
    return slots;
}

void fl_slots_free(fl_slots *slots)
{
    if (slots == NULL)
        return;
    free(slots->stack);
    free(slots->taken);
    free(slots);
}

int64_t fl_slots_take(fl_slots *slots)
{
    if (slots->nfree == 0)
        return -1;
    uint32_t i = slots->stack[--slots->nfree];
    slots->taken[i] = 1;
    return i;
}

int fl_slots_give(fl_slots *slots, uint32_t i)
{
    if (i >= slots->count || !slots->taken[i]) {
        errno = EINVAL;
        return -1;
    }
    slots->taken[i] = 0;
    slots->stack[slots->nfree++] = i;
    return 0;
}

uint32_t fl_slots_free_count(const fl_slots *slots)
{
    return slots->nfree;
}

uint32_t fl_slots_count(const fl_slots *slots)
{
    return slots->count;
}

size_t fl_slab_round_slot(size_t size, size_t page)
{
    if (size > SIZE_MAX - (page - 1))
        return 0;
    return (size + page - 1) / page * page;
}

size_t fl_slab_grown_slot_size(size_t current, size_t need, size_t page, int headroom)
{
    size_t want = headroom ? need + need / 8 : need;
    if (want < need)
        return 0;
    size_t size = fl_slab_round_slot(want, page);
    return size > current ? size : current;
}

int fl_slab_unmap_pages(void *addr, size_t size)
{
    return madvise(addr, size, MADV_DONTNEED);
}
