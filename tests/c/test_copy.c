/* fl_copy: every kernel against an element-by-element reference, on random
 * shapes, strides (negative and zero too) and item sizes, up to numpy's 64
 * dimensions. ASan catches a read or write outside the arrays. */
#include "check.h"

#include <fcntl.h>
#include "fl_copy.h"

enum { MAXD = 64 };

typedef struct {
    int ndim;
    ptrdiff_t dims[MAXD], strides[MAXD];
    size_t itemsize, span, origin; /* bytes the array touches; its start's offset */
    size_t count;                  /* elements */
} layout;

static void random_layout(layout *a, uint64_t *state, int ndim, size_t itemsize)
{
    a->ndim = ndim;
    a->itemsize = itemsize;
    a->count = 1;
    ptrdiff_t inner = (ptrdiff_t)itemsize;
    size_t low = 0, high = itemsize;
    for (int d = ndim - 1; d >= 0; d--) {
        a->dims[d] = ndim > 8 ? 1 + (ptrdiff_t)(rnd(state) % 16 == 0) : (ptrdiff_t)(rnd(state) % 5);
        switch (rnd(state) % 5) {
        case 0: a->strides[d] = inner; break;                   /* C order */
        case 1: a->strides[d] = -inner; break;                  /* reversed */
        case 2: a->strides[d] = 0; break;                       /* broadcast */
        default: a->strides[d] = inner * (ptrdiff_t)(1 + rnd(state) % 3); break;
        }
        ptrdiff_t reach = a->dims[d] > 0 ? a->strides[d] * (a->dims[d] - 1) : 0;
        if (reach < 0)
            low += (size_t)-reach;
        else
            high += (size_t)reach;
        inner = a->dims[d] * (ptrdiff_t)itemsize * 2 + (ptrdiff_t)itemsize;
        a->count *= (size_t)a->dims[d];
    }
    a->origin = low;
    a->span = low + high;
}

/* The reference: element k in C order, located by its index digits. */
static void reference_copy(char *dst, const char *src, const layout *a)
{
    for (size_t k = 0; k < a->count; k++) {
        size_t rest = k;
        const char *p = src;
        for (int d = a->ndim - 1; d >= 0; d--) {
            p += (ptrdiff_t)(rest % (size_t)a->dims[d]) * a->strides[d];
            rest /= (size_t)a->dims[d];
        }
        memcpy(dst + k * a->itemsize, p, a->itemsize);
    }
}

static char *random_bytes(size_t n, uint64_t *state)
{
    char *p = malloc(n ? n : 1);
    CHECK(p != NULL);
    for (size_t i = 0; i < n; i++)
        p[i] = (char)rnd(state);
    return p;
}

static void test_copy_strided_matches_the_reference(void)
{
    static const size_t itemsizes[] = {1, 2, 3, 4, 8, 12, 16};
    uint64_t state = 11;
    for (int trial = 0; trial < 4000; trial++) {
        layout a;
        int ndim = trial % 50 == 0 ? MAXD : (int)(rnd(&state) % 6);
        random_layout(&a, &state, ndim, itemsizes[rnd(&state) % 7]);
        char *src = random_bytes(a.span, &state);
        char *got = malloc(a.count * a.itemsize + 1), *want = malloc(a.count * a.itemsize + 1);
        CHECK(got != NULL && want != NULL);
        fl_copy_strided(got, src + a.origin, a.ndim, a.dims, a.strides, a.itemsize);
        reference_copy(want, src + a.origin, &a);
        CHECK(memcmp(got, want, a.count * a.itemsize) == 0);
        free(src);
        free(got);
        free(want);
    }
}

/* A slot of `size` bytes in a memfd, mapped shared, as a pool segment. */
static char *file_slot(int *fd, size_t size)
{
    *fd = memfd_create("test_copy", 0);
    CHECK(*fd >= 0 && ftruncate(*fd, (off_t)size) == 0);
    char *map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
    CHECK(map != MAP_FAILED);
    return map;
}

