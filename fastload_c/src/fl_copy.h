/* Copy kernels of collation and gather: rows of a batch into a slot.
 *
 * Plain C, no Python: callers run them with the GIL released. Shapes and
 * strides are numpy's (npy_intp == ptrdiff_t on every platform numpy builds
 * for); strides may be negative or zero. */
#ifndef FL_COPY_H
#define FL_COPY_H

#include <stddef.h>
#include <sys/types.h>

/* Every leaf's region in a slot starts on this boundary: a cache line, and
 * the widest alignment any numpy dtype or SIMD load asks for. */
#define FL_ALIGN 64

/* Round `n` up to a multiple of `align` (a power of two); 0 on overflow. */
size_t fl_align_up(size_t n, size_t align);

/* Copy an n-d strided array into `dst` in C order. */
void fl_copy_strided(char *dst, const char *src, int ndim, const ptrdiff_t *dims,
                     const ptrdiff_t *strides, size_t itemsize);

/* Copy `n` rows of `row_bytes` each, row i from src[i], into `dst` back to
 * back. strides[i] NULL means row i is C-contiguous; otherwise row i is
 * the strided array (ndim, dims, strides[i]). Rows that already lie back to
 * back in the source are copied as one block. */
void fl_copy_rows(char *dst, size_t row_bytes, const char *const *src,
                  const ptrdiff_t *const *strides, int ndim, const ptrdiff_t *dims,
                  size_t itemsize, size_t n);

/* As fl_copy_rows, into the file `fd` from offset `at`, with pwritev: this
 * process maps none of the slot's pages. Strided rows are copied into
 * private memory first (up to 1 MiB of them, or one row, per write).
 * Returns 0, or -1 with errno set (NOTE [ Unmapped slots ] in
 * fastload/_memory.py says why). */
int fl_write_rows(int fd, off_t at, size_t row_bytes, const char *const *src,
                  const ptrdiff_t *const *strides, int ndim, const ptrdiff_t *dims,
                  size_t itemsize, size_t n);

/* Make indices into an axis of length `len` non-negative, in place, numpy
 * style (-1 is the last). Returns -1 when all are in range, else the position
 * of the first out-of-range index (left as it was). */
ptrdiff_t fl_normalize_indices(ptrdiff_t *idx, size_t n, ptrdiff_t len);

/* Gather rows idx[0..n) of a source whose row i starts at src + i * stride0
 * into `dst` back to back. Each row is `row_bytes` long; when `contiguous`
 * it is one block, else the strided array (ndim, dims, strides). Indices
 * must be normalized. Runs of consecutive indices over back-to-back rows are
 * copied as one block. */
void fl_gather_rows(char *dst, const char *src, ptrdiff_t stride0, const ptrdiff_t *idx,
                    size_t n, size_t row_bytes, int contiguous, int ndim,
                    const ptrdiff_t *dims, const ptrdiff_t *strides, size_t itemsize);

#endif
