/* fl_ragged: padding, concatenation, pack offsets and bin packing against
 * straightforward references, on random lengths and item sizes. ASan
 * catches a read or write outside the buffers. */
#include "check.h"
#include "fl_ragged.h"

enum { MAXN = 40, MAXLEN = 24, MAXITEM = 16 };

static void test_pad_rows_copies_each_row_then_pads(uint64_t *state)
{
    for (int round = 0; round < 200; round++) {
        size_t n = rnd(state) % MAXN, itemsize = 1 + rnd(state) % MAXITEM, longest = 0;
        size_t nbytes[MAXN];
        char *src[MAXN];
        for (size_t i = 0; i < n; i++) {
            size_t len = rnd(state) % MAXLEN;
            longest = len > longest ? len : longest;
            nbytes[i] = len * itemsize;
            src[i] = malloc(nbytes[i] ? nbytes[i] : 1);
            CHECK(src[i] != NULL);
            for (size_t b = 0; b < nbytes[i]; b++)
                src[i][b] = (char)rnd(state);
        }
        size_t row = (longest + rnd(state) % 3) * itemsize;
        char pad[MAXITEM];
        for (size_t b = 0; b < itemsize; b++)
            pad[b] = (char)rnd(state);
        char *dst = malloc(n > 0 && row > 0 ? n * row : 1);
        CHECK(dst != NULL);
        fl_pad_rows(dst, row, (const char *const *)src, nbytes, n, pad, itemsize);
        for (size_t i = 0; i < n; i++) {
            CHECK(memcmp(dst + i * row, src[i], nbytes[i]) == 0);
            for (size_t at = nbytes[i]; at < row; at += itemsize)
                CHECK(memcmp(dst + i * row + at, pad, itemsize) == 0);
            free(src[i]);
        }
        free(dst);
    }
}

static void test_concat_rows_puts_samples_back_to_back(uint64_t *state)
{
    for (int round = 0; round < 200; round++) {
        size_t n = rnd(state) % MAXN, total = 0, nbytes[MAXN];
        char *src[MAXN];
        for (size_t i = 0; i < n; i++) {
            nbytes[i] = rnd(state) % (MAXLEN * 4);
            src[i] = malloc(nbytes[i] ? nbytes[i] : 1);
            CHECK(src[i] != NULL);
            for (size_t b = 0; b < nbytes[i]; b++)
                src[i][b] = (char)rnd(state);
            total += nbytes[i];
        }
        char *dst = malloc(total ? total : 1);
        CHECK(dst != NULL);
        fl_concat_rows(dst, (const char *const *)src, nbytes, n);
        size_t at = 0;
        for (size_t i = 0; i < n; i++) {
            CHECK(memcmp(dst + at, src[i], nbytes[i]) == 0);
            at += nbytes[i];
            free(src[i]);
        }
        free(dst);
    }
}

static void test_pack_offsets_and_positions(uint64_t *state)
{
    int64_t lengths[MAXN], positions[MAXN * MAXLEN];
    int32_t cu[MAXN + 1];
    for (int round = 0; round < 200; round++) {
        size_t n = rnd(state) % MAXN;
        for (size_t i = 0; i < n; i++)
            lengths[i] = (int64_t)(rnd(state) % MAXLEN);
        CHECK(fl_pack_offsets(lengths, n, cu, positions) == 0);
        CHECK(cu[0] == 0);
        for (size_t i = 0; i < n; i++) {
            CHECK(cu[i + 1] == cu[i] + lengths[i]);
            for (int64_t k = 0; k < lengths[i]; k++)
                CHECK(positions[cu[i] + k] == k);
        }
    }
    /* A total past int32 is refused and nothing is written. */
    int64_t huge[2] = {INT32_MAX, 1};
    int32_t untouched[3] = {7, 7, 7};
    CHECK(fl_pack_offsets(huge, 2, untouched, positions) == -1);
    CHECK(untouched[0] == 7 && untouched[1] == 7 && untouched[2] == 7);
}

/* Checks an assignment against the header's contract, step by step: the
 * rooms each item saw follow from the items before it. */
static void check_packing(const int64_t *lengths, size_t n, int64_t capacity, int best_fit,
                          const int64_t *bin_of, size_t bins)
{
    int64_t room[MAXN];
    size_t open = 0;
    for (size_t i = 0; i < n; i++) {
        size_t chosen = (size_t)bin_of[i];
        CHECK(chosen <= open);
        for (size_t b = 0; b < open; b++) {
            if (room[b] < lengths[i] || b == chosen)
                continue;
            /* Another bin that fits: it must not be a better choice. */
            if (best_fit)
                CHECK(chosen < open && (room[chosen] < room[b] ||
                                        (room[chosen] == room[b] && chosen < b)));
            else
                CHECK(chosen < b);
        }
        if (chosen == open)
            room[open++] = capacity; /* only when none had room: checked above */
        CHECK(room[chosen] >= lengths[i]);
        room[chosen] -= lengths[i];
    }
    CHECK(open == bins);
}

static void test_pack_bins_keeps_its_contract(uint64_t *state)
{
    int64_t lengths[MAXN], bin_of[MAXN], scratch[MAXN];
    for (int round = 0; round < 2000; round++) {
        size_t n = rnd(state) % MAXN;
        int64_t capacity = 1 + (int64_t)(rnd(state) % 64);
        for (size_t i = 0; i < n; i++)
            lengths[i] = (int64_t)(rnd(state) % (uint64_t)(capacity + 1));
        for (int best_fit = 0; best_fit < 2; best_fit++) {
            size_t bins = fl_pack_bins(lengths, n, capacity, best_fit, scratch, bin_of);
            check_packing(lengths, n, capacity, best_fit, bin_of, bins);
        }
    }
}

int main(void)
{
    uint64_t state = 0x5eed0017;
    test_pad_rows_copies_each_row_then_pads(&state);
    test_concat_rows_puts_samples_back_to_back(&state);
    test_pack_offsets_and_positions(&state);
    test_pack_bins_keeps_its_contract(&state);
    puts("ok");
    return 0;
}
