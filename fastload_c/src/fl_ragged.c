#include "fl_ragged.h"

#include <string.h>

void fl_fill_items(char *dst, const char *item, size_t itemsize, size_t n)
{
    size_t total = n * itemsize;
    if (total == 0)
        return;
    /* A pad of all-zero bytes (the usual padding_value=0) is one memset. */
    int zero = 1;
    for (size_t i = 0; i < itemsize; i++)
        zero &= item[i] == 0;
    if (zero) {
        memset(dst, 0, total);
        return;
    }
    /* Otherwise one item, then the filled prefix doubled until it covers
     * the range: log2(n) memcpys instead of n small ones. */
    memcpy(dst, item, itemsize);
    size_t done = itemsize;
    while (done < total) {
        size_t chunk = done < total - done ? done : total - done;
        memcpy(dst + done, dst, chunk);
        done += chunk;
    }
}

void fl_pad_rows(char *dst, size_t row_bytes, const char *const *src, const size_t *nbytes,
                 size_t n, const char *pad_item, size_t itemsize)
{
    for (size_t i = 0; i < n; i++) {
        char *row = dst + i * row_bytes;
        memcpy(row, src[i], nbytes[i]);
        fl_fill_items(row + nbytes[i], pad_item, itemsize, (row_bytes - nbytes[i]) / itemsize);
    }
}

void fl_concat_rows(char *dst, const char *const *src, const size_t *nbytes, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        memcpy(dst, src[i], nbytes[i]);
        dst += nbytes[i];
    }
}

int fl_pack_offsets(const int64_t *lengths, size_t n, int32_t *cu_seqlens, int64_t *position_ids)
{
    int64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        total += lengths[i];
        if (lengths[i] < 0 || total > INT32_MAX)
            return -1;
    }
    int64_t start = 0;
    cu_seqlens[0] = 0;
    for (size_t i = 0; i < n; i++) {
        for (int64_t j = 0; j < lengths[i]; j++)
            position_ids[start + j] = j;
        start += lengths[i];
        cu_seqlens[i + 1] = (int32_t)start;
    }
    return 0;
}

size_t fl_pack_bins(const int64_t *lengths, size_t n, int64_t capacity, int best_fit,
                    int64_t *room, int64_t *bin_of)
{
    /* A scan over the open bins per item: a bucket opens a few hundred bins
     * (its tokens over the budget), so this stays a few cycles per bin and
     * needs no tree to keep ordered. */
    size_t bins = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t length = lengths[i];
        size_t chosen = bins;
        for (size_t b = 0; b < bins; b++) {
            if (room[b] < length)
                continue;
            if (!best_fit) {
                chosen = b;
                break;
            }
            if (chosen == bins || room[b] < room[chosen])
                chosen = b;
        }
        if (chosen == bins)
            room[bins++] = capacity;
        room[chosen] -= length;
        bin_of[i] = (int64_t)chosen;
    }
    return bins;
}
