/* Keeping the k largest values seen, with their indices, in descending
 * order: insert (value, index) into a list of *count (< k) entries, or in
 * place of its smallest where the value beats it. An equal value goes after
 * the ones already there (the earlier index first). Shared by the kernels
 * that choose top-k (kernels/__init__.py hashes it into their builds). */
#include <stdint.h>

static inline void sorted_insert(float *vals, int64_t *idx, int64_t *count, int64_t k, float value,
                                 int64_t index) {
    int64_t at = *count < k ? *count : k - 1;
    while (at > 0 && vals[at - 1] < value) {
        vals[at] = vals[at - 1];
        idx[at] = idx[at - 1];
        --at;
    }
    vals[at] = value;
    idx[at] = index;
    if (*count < k) ++*count;
}
