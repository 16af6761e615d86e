/* What every C unit test shares: CHECK, a seeded random source, and a peer
 * that runs beside the test as a forked process or, under ThreadSanitizer
 * (which sees only one address space), as a thread. */
#ifndef FL_CHECK_H
#define FL_CHECK_H

#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d: CHECK(%s) failed (errno %d: %s)\n", __FILE__,    \
                    __LINE__, #cond, errno, strerror(errno));                        \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

#if defined(__SANITIZE_THREAD__)
#define FL_TSAN 1
#else
#define FL_TSAN 0
#endif

/* xorshift64*: reproducible from its seed in both peers. */
static inline uint64_t rnd(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * 0x2545F4914F6CDD1DULL;
}

/* Memory both peers see: MAP_SHARED survives fork. */
static inline void *shared_zeroed(size_t size)
{
    void *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(mem != MAP_FAILED);
    return mem;
}

/* An environment variable as a count, or `otherwise`. */
static inline uint64_t env_count(const char *name, uint64_t otherwise)
{
    const char *value = getenv(name);
    return value != NULL && *value != '\0' ? strtoull(value, NULL, 10) : otherwise;
}

typedef struct {
    int forked;
    pid_t pid;
    pthread_t thread;
} peer;

typedef void (*peer_fn)(void *arg);

struct peer_call {
    peer_fn fn;
    void *arg;
};

static void *peer_thread(void *p)
{
    struct peer_call *call = p;
    call->fn(call->arg);
    free(call);
    return NULL;
}

/* Run fn(arg) beside the caller: in a child process when `fork_it`, else
 * in a thread. A failing CHECK in a child exits it with 1. */
static inline peer peer_start(int fork_it, peer_fn fn, void *arg)
{
    peer p = {fork_it, -1, 0};
    if (fork_it) {
        p.pid = fork();
        CHECK(p.pid >= 0);
        if (p.pid == 0) {
            fn(arg);
            _exit(0);
        }
        return p;
    }
    struct peer_call *call = malloc(sizeof *call);
    CHECK(call != NULL);
    call->fn = fn;
    call->arg = arg;
    CHECK(pthread_create(&p.thread, NULL, peer_thread, call) == 0);
    return p;
}

static inline void peer_join(peer p)
{
    if (p.forked) {
        int status;
        CHECK(waitpid(p.pid, &status, 0) == p.pid);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    } else {
        CHECK(pthread_join(p.thread, NULL) == 0);
    }
}

/* The peer kinds a two-sided test runs with: both, or threads under TSan. */
#define FOR_EACH_PEER_KIND(fork_it) for (int fork_it = !FL_TSAN; fork_it >= 0; fork_it--)

#endif
