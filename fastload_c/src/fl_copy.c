#include "fl_copy.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

/* numpy allows up to 64 dimensions (NPY_MAXDIMS). */
#define FL_MAXDIMS 64

size_t fl_align_up(size_t n, size_t align)
{
    size_t mask = align - 1;
    if (n > SIZE_MAX - mask)
        return 0;
    return (n + mask) & ~mask;
}

/* One element; the fixed sizes compile to single moves. */
static inline void copy_item(char *dst, const char *src, size_t itemsize)
{
    switch (itemsize) {
    case 1: memcpy(dst, src, 1); break;
    case 2: memcpy(dst, src, 2); break;
    case 4: memcpy(dst, src, 4); break;
    case 8: memcpy(dst, src, 8); break;
    case 16: memcpy(dst, src, 16); break;
    default: memcpy(dst, src, itemsize); break;
    }
}

void fl_copy_strided(char *dst, const char *src, int ndim, const ptrdiff_t *dims,
                     const ptrdiff_t *strides, size_t itemsize)
{
    ptrdiff_t shape[FL_MAXDIMS], step[FL_MAXDIMS], index[FL_MAXDIMS];
    int nd = 0;

    /* Drop length-1 axes and merge axes that walk memory as one (stride of
     * the outer == extent of the inner), so a view like a[:, ::2] of a 4-d
     * array becomes as few loops as its memory allows. */
    for (int i = 0; i < ndim; i++) {
        if (dims[i] == 0)
            return;
        if (dims[i] == 1)
            continue;
        if (nd > 0 && step[nd - 1] == strides[i] * dims[i]) {
            shape[nd - 1] *= dims[i];
            step[nd - 1] = strides[i];
            continue;
        }
        shape[nd] = dims[i];
        step[nd] = strides[i];
        nd++;
    }
    if (nd == 0) {
        copy_item(dst, src, itemsize);
        return;
    }

    /* The innermost axis is either one block or an element loop. */
    ptrdiff_t inner_n = shape[nd - 1], inner_step = step[nd - 1];
    int inner_block = inner_step == (ptrdiff_t)itemsize;
    size_t inner_bytes = (size_t)inner_n * itemsize;
    int outer = nd - 1;
    for (int i = 0; i < outer; i++)
        index[i] = 0;

    for (;;) {
        if (inner_block) {
            memcpy(dst, src, inner_bytes);
            dst += inner_bytes;
        } else {
            const char *s = src;
            for (ptrdiff_t j = 0; j < inner_n; j++, s += inner_step, dst += itemsize)
                copy_item(dst, s, itemsize);
        }
        /* Advance the outer odometer; done when it wraps. */
        int d = outer - 1;
        for (; d >= 0; d--) {
            src += step[d];
            if (++index[d] < shape[d])
                break;
            src -= step[d] * shape[d];
            index[d] = 0;
        }
        if (d < 0)
            return;
    }
}

void fl_copy_rows(char *dst, size_t row_bytes, const char *const *src,
                  const ptrdiff_t *const *strides, int ndim, const ptrdiff_t *dims,
                  size_t itemsize, size_t n)
{
    if (row_bytes == 0)
        return;
    size_t i = 0;
    while (i < n) {
        if (strides[i] != NULL) {
            fl_copy_strided(dst + i * row_bytes, src[i], ndim, dims, strides[i], itemsize);
            i++;
            continue;
        }
        /* Samples that are consecutive rows of one array (a dataset
         * returning views) are one memcpy. */
        size_t j = i + 1;
        while (j < n && strides[j] == NULL && src[j] == src[j - 1] + row_bytes)
            j++;
        memcpy(dst + i * row_bytes, src[i], (j - i) * row_bytes);
        i = j;
    }
}

/* Rows written by one pwritev at most (IOV_MAX is 1024 on Linux), and the
 * bytes of strided rows copied into private memory for one. */
#define FL_WRITE_IOVS 256
#define FL_BOUNCE_BYTES (1u << 20)

/* Write iov[0..count) to fd at `at`, retrying short writes and EINTR. The
 * iovecs are consumed. */
