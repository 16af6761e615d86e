/* fl_ring: FIFO behaviour at every wrap offset against a model, the status
 * codes, and a two-sided stress run (FASTLOAD_C_STRESS messages of random
 * sizes; none lost, duplicated or corrupted). */
#include "check.h"
#include "fl_ring.h"

static const struct timespec *after(double seconds, struct timespec *ts)
{
    fl_deadline_after(seconds, ts);
    return ts;
}

static uint64_t record(uint64_t len)
{
    return 8 + (len + 7) / 8 * 8;
}

/* Message `i` of a run seeded `seed`: its size, and its bytes into `out`. */
static uint64_t message_size(uint64_t seed, uint64_t i, uint64_t max)
{
    uint64_t s = seed ^ (i * 0x9E3779B97F4A7C15ULL) ^ 1, pick = rnd(&s) % 100, size;
    if (pick < 85)
        size = rnd(&s) % 64;
    else if (pick < 98)
        size = 64 + rnd(&s) % 2048;
    else
        size = rnd(&s) % (max + 1);
    return size;
}

static void message_bytes(uint64_t seed, uint64_t i, unsigned char *out, uint64_t size)
{
    uint64_t s = (seed + i) * 0xD1B54A32D192ED03ULL | 1;
    for (uint64_t k = 0; k < size; k += 8) {
        uint64_t word = rnd(&s);
        memcpy(out + k, &word, size - k < 8 ? size - k : 8);
    }
    if (size >= 8)
        memcpy(out, &i, 8);
}

static fl_ring *new_ring(uint64_t capacity)
{
    void *mem = shared_zeroed(fl_ring_segment_size(capacity));
    fl_ring_format(mem, capacity);
    fl_ring *r = calloc(1, sizeof *r);
    CHECK(r != NULL);
    CHECK(fl_ring_attach(r, mem, fl_ring_segment_size(capacity)) == 0);
    return r;
}

static void free_ring(fl_ring *r)
{
    CHECK(munmap(r->sh, fl_ring_segment_size(r->capacity)) == 0);
    free(r);
}

static void test_fifo_against_a_model(void)
{
    unsigned char msg[512], got[512];
    uint64_t sizes[128], first = 0, last = 0, used = 0, serial = 0, state = 42;
    for (uint64_t capacity = 64; capacity <= 512; capacity *= 2) {
        fl_ring *r = new_ring(capacity);
        first = last = used = 0;
        for (int op = 0; op < 20000; op++) {
            if (rnd(&state) % 2) {
                uint64_t len = rnd(&state) % (capacity - 7);
                int fits = used + record(len) <= capacity;
                CHECK(fl_ring_space(r) == (capacity - used > 8 ? capacity - used - 8 : 0));
                message_bytes(1, serial, msg, len);
                int rc = fl_ring_try_put(r, msg, len);
                CHECK(rc == (fits ? 0 : FL_RING_AGAIN));
                if (fits) {
                    sizes[last++ % 128] = len | serial++ << 32;
                    used += record(len);
                }
            } else {
                fl_ring_msg m;
                int rc = fl_ring_try_peek(r, &m);
                if (first == last) {
                    CHECK(rc == FL_RING_AGAIN);
                    continue;
                }
                CHECK(rc == 0);
                uint64_t len = sizes[first % 128] & 0xffffffff, id = sizes[first++ % 128] >> 32;
                CHECK(m.len == len && m.size[0] + m.size[1] == len);
                fl_ring_copy(&m, got);
                message_bytes(1, id, msg, len);
                CHECK(memcmp(got, msg, len) == 0);
                fl_ring_release(r);
                used -= record(len);
            }
            CHECK(fl_ring_count(r) == last - first);
        }
        free_ring(r);
    }
}

static void test_status_codes(void)
{
    struct timespec ts;
    fl_ring_msg m;
    fl_ring *r = new_ring(64);
    unsigned char big[64] = {0};
    CHECK(fl_ring_try_put(r, big, 57) == FL_RING_TOOBIG);
    CHECK(fl_ring_try_put(r, big, 56) == 0);
    CHECK(fl_ring_put(r, big, 0, after(0.001, &ts)) == FL_RING_TIMEOUT);
    fl_ring_set_spin(r, 0);
    CHECK(fl_ring_put(r, big, 0, after(0.001, &ts)) == FL_RING_TIMEOUT);
    /* A peeked message stays until released; unpeek lends it again. */
    CHECK(fl_ring_try_peek(r, &m) == 0 && m.len == 56);
    fl_ring_unpeek(r);
    CHECK(fl_ring_count(r) == 1 && fl_ring_space(r) == 0);
    CHECK(fl_ring_peek(r, &m, NULL) == 0 && m.len == 56);
    fl_ring_release(r);
    CHECK(fl_ring_peek(r, &m, after(0.001, &ts)) == FL_RING_TIMEOUT);
    /* Close: puts refused, what is left delivered, then CLOSED. */
    CHECK(fl_ring_try_put(r, "x", 1) == 0);
    fl_ring_close(r);
    CHECK(fl_ring_is_closed(r));
    CHECK(fl_ring_try_put(r, "y", 1) == FL_RING_CLOSED);
    CHECK(fl_ring_peek(r, &m, NULL) == 0 && m.len == 1 && m.part[0][0] == 'x');
    CHECK(fl_ring_peek(r, &m, NULL) == FL_RING_CLOSED);
    free_ring(r);
}

