/* Futex waits with absolute CLOCK_MONOTONIC deadlines, header-only.
 *
 * Header-only on purpose: fastload_c.ring and fastload_c.proc (whose SIGCHLD
 * handler wakes waiters) each compile their own copy, and nothing here needs
 * Python. fl_futex_wake() is async-signal-safe (one raw syscall); it may set
 * errno, so a signal handler saves and restores errno around it (as
 * fl_doorbell_ring() does).
 *
 * The futexes are shared, not FUTEX_PRIVATE_FLAG: the words live in memfd
 * segments mapped by several processes, and a private futex would only match
 * waiters of the same address space. */
#ifndef FL_FUTEX_H
#define FL_FUTEX_H

#include <errno.h>
#include <linux/futex.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* Sleep while *word == expected, until woken, until `deadline` (absolute
 * CLOCK_MONOTONIC; NULL waits forever), or until a signal arrives.
 * Returns 0 when woken or when *word already differed (the caller re-checks
 * its condition either way: wakeups may be spurious), or -1 with errno
 * ETIMEDOUT (deadline passed), EINTR (signal), or another errno on misuse.
 * FUTEX_WAIT_BITSET is the futex operation that takes an absolute time, and
 * without FUTEX_CLOCK_REALTIME that time is CLOCK_MONOTONIC: a deadline
 * computed once stays exact across EINTR retries and spurious wakeups. */
static inline int fl_futex_wait(uint32_t *word, uint32_t expected, const struct timespec *deadline)
{
    long rc = syscall(SYS_futex, word, FUTEX_WAIT_BITSET, expected, deadline, NULL,
                      FUTEX_BITSET_MATCH_ANY);
    if (rc == 0 || errno == EAGAIN)
        return 0;
    return -1;
}

/* Wake up to `n` waiters sleeping on `word`. Returns how many were woken, or
 * -1 with errno. */
static inline int fl_futex_wake(uint32_t *word, int n)
{
    return (int)syscall(SYS_futex, word, FUTEX_WAKE, n, NULL, NULL, 0);
}

static inline int64_t fl_monotonic_ns(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
}

/* The absolute deadline `seconds` from now. Timeouts beyond about 30 years
 * are clamped there rather than overflowing time_t arithmetic. */
static inline void fl_deadline_after(double seconds, struct timespec *out)
{
    const double max_seconds = 1e9;
    if (!(seconds > 0))
        seconds = 0;
    if (seconds > max_seconds)
        seconds = max_seconds;
    int64_t ns = fl_monotonic_ns() + (int64_t)(seconds * 1e9);
    out->tv_sec = (time_t)(ns / 1000000000);
    out->tv_nsec = (long)(ns % 1000000000);
}

/* Whether an absolute deadline has passed; never for NULL (no deadline). */
static inline int fl_deadline_passed(const struct timespec *deadline)
{
    if (deadline == NULL)
        return 0;
    return fl_monotonic_ns() >= (int64_t)deadline->tv_sec * 1000000000 + deadline->tv_nsec;
}

#endif
