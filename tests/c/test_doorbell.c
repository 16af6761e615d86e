/* fl_doorbell and fl_futex: waits, timeouts, and no lost wakeup between two
 * sides ringing each other many times (NOTE [ Doorbell protocol ]). */
#include "check.h"
#include "fl_doorbell.h"

static const struct timespec *after(double seconds, struct timespec *ts)
{
    fl_deadline_after(seconds, ts);
    return ts;
}

static void test_waits_and_timeouts(void)
{
    struct timespec ts;
    fl_doorbell *db = shared_zeroed(sizeof *db);
    uint32_t seen = fl_doorbell_seq(db);
    CHECK(seen == 0);
    errno = 0;
    CHECK(fl_doorbell_wait(db, seen, after(0.001, &ts)) == -1 && errno == ETIMEDOUT);
    CHECK(fl_deadline_passed(&ts) && !fl_deadline_passed(NULL));
    CHECK(db->sleepers == 0);
    fl_doorbell_ring(db);
    CHECK(fl_doorbell_seq(db) == 1);
    CHECK(fl_doorbell_wait(db, seen, NULL) == 0);  /* rang since `seen`: no sleep */
    /* A ring nobody waits for makes no system call and keeps errno. */
    errno = 1234;
    fl_doorbell_ring(db);
    CHECK(errno == 1234);
    /* Deadlines: clamped, never in the past for negative or huge values. */
    int64_t now = fl_monotonic_ns();
    fl_deadline_after(-5, &ts);
    CHECK((int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec >= now);
    fl_deadline_after(1e300, &ts);
    CHECK(ts.tv_sec > 0 && !fl_deadline_passed(&ts));
    CHECK(munmap(db, sizeof *db) == 0);
}

/* Two sides take turns: each bumps `turn` and rings the other's doorbell,
 * then waits for its own turn by the protocol: seen, check, wait. */
struct pingpong {
    fl_doorbell bell[2];
    uint32_t turn;
    uint32_t rounds;
};

static void play(struct pingpong *g, uint32_t side)
{
    struct timespec ts;
    for (uint32_t round = 0; round < g->rounds; round++) {
        uint32_t mine = 2 * round + side;
        for (;;) {
            uint32_t seen = fl_doorbell_seq(&g->bell[side]);
            if (__atomic_load_n(&g->turn, __ATOMIC_SEQ_CST) == mine)
                break;
            int rc = fl_doorbell_wait(&g->bell[side], seen, after(10, &ts));
            CHECK(rc == 0 || errno == EINTR);  /* a timeout is a lost wakeup */
        }
        __atomic_store_n(&g->turn, mine + 1, __ATOMIC_SEQ_CST);
        fl_doorbell_ring(&g->bell[!side]);
    }
}

static void play_second(void *g)
{
    play(g, 1);
}

static void test_no_wakeup_is_lost(void)
{
    FOR_EACH_PEER_KIND(fork_it) {
        struct pingpong *g = shared_zeroed(sizeof *g);
        g->rounds = (uint32_t)env_count("FASTLOAD_C_STRESS", 300000) / 10;
        peer p = peer_start(fork_it, play_second, g);
        play(g, 0);
        peer_join(p);
        CHECK(g->turn == 2 * g->rounds);
        CHECK(g->bell[0].sleepers == 0 && g->bell[1].sleepers == 0);
        CHECK(munmap(g, sizeof *g) == 0);
    }
}

int main(void)
{
    test_waits_and_timeouts();
    test_no_wakeup_is_lost();
    puts("ok");
    return 0;
}