static int write_all(int fd, off_t at, struct iovec *iov, int count)
{
    while (count > 0) {
        ssize_t done = pwritev(fd, iov, count, at);
        if (done < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (done == 0) {
            /* No progress on a regular file: the slot lies past its end. */
            errno = EIO;
            return -1;
        }
        at += done;
        while (count > 0 && (size_t)done >= iov->iov_len) {
            done -= (ssize_t)iov->iov_len;
            iov++;
            count--;
        }
        if (count > 0) {
            iov->iov_base = (char *)iov->iov_base + done;
            iov->iov_len -= (size_t)done;
        }
    }
    return 0;
}

int fl_write_rows(int fd, off_t at, size_t row_bytes, const char *const *src,
                  const ptrdiff_t *const *strides, int ndim, const ptrdiff_t *dims,
                  size_t itemsize, size_t n)
{
    struct iovec iov[FL_WRITE_IOVS];
    char *bounce = NULL;
    size_t bounce_rows = 0, bounced = 0;
    int count = 0;
    off_t start = at;  /* where iov[0] goes in the file */
    if (row_bytes == 0)
        return 0;
    for (size_t i = 0; i < n; i++) {
        const char *row = src[i];
        int strided = strides[i] != NULL;
        if (strided && bounce == NULL) {
            bounce_rows = row_bytes >= FL_BOUNCE_BYTES ? 1 : FL_BOUNCE_BYTES / row_bytes;
            bounce = malloc(bounce_rows * row_bytes);
            if (bounce == NULL) {
                errno = ENOMEM;
                return -1;
            }
        }
        /* Out of iovecs, or of bounce rows for this one: write the rows so
         * far, which frees both. */
        if (count == FL_WRITE_IOVS || (strided && bounced == bounce_rows)) {
            if (write_all(fd, start, iov, count) != 0)
                goto failed;
            start = at + (off_t)(i * row_bytes);
            count = 0;
            bounced = 0;
        }
        if (strided) {
            char *copy = bounce + bounced++ * row_bytes;
            fl_copy_strided(copy, row, ndim, dims, strides[i], itemsize);
            row = copy;
        }
        /* Rows back to back in memory (views of one array, bounced rows)
         * are one iovec. */
        if (count > 0 && row == (const char *)iov[count - 1].iov_base + iov[count - 1].iov_len) {
            iov[count - 1].iov_len += row_bytes;
        } else {
            iov[count].iov_base = (void *)row;
            iov[count].iov_len = row_bytes;
            count++;
        }
    }
    if (write_all(fd, start, iov, count) != 0)
        goto failed;
    free(bounce);
    return 0;
failed: {
        int err = errno;
        free(bounce);
        errno = err;
        return -1;
    }
}

ptrdiff_t fl_normalize_indices(ptrdiff_t *idx, size_t n, ptrdiff_t len)
{
    for (size_t i = 0; i < n; i++) {
        ptrdiff_t k = idx[i];
        if (k < 0)
            k += len;
        if (k < 0 || k >= len)
            return (ptrdiff_t)i;
        idx[i] = k;
    }
    return -1;
}

/* How many rows ahead a gather prefetches: a random row is a cache miss,
 * and several misses in flight overlap (NOTE [ Row gathers ]). */
#define FL_PREFETCH_ROWS 8

/* Rows of SIZE bytes, the rows FL_PREFETCH_ROWS ahead prefetched (their
 * first and last byte: a row may span two lines). With SIZE a constant the
 * copy is inlined. */
#define FL_GATHER_ROWS(SIZE)                                                    \
    for (size_t i = 0; i < n; i++) {                                            \
        if (i + FL_PREFETCH_ROWS < n) {                                         \
            const char *ahead = src + idx[i + FL_PREFETCH_ROWS] * stride0;      \
            __builtin_prefetch(ahead);                                          \
            __builtin_prefetch(ahead + (SIZE) - 1);                             \
        }                                                                       \
        memcpy(dst + i * (SIZE), src + idx[i] * stride0, (SIZE));               \
    }

/* NOTE [ Row gathers ]
 * A gather of random rows is bound by memory latency, not bandwidth: each
 * row is a cache miss of its own. Prefetching the rows a few ahead keeps
 * several misses in flight, and rows of a power-of-two size up to 64 bytes
 * are copied inline rather than by a call to memcpy each. Runs of
 * consecutive rows (a sequential sampler) are still one memcpy each.
 * bench/bench_gather.py, 256 random rows of a 16 MiB to 256 MiB array,
 * µs per batch, gather_into before (a memcpy call per row, no prefetch,
 * its per-call Python work) -> RowGather now, np.take beside: rows of
 * 16 B 5.1 -> 2.1 (1.7), 64 B 5.9 -> 2.1 (3.0), 256 B 8.6 -> 4.7 (6.0),
 * 1 KiB 45.6 -> 30.7 (36.8). */
void fl_gather_rows(char *dst, const char *src, ptrdiff_t stride0, const ptrdiff_t *idx,
                    size_t n, size_t row_bytes, int contiguous, int ndim,
                    const ptrdiff_t *dims, const ptrdiff_t *strides, size_t itemsize)
{
    if (row_bytes == 0)
        return;
    if (!contiguous) {
        for (size_t i = 0; i < n; i++)
            fl_copy_strided(dst + i * row_bytes, src + idx[i] * stride0, ndim, dims, strides,
                            itemsize);
        return;
    }
    int packed = stride0 == (ptrdiff_t)row_bytes;
    if (packed && n > 1 && idx[1] == idx[0] + 1) {
        /* Consecutive rows: runs, each one memcpy. */
        size_t i = 0;
        while (i < n) {
            size_t j = i + 1;
            while (j < n && idx[j] == idx[j - 1] + 1)
                j++;
            memcpy(dst + i * row_bytes, src + idx[i] * stride0, (j - i) * row_bytes);
            i = j;
        }
        return;
    }
    switch (row_bytes) {
    case 1: FL_GATHER_ROWS(1) return;
    case 2: FL_GATHER_ROWS(2) return;
    case 4: FL_GATHER_ROWS(4) return;
    case 8: FL_GATHER_ROWS(8) return;
    case 16: FL_GATHER_ROWS(16) return;
    case 32: FL_GATHER_ROWS(32) return;
    case 64: FL_GATHER_ROWS(64) return;
    default: FL_GATHER_ROWS(row_bytes) return;
    }
}
