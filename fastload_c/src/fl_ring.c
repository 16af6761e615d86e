#define _GNU_SOURCE
#include "fl_ring.h"

#include <errno.h>

/* "FLRING01" in ASCII: marks formatted memory, and the layout's version. */
#define FL_RING_MAGIC 0x31304752494c4c46ULL

#define LOAD_RELAXED(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define LOAD_ACQUIRE(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define STORE_RELAXED(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)
#define STORE_RELEASE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline uint64_t record_size(uint64_t len)
{
    return FL_RING_RECORD_HEADER + ((len + 7) & ~7ULL);
}

int fl_ring_capacity_ok(uint64_t capacity)
{
    return capacity >= FL_RING_MIN_CAPACITY && capacity <= FL_RING_MAX_CAPACITY &&
           (capacity & (capacity - 1)) == 0;
}

size_t fl_ring_segment_size(uint64_t capacity)
{
    return sizeof(fl_ring_shared) + (size_t)capacity;
}

void fl_ring_format(void *mem, uint64_t capacity)
{
    fl_ring_shared *sh = mem;
    memset(sh, 0, sizeof *sh);
    sh->capacity = capacity;
    /* The magic goes last: a ring is valid once it is there. */
    __atomic_store_n(&sh->magic, FL_RING_MAGIC, __ATOMIC_SEQ_CST);
}

int fl_ring_attach(fl_ring *r, void *mem, size_t size)
{
    fl_ring_shared *sh = mem;
    if (size < sizeof *sh || LOAD_ACQUIRE(&sh->magic) != FL_RING_MAGIC ||
        !fl_ring_capacity_ok(sh->capacity) || size < fl_ring_segment_size(sh->capacity)) {
        errno = EINVAL;
        return -1;
    }
    r->sh = sh;
    r->data = (unsigned char *)mem + sizeof *sh;
    r->capacity = sh->capacity;
    r->mask = sh->capacity - 1;
    r->head_seen = LOAD_ACQUIRE(&sh->head);
    r->tail_seen = LOAD_ACQUIRE(&sh->tail);
    r->lent = 0;
    r->extra = NULL;
    fl_ring_set_spin(r, FL_RING_SPIN_NS);
    return 0;
}

void fl_ring_set_spin(fl_ring *r, int64_t ns)
{
    r->spin_ns = ns > 0 ? ns : 0;
}

int fl_ring_try_put(fl_ring *r, const void *src, uint64_t len)
{
    fl_ring_shared *sh = r->sh;
    if (len > fl_ring_max_message(r))
        return FL_RING_TOOBIG;
    if (LOAD_RELAXED(&sh->closed))
        return FL_RING_CLOSED;
    uint64_t need = record_size(len);
    uint64_t head = LOAD_RELAXED(&sh->head);
    if (head + need - r->tail_seen > r->capacity) {
        r->tail_seen = LOAD_ACQUIRE(&sh->tail);
        if (head + need - r->tail_seen > r->capacity)
            return FL_RING_AGAIN;
    }
    uint64_t start = (head + FL_RING_RECORD_HEADER) & r->mask;
    uint64_t first = r->capacity - start < len ? r->capacity - start : len;
    memcpy(r->data + (head & r->mask), &len, sizeof len);
    memcpy(r->data + start, src, first);
    memcpy(r->data, (const unsigned char *)src + first, len - first);
    /* puts moves before head so that count() never sees more gets than
     * puts; both are published by the release store of head. */
    STORE_RELAXED(&sh->puts, LOAD_RELAXED(&sh->puts) + 1);
    STORE_RELEASE(&sh->head, head + need);
    fl_doorbell_ring(&sh->data);
    if (r->extra != NULL)
        fl_doorbell_ring(r->extra);
    return 0;
}

void fl_ring_release(fl_ring *r)
{
    if (r->lent == 0)
        return;
    fl_ring_shared *sh = r->sh;
    uint64_t tail = LOAD_RELAXED(&sh->tail) + r->lent;
    r->lent = 0;
    STORE_RELAXED(&sh->gets, LOAD_RELAXED(&sh->gets) + 1);
    STORE_RELEASE(&sh->tail, tail);
    fl_doorbell_ring(&sh->space);
}

void fl_ring_unpeek(fl_ring *r)
{
    r->lent = 0;
}

