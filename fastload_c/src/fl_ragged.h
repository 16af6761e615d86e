/* Copy kernels of variable-length collation: samples of different lengths
 * into one padded block or one packed block.
 *
 * Plain C, no Python: callers run them with the GIL released. The caller
 * sizes the output first (from the samples' lengths) and passes any buffer
 * of that size, so the same kernels fill a fresh array or a slot. */
#ifndef FL_RAGGED_H
#define FL_RAGGED_H

#include <stddef.h>
#include <stdint.h>

/* Write `n` copies of the `itemsize`-byte item at `item` to `dst`. */
void fl_fill_items(char *dst, const char *item, size_t itemsize, size_t n);

/* Row i of a padded block (rows `row_bytes` apart from `dst`) gets the
 * `nbytes[i]` bytes at `src[i]`; the rest of the row is filled with the
 * `itemsize`-byte `pad_item`. Requires nbytes[i] <= row_bytes, and both
 * multiples of itemsize. */
void fl_pad_rows(char *dst, size_t row_bytes, const char *const *src, const size_t *nbytes,
                 size_t n, const char *pad_item, size_t itemsize);

/* The `nbytes[i]` bytes at `src[i]`, for i in [0, n), back to back at `dst`. */
void fl_concat_rows(char *dst, const char *const *src, const size_t *nbytes, size_t n);

/* From n sample lengths: cu_seqlens[0..n] their running sum starting at 0,
 * and position_ids[0..sum) counting 0, 1, ... within each sample. Returns -1,
 * writing nothing, when the sum does not fit in int32 (the format of varlen
 * attention kernels), else 0. */
int fl_pack_offsets(const int64_t *lengths, size_t n, int32_t *cu_seqlens, int64_t *position_ids);

/* Pack n items into bins of `capacity`, in order: each into the first open
 * bin with room for it (best_fit 0) or into the one with the least room
 * that still fits it, the earliest on ties (best_fit 1); a new bin when none
 * has room. bin_of[i] gets item i's bin, numbered in the order bins open;
 * `room` is scratch of n entries. Requires 0 <= lengths[i] <= capacity.
 * Returns the number of bins. */
size_t fl_pack_bins(const int64_t *lengths, size_t n, int64_t capacity, int best_fit,
                    int64_t *room, int64_t *bin_of);

#endif