/* fl_copy_rows, and fl_write_rows into a file at an offset, against memcpy
 * and the reference: rows contiguous or strided, often consecutive in their
 * source, sometimes more than one pwritev takes. */
static void test_copy_and_write_rows_merge_back_to_back_rows(void)
{
    uint64_t state = 5;
    for (int trial = 0; trial < 500; trial++) {
        layout a;
        random_layout(&a, &state, 1 + (int)(rnd(&state) % 3), 4);
        size_t row_bytes = a.count * a.itemsize;
        size_t n = trial % 25 == 0 ? 300 + rnd(&state) % 400 : rnd(&state) % 9;
        char *pool = random_bytes(a.span * n + row_bytes * n, &state);
        const char **src = malloc((n + 1) * sizeof *src);
        const ptrdiff_t **strides = malloc((n + 1) * sizeof *strides);
        size_t at = 0;
        char *got = malloc(row_bytes * n + 1), *want = malloc(row_bytes * n + 1);
        CHECK(src != NULL && strides != NULL && got != NULL && want != NULL);
        for (size_t i = 0; i < n; i++) {
            int strided = rnd(&state) % 3 == 0;
            strides[i] = strided ? a.strides : NULL;
            /* Contiguous rows are often consecutive, as views of one array. */
            if (!strided)
                at = i > 0 && !strides[i - 1] && rnd(&state) % 2 && at + 1 < n ? at + 1
                   : rnd(&state) % n;
            src[i] = strided ? pool + a.span * i + a.origin : pool + a.span * n + row_bytes * at;
            if (strided)
                reference_copy(want + i * row_bytes, src[i], &a);
            else
                memcpy(want + i * row_bytes, src[i], row_bytes);
        }
        fl_copy_rows(got, row_bytes, src, strides, a.ndim, a.dims, a.itemsize, n);
        CHECK(memcmp(got, want, row_bytes * n) == 0);

        int fd;
        size_t offset = 4096 + 64 * (rnd(&state) % 8), size = offset + row_bytes * n + 1;
        char *map = file_slot(&fd, size);
        CHECK(fl_write_rows(fd, (off_t)offset, row_bytes, src, strides, a.ndim, a.dims,
                            a.itemsize, n) == 0);
        CHECK(memcmp(map + offset, want, row_bytes * n) == 0);
        CHECK(munmap(map, size) == 0 && close(fd) == 0);
        free(pool);
        free(src);
        free(strides);
        free(got);
        free(want);
    }
}

/* Strided rows of 400 KB (two fit the 1 MiB bounce) and of 1.2 MB (one,
 * larger than it), mixed with contiguous ones. */
static void test_write_rows_bounces_large_strided_rows(void)
{
    uint64_t state = 17;
    static const ptrdiff_t widths[] = {100000, 300000};
    for (int w = 0; w < 2; w++) {
        ptrdiff_t dims[] = {widths[w]}, every_other[] = {8};
        size_t row_bytes = (size_t)widths[w] * 4, n = 7;
        char *source = random_bytes(2 * row_bytes * n, &state);
        char *want = malloc(row_bytes * n);
        const char *src[7];
        const ptrdiff_t *strides[7];
        layout a = {.ndim = 1, .dims = {widths[w]}, .strides = {8}, .itemsize = 4,
                    .count = (size_t)widths[w]};
        CHECK(want != NULL);
        for (size_t i = 0; i < n; i++) {
            src[i] = source + 2 * row_bytes * i;
            strides[i] = i == 3 ? NULL : every_other;
            if (strides[i] == NULL)
                memcpy(want + i * row_bytes, src[i], row_bytes);
            else
                reference_copy(want + i * row_bytes, src[i], &a);
        }
        int fd;
        char *map = file_slot(&fd, 64 + row_bytes * n);
        CHECK(fl_write_rows(fd, 64, row_bytes, src, strides, 1, dims, 4, n) == 0);
        CHECK(memcmp(map + 64, want, row_bytes * n) == 0);
        CHECK(munmap(map, 64 + row_bytes * n) == 0 && close(fd) == 0);
        free(source);
        free(want);
    }
}

