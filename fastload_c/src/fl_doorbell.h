/* A doorbell: an event counter in shared memory that waiters sleep on.
 *
 * Header-only so that a signal handler in another extension (fastload_c.proc,
 * on SIGCHLD) can ring the doorbell the main process sleeps on. The ring's
 * "data available" and "space available" events are doorbells too.
 *
 * NOTE [doorbell protocol]
 * `seq` counts rings; `sleepers` is non-zero while a waiter may be asleep.
 * A waiter reads `seen = fl_doorbell_seq()` BEFORE checking its condition
 * (data in a ring, a dead child, ...), and sleeps with
 * fl_doorbell_wait(db, seen, deadline) only if the condition was false.
 * An event source first makes its event visible (publishes the message,
 * records the exit status), then calls fl_doorbell_ring().
 *
 * No wakeup is lost: the ringer does {seq += 1; load sleepers} and the waiter
 * does {sleepers = 1; load seq; futex-wait while seq == seen}, all seq_cst.
 * In the single total order of seq_cst operations either the waiter's load
 * sees the new seq (it does not sleep), or the ringer's load sees
 * sleepers != 0 (it issues FUTEX_WAKE, and the kernel's own check of
 * seq == seen under its hash-bucket lock closes the remaining window).
 *
 * The ringer that wakes, not the waiter, clears `sleepers` (an exchange to 0
 * before FUTEX_WAKE of every waiter): a waiter that cleared it itself would
 * do so only once it got a CPU again, and until then every ring would issue
 * another, useless FUTEX_WAKE. With processes outnumbering cores that window
 * is a whole time slice: the ring's consumer made one system call per
 * message while its woken producer waited to run. Clearing on wake also
 * means a waiter killed while asleep, or one that timed out, costs at most
 * one extra FUTEX_WAKE. A waiter registering after the exchange sets the flag
 * again before it re-reads seq, so the next ring sees it.
 * A ring that nobody waits for costs one atomic increment and one load: no
 * system call.
 *
 * Every field is accessed only through the atomics below. */
#ifndef FL_DOORBELL_H
#define FL_DOORBELL_H

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <time.h>

#include "fl_futex.h"

typedef struct {
    uint32_t seq;      /* number of rings so far (wraps) */
    uint32_t sleepers; /* non-zero: a waiter may be asleep */
} fl_doorbell;

static inline uint32_t fl_doorbell_seq(fl_doorbell *db)
{
    return __atomic_load_n(&db->seq, __ATOMIC_SEQ_CST);
}

/* Async-signal-safe: lock-free atomics and at most one syscall, and errno is
 * preserved, so a signal handler may call it directly. */
static inline void fl_doorbell_ring(fl_doorbell *db)
{
    __atomic_fetch_add(&db->seq, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&db->sleepers, __ATOMIC_SEQ_CST) != 0 &&
        __atomic_exchange_n(&db->sleepers, 0, __ATOMIC_SEQ_CST) != 0) {
        int saved = errno;
        fl_futex_wake(&db->seq, INT_MAX);
        errno = saved;
    }
}

/* Sleep until the doorbell rings after `seen_seq` was read, or until the
 * deadline (absolute CLOCK_MONOTONIC, NULL = none). Returns 0 when it rang
 * (or spuriously: callers re-check their condition and loop), -1 with errno
 * ETIMEDOUT or EINTR, or another errno from the futex. */
static inline int fl_doorbell_wait(fl_doorbell *db, uint32_t seen_seq, const struct timespec *deadline)
{
    __atomic_store_n(&db->sleepers, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&db->seq, __ATOMIC_SEQ_CST) != seen_seq)
        return 0;
    return fl_futex_wait(&db->seq, seen_seq, deadline);
}

#endif
