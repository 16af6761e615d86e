/* A single-producer/single-consumer ring of variable-length byte messages in
 * shared memory, lock-free, with futex waits.
 *
 * Plain C, no Python: functions return 0 or one of the negative FL_RING_*
 * codes below (FL_RING_ERRNO with errno set). The caller owns the memory
 * (fastload_c.ring puts it in a memfd Segment) and supplies a process-local
 * handle, fl_ring, per process that uses the ring.
 *
 * NOTE [ Ring record layout ]
 * The segment is a header (fl_ring_shared) followed by `capacity` data bytes,
 * capacity a power of two. Each message is a record: an 8-byte length, then
 * the payload, then padding to a multiple of 8. Records are contiguous in
 * the positions head and tail, which only grow (64-bit, never wrap in
 * practice); a position p lives at data[p & (capacity - 1)]. Because records
 * are 8-aligned and capacity is a multiple of 8, the length word never
 * straddles the end of the buffer, while a payload may: it is then written
 * and read as two copies (the end of the buffer, then its start). This wastes
 * no space, so a message of up to capacity - 8 bytes fits once the ring is
 * empty, whatever the positions. fl_ring_peek() reports the two parts; a
 * caller wanting one contiguous block copies only when the second is
 * non-empty.
 *
 * NOTE [ Ring memory ordering ]
 * head is written only by the producer, tail only by the consumer; each sits
 * on its own cache line with the counters and doorbell its writer touches, so
 * the two sides never write the same line on the hot path.
 * - The producer writes the record (length and payload), then stores
 *   head += record size with release; the consumer loads head with acquire
 *   before reading any record below it.
 * - The consumer finishes reading a record (or copying it out), then stores
 *   tail += record size with release; the producer loads tail with acquire
 *   before overwriting bytes below it.
 * - Each side caches the other's position (tail_seen, head_seen): a stale
 *   value is only an underestimate, so the cached value answers most calls
 *   and the peer's line is read only when the cache says full or empty.
 * - After publishing, each side rings its doorbell (data after head moves,
 *   space after tail moves); waiting follows NOTE [ Doorbell protocol ] in
 *   fl_doorbell.h, so a side that nobody waits for makes no system call.
 * - close() sets `closed`, then rings both doorbells, so a waiter on either
 *   side re-checks and sees it.
 * - A reader finding the ring empty and closed re-reads head after reading
 *   `closed` (acquire): messages put before close() are delivered first.
 *
 * NOTE [ Ring waiting ]
 * A blocking call first retries for spin_ns (a pause instruction between
 * tries), then sleeps on the doorbell futex with the caller's absolute
 * deadline, so a blocked process uses no CPU and a dead peer only costs the
 * timeout. Spinning catches a busy peer's reply (a few hundred ns) without
 * a system call. The default, 20 us, is about what one futex sleep and wake
 * costs (~17 us per hop measured on a KVM guest), so a spin that fails wastes
 * at most what sleeping at once would have cost; bench/bench_ring.py's
 * "ring spin0" column shows what not spinning costs. That reasoning needs
 * the spinner to have a CPU of its own: where it shares one with the peer
 * it waits for, spinning only delays the peer. So a loader whose processes
 * outnumber the usable CPUs sets spin 0 (fastload._cpus.ring_spin): on 2
 * CPUs with 2 workers, tiny batches then came 2x faster and cost the main
 * process 2 us less CPU each (bench/bench_main_loop.py). The call returns
 * FL_RING_INTR when a signal interrupted the sleep (the caller runs its
 * handlers and calls again with the same deadline).
 *
 * Single producer and single consumer: at most one process (and thread) puts
 * at a time, and at most one gets. Roles may move between processes (each
 * reloads its own position from shared memory on every call). */
#ifndef FL_RING_H
#define FL_RING_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "fl_doorbell.h"

#define FL_RING_MIN_CAPACITY 64ULL
#define FL_RING_MAX_CAPACITY (1ULL << 40)
#define FL_RING_RECORD_HEADER 8ULL
#define FL_RING_SPIN_NS 20000
/* Room given to each side's fields: a cache line pair, since adjacent-line
 * prefetchers pull lines in 128-byte pairs (and arm64 parts use 128-byte
 * lines). */
#define FL_RING_LINE 128