int fl_ring_try_peek(fl_ring *r, fl_ring_msg *m)
{
    fl_ring_shared *sh = r->sh;
    fl_ring_release(r);
    uint64_t tail = LOAD_RELAXED(&sh->tail);
    if ((int64_t)(r->head_seen - tail) <= 0) {
        r->head_seen = LOAD_ACQUIRE(&sh->head);
        if (r->head_seen == tail) {
            if (!LOAD_ACQUIRE(&sh->closed))
                return FL_RING_AGAIN;
            r->head_seen = LOAD_ACQUIRE(&sh->head);
            if (r->head_seen == tail)
                return FL_RING_CLOSED;
        }
    }
    uint64_t len;
    memcpy(&len, r->data + (tail & r->mask), sizeof len);
    /* Shared memory is writable by every holder: check the length against
     * what was published before trusting it for copies. */
    if (len > fl_ring_max_message(r) || record_size(len) > r->head_seen - tail)
        return FL_RING_CORRUPT;
    uint64_t start = (tail + FL_RING_RECORD_HEADER) & r->mask;
    uint64_t first = r->capacity - start < len ? r->capacity - start : len;
    m->part[0] = r->data + start;
    m->size[0] = first;
    m->part[1] = r->data;
    m->size[1] = len - first;
    m->len = len;
    r->lent = record_size(len);
    return 0;
}

/* One try of a put (m == NULL) or a peek. */
static inline int attempt(fl_ring *r, const void *src, uint64_t len, fl_ring_msg *m)
{
    return m == NULL ? fl_ring_try_put(r, src, len) : fl_ring_try_peek(r, m);
}

/* Blocking put or peek: spin, then sleep on `db` (see NOTE [ Ring waiting ]). */
static int block(fl_ring *r, const void *src, uint64_t len, fl_ring_msg *m,
                 const struct timespec *deadline)
{
    fl_doorbell *db = m == NULL ? &r->sh->space : &r->sh->data;
    int rc;
    if (r->spin_ns > 0) {
        int64_t spin_end = fl_monotonic_ns() + r->spin_ns;
        if (deadline != NULL) {
            int64_t end = (int64_t)deadline->tv_sec * 1000000000 + deadline->tv_nsec;
            spin_end = end < spin_end ? end : spin_end;
        }
        for (unsigned i = 1;; i++) {
            rc = attempt(r, src, len, m);
            if (rc != FL_RING_AGAIN)
                return rc;
            /* The clock costs ~20 ns (vDSO): read it every few pauses. */
            if ((i & 7) == 0 && fl_monotonic_ns() >= spin_end)
                break;
            cpu_relax();
        }
    }
    for (;;) {
        uint32_t seen = fl_doorbell_seq(db);
        rc = attempt(r, src, len, m);
        if (rc != FL_RING_AGAIN)
            return rc;
        if (fl_deadline_passed(deadline))
            return FL_RING_TIMEOUT;
        if (fl_doorbell_wait(db, seen, deadline) != 0) {
            if (errno == EINTR)
                return FL_RING_INTR;
            if (errno != ETIMEDOUT)
                return FL_RING_ERRNO;
        }
    }
}

int fl_ring_put(fl_ring *r, const void *src, uint64_t len, const struct timespec *deadline)
{
    return block(r, src, len, NULL, deadline);
}

int fl_ring_peek(fl_ring *r, fl_ring_msg *m, const struct timespec *deadline)
{
    return block(r, NULL, 0, m, deadline);
}

void fl_ring_close(fl_ring *r)
{
    __atomic_store_n(&r->sh->closed, 1, __ATOMIC_SEQ_CST);
    fl_doorbell_ring(&r->sh->data);
    fl_doorbell_ring(&r->sh->space);
    if (r->extra != NULL)
        fl_doorbell_ring(r->extra);
}

int fl_ring_is_closed(const fl_ring *r)
{
    return (int)LOAD_ACQUIRE(&r->sh->closed);
}

uint64_t fl_ring_count(const fl_ring *r)
{
    uint64_t gets = LOAD_ACQUIRE(&r->sh->gets);
    uint64_t puts = LOAD_ACQUIRE(&r->sh->puts);
    return puts > gets ? puts - gets : 0;
}

uint64_t fl_ring_space(const fl_ring *r)
{
    uint64_t tail = LOAD_ACQUIRE(&r->sh->tail);
    uint64_t head = LOAD_ACQUIRE(&r->sh->head);
    uint64_t used = head - tail;
    uint64_t free = used < r->capacity ? r->capacity - used : 0;
    return free > FL_RING_RECORD_HEADER ? free - FL_RING_RECORD_HEADER : 0;
}