static void test_write_rows_reports_a_failed_write(void)
{
    char row[64] = {1};
    const char *src[] = {row};
    const ptrdiff_t *strides[] = {NULL};
    ptrdiff_t dims[] = {64};
    int fd;
    char *map = file_slot(&fd, 4096);
    int read_only = open("/dev/null", O_RDONLY);
    CHECK(read_only >= 0);
    errno = 0;
    CHECK(fl_write_rows(read_only, 0, 64, src, strides, 1, dims, 1, 1) == -1
          && errno == EBADF);
    CHECK(close(read_only) == 0 && munmap(map, 4096) == 0 && close(fd) == 0);
}

static void test_gather_rows_and_index_normalization(void)
{
    uint64_t state = 9;
    ptrdiff_t idx[] = {0, -1, 3, -4};
    CHECK(fl_normalize_indices(idx, 4, 4) == -1);
    CHECK(idx[0] == 0 && idx[1] == 3 && idx[2] == 3 && idx[3] == 0);
    ptrdiff_t bad[] = {1, 4, -9};
    CHECK(fl_normalize_indices(bad, 3, 4) == 1 && bad[1] == 4);
    CHECK(fl_normalize_indices(bad + 2, 1, 4) == 0);
    CHECK(fl_align_up(1, 64) == 64 && fl_align_up(64, 64) == 64 && fl_align_up(SIZE_MAX, 64) == 0);
    /* The sizes copied inline (NOTE [ Row gathers ]) and others around them. */
    static const size_t sizes[] = {1, 2, 3, 4, 8, 16, 24, 32, 40, 48, 64, 65, 100};
    for (int trial = 0; trial < 2000; trial++) {
        layout row;
        random_layout(&row, &state, 1 + (int)(rnd(&state) % 2), 8);
        int contiguous = rnd(&state) % 2;
        size_t row_bytes = contiguous ? sizes[rnd(&state) % (sizeof sizes / sizeof *sizes)]
                                      : row.count * row.itemsize;
        /* Up to 40 rows: past the rows a gather prefetches ahead. */
        size_t rows = 1 + rnd(&state) % 12, n = rnd(&state) % 41;
        size_t extent = contiguous ? row_bytes : row.span;  /* bytes one row touches */
        ptrdiff_t stride0 = (ptrdiff_t)(extent + (contiguous && rnd(&state) % 2 ? 0 : 8));
        char *src = random_bytes((size_t)stride0 * rows, &state);
        char *got = malloc(row_bytes * n + 1), *want = malloc(row_bytes * n + 1);
        ptrdiff_t at[41];
        CHECK(got != NULL && want != NULL);
        for (size_t i = 0; i < n; i++) {
            at[i] = i > 0 && rnd(&state) % 2 && (size_t)at[i - 1] + 1 < rows ? at[i - 1] + 1
                  : (ptrdiff_t)(rnd(&state) % rows);
            const char *from = src + at[i] * stride0 + (contiguous ? 0 : row.origin);
            if (contiguous)
                memcpy(want + i * row_bytes, from, row_bytes);
            else
                reference_copy(want + i * row_bytes, from, &row);
        }
        fl_gather_rows(got, contiguous ? src : src + row.origin, stride0, at, n, row_bytes,
                       contiguous, row.ndim, row.dims, row.strides, row.itemsize);
        CHECK(memcmp(got, want, row_bytes * n) == 0);
        free(src);
        free(got);
        free(want);
    }
}

int main(void)
{
    test_copy_strided_matches_the_reference();
    test_copy_and_write_rows_merge_back_to_back_rows();
    test_write_rows_bounces_large_strided_rows();
    test_write_rows_reports_a_failed_write();
    test_gather_rows_and_index_normalization();
    puts("ok");
    return 0;
}
