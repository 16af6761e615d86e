/* fl_slab: the free-slot stack and the slot size arithmetic. */
#include "check.h"
#include "fl_slab.h"

static void test_slots_are_lifo_and_catch_double_gives(void)
{
    errno = 0;
    CHECK(fl_slots_new(0) == NULL && errno == EINVAL);
    fl_slots *slots = fl_slots_new(4);
    CHECK(slots != NULL && fl_slots_count(slots) == 4 && fl_slots_free_count(slots) == 4);
    for (int64_t i = 0; i < 4; i++)
        CHECK(fl_slots_take(slots) == i);  /* a fresh set fills front to back */
    CHECK(fl_slots_take(slots) == -1 && fl_slots_free_count(slots) == 0);
    CHECK(fl_slots_give(slots, 2) == 0 && fl_slots_give(slots, 0) == 0);
    errno = 0;
    CHECK(fl_slots_give(slots, 2) == -1 && errno == EINVAL);
    CHECK(fl_slots_give(slots, 4) == -1 && errno == EINVAL);
    CHECK(fl_slots_take(slots) == 0 && fl_slots_take(slots) == 2);  /* last given, first taken */
    fl_slots_free(slots);
    fl_slots_free(NULL);
}

static void test_random_takes_and_gives_match_a_model(void)
{
    enum { N = 257 };
    uint8_t taken[N] = {0};
    uint32_t nfree = N;
    uint64_t state = 3;
    fl_slots *slots = fl_slots_new(N);
    CHECK(slots != NULL);
    for (int op = 0; op < 100000; op++) {
        uint32_t i = (uint32_t)(rnd(&state) % N);
        if (rnd(&state) % 2) {
            int64_t got = fl_slots_take(slots);
            CHECK(nfree == 0 ? got == -1 : got >= 0 && got < N && !taken[got]);
            if (got >= 0) {
                taken[got] = 1;
                nfree--;
            }
        } else {
            CHECK(fl_slots_give(slots, i) == (taken[i] ? 0 : -1));
            nfree += taken[i];
            taken[i] = 0;
        }
        CHECK(fl_slots_free_count(slots) == nfree);
    }
    fl_slots_free(slots);
}

static void test_slot_sizes(void)
{
    CHECK(fl_slab_round_slot(1, 4096) == 4096 && fl_slab_round_slot(4096, 4096) == 4096);
    CHECK(fl_slab_round_slot(4097, 4096) == 8192);
    CHECK(fl_slab_round_slot(SIZE_MAX - 100, 4096) == 0);
    CHECK(fl_slab_grown_slot_size(4096, 8000, 4096, 1) == 12288);  /* 8000 + 1/8 */
    CHECK(fl_slab_grown_slot_size(4096, 8000, 4096, 0) == 8192);   /* 8000, whole pages */
    CHECK(fl_slab_grown_slot_size(1 << 20, 8000, 4096, 1) == 1 << 20);
    CHECK(fl_slab_grown_slot_size(1 << 20, 8000, 4096, 0) == 1 << 20);
    CHECK(fl_slab_grown_slot_size(0, SIZE_MAX - 10, 4096, 0) == 0);
    CHECK(fl_slab_grown_slot_size(0, SIZE_MAX / 9 * 8, 4096, 1) == 0);
}

int main(void)
{
    test_slots_are_lifo_and_catch_double_gives();
    test_random_takes_and_gives_match_a_model();
    test_slot_sizes();
    puts("ok");
    return 0;
}
