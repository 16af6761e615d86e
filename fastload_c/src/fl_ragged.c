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