static void test_corrupt_length_and_bad_memory_are_refused(void)
{
    fl_ring_msg m;
    fl_ring *r = new_ring(128);
    CHECK(fl_ring_try_put(r, "abcdefgh", 8) == 0);
    uint64_t lie = 1000;
    memcpy(r->data, &lie, 8);  /* another holder scribbled on the length */
    CHECK(fl_ring_try_peek(r, &m) == FL_RING_CORRUPT);
    fl_ring other;
    errno = 0;
    CHECK(fl_ring_attach(&other, r->sh, 64) == -1 && errno == EINVAL);
    CHECK(fl_ring_attach(&other, r->sh, fl_ring_segment_size(64)) == -1 && errno == EINVAL);
    free_ring(r);
    static _Alignas(FL_RING_LINE) unsigned char zeros[4096];
    CHECK(fl_ring_attach(&other, zeros, sizeof zeros) == -1 && errno == EINVAL);
    CHECK(!fl_ring_capacity_ok(32) && !fl_ring_capacity_ok(96) && fl_ring_capacity_ok(1 << 20));
}

struct stress {
    fl_ring *r;
    uint64_t n, seed;
};

static void produce(void *arg)
{
    struct stress *s = arg;
    uint64_t max = fl_ring_max_message(s->r);
    unsigned char *msg = malloc(max);
    struct timespec ts;
    CHECK(msg != NULL);
    for (uint64_t i = 0; i < s->n; i++) {
        uint64_t size = message_size(s->seed, i, max);
        message_bytes(s->seed, i, msg, size);
        int rc;
        while ((rc = fl_ring_put(s->r, msg, size, after(30, &ts))) == FL_RING_INTR)
            ;
        CHECK(rc == 0);
    }
    fl_ring_close(s->r);
    free(msg);
}

static void consume_and_verify(struct stress *s)
{
    uint64_t max = fl_ring_max_message(s->r);
    unsigned char *want = malloc(max), *got = malloc(max);
    struct timespec ts;
    fl_ring_msg m;
    CHECK(want != NULL && got != NULL);
    for (uint64_t i = 0; i < s->n; i++) {
        int rc;
        while ((rc = fl_ring_peek(s->r, &m, after(30, &ts))) == FL_RING_INTR)
            ;
        CHECK(rc == 0);
        uint64_t size = message_size(s->seed, i, max);
        if (m.len != size) {
            fprintf(stderr, "message %llu: %llu bytes, expected %llu\n", (unsigned long long)i,
                    (unsigned long long)m.len, (unsigned long long)size);
            exit(1);
        }
        message_bytes(s->seed, i, want, size);
        fl_ring_copy(&m, got);
        CHECK(memcmp(want, got, size) == 0);
        fl_ring_release(s->r);
    }
    CHECK(fl_ring_peek(s->r, &m, after(30, &ts)) == FL_RING_CLOSED);
    free(want);
    free(got);
}

static void test_stress_between_two_sides(void)
{
    uint64_t n = env_count("FASTLOAD_C_STRESS", 300000);
    FOR_EACH_PEER_KIND(fork_it) {
        for (int spin = 0; spin < 2; spin++) {
            /* Small rings wrap often and make both sides wait. */
            struct stress s = {new_ring(spin ? 1 << 16 : 1 << 12), spin ? n : n / 10, 7 + spin};
            fl_ring_set_spin(s.r, spin ? FL_RING_SPIN_NS : 0);
            peer p = peer_start(fork_it, produce, &s);
            consume_and_verify(&s);
            peer_join(p);
            free_ring(s.r);
        }
    }
}

int main(void)
{
    test_fifo_against_a_model();
    test_status_codes();
    test_corrupt_length_and_bad_memory_are_refused();
    test_stress_between_two_sides();
    puts("ok");
    return 0;
}