enum {
    FL_RING_ERRNO = -1,   /* a system call failed, errno says why */
    FL_RING_AGAIN = -2,   /* full (put) or empty (peek); only from try_ */
    FL_RING_CLOSED = -3,  /* closed: put refused, or peek on a drained ring */
    FL_RING_TIMEOUT = -4, /* the deadline passed */
    FL_RING_INTR = -6,    /* a signal arrived; call again */
    FL_RING_TOOBIG = -7,  /* the message can never fit */
    FL_RING_CORRUPT = -8, /* a record's length contradicts the positions */
};

/* The shared header, at the start of the segment. */
typedef struct {
    _Alignas(FL_RING_LINE) uint64_t magic;
    uint64_t capacity;
    uint32_t closed;
    _Alignas(FL_RING_LINE) uint64_t head; /* producer's line */
    uint64_t puts;
    fl_doorbell data;
    _Alignas(FL_RING_LINE) uint64_t tail; /* consumer's line */
    uint64_t gets;
    fl_doorbell space;
} fl_ring_shared;

/* One process's handle on a ring. */
typedef struct {
    fl_ring_shared *sh;
    unsigned char *data;
    uint64_t capacity;
    uint64_t mask;
    uint64_t head_seen;  /* consumer: a lower bound of head */
    uint64_t tail_seen;  /* producer: a lower bound of tail */
    uint64_t lent;       /* consumer: size of the peeked, unreleased record */
    fl_doorbell *extra;  /* rung after each publish too; may be NULL */
    int64_t spin_ns;     /* see NOTE [ Ring waiting ] */
} fl_ring;

/* A peeked message: part[0] (size[0] bytes) then part[1] (size[1] bytes,
 * non-zero only when the payload wraps). Valid until fl_ring_release(). */
typedef struct {
    const unsigned char *part[2];
    uint64_t size[2];
    uint64_t len;
} fl_ring_msg;

/* Whether `capacity` is a power of two within the limits above. */
int fl_ring_capacity_ok(uint64_t capacity);

/* Bytes of shared memory a ring of `capacity` needs. */
size_t fl_ring_segment_size(uint64_t capacity);

/* Format zeroed memory of fl_ring_segment_size(capacity) bytes as an empty
 * ring. */
void fl_ring_format(void *mem, uint64_t capacity);

/* Fill a handle for the ring formatted in `mem` (`size` bytes mapped).
 * -1 with errno EINVAL when it holds no ring or is too small for it. */
int fl_ring_attach(fl_ring *r, void *mem, size_t size);

/* Set how long this handle spins before sleeping, in ns (0: never). */
void fl_ring_set_spin(fl_ring *r, int64_t ns);

static inline uint64_t fl_ring_max_message(const fl_ring *r)
{
    return r->capacity - FL_RING_RECORD_HEADER;
}

/* Producer. try_put: 0, AGAIN, CLOSED or TOOBIG. put: blocks (NOTE [ Ring
 * waiting ]) and returns 0, CLOSED, TOOBIG, TIMEOUT, INTR or ERRNO. */
int fl_ring_try_put(fl_ring *r, const void *src, uint64_t len);
int fl_ring_put(fl_ring *r, const void *src, uint64_t len, const struct timespec *deadline);

/* Consumer. Peeking first releases a message still lent, then lends the next
 * one: it stays in the ring until fl_ring_release() (or the next peek).
 * try_peek: 0, AGAIN, CLOSED or CORRUPT. peek: blocks like put. */
int fl_ring_try_peek(fl_ring *r, fl_ring_msg *m);
int fl_ring_peek(fl_ring *r, fl_ring_msg *m, const struct timespec *deadline);
void fl_ring_release(fl_ring *r);
/* Forget the lent message without consuming it: the next peek returns it
 * again. For a caller that failed to take it (out of memory). */
void fl_ring_unpeek(fl_ring *r);

static inline void fl_ring_copy(const fl_ring_msg *m, void *dst)
{
    memcpy(dst, m->part[0], m->size[0]);
    memcpy((unsigned char *)dst + m->size[0], m->part[1], m->size[1]);
}

/* Either side, any process. */
void fl_ring_close(fl_ring *r);
int fl_ring_is_closed(const fl_ring *r);
/* Snapshots: messages in the ring (a lent one included), and the largest
 * message a put could take now without waiting. */
uint64_t fl_ring_count(const fl_ring *r);
uint64_t fl_ring_space(const fl_ring *r);

#endif
