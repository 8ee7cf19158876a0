/* Rows of a kernel split over the calling thread's OpenMP threads: torch's
 * intra-op setting (torch.set_num_threads), in torch's own OpenMP runtime
 * (the same libgomp.so.1, loaded first), so the process keeps one thread
 * pool. Built without OpenMP, every call runs on one thread. */
#ifndef PARALLEL_ROWS_H
#define PARALLEL_ROWS_H

#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* below this many multiply-adds a call runs on one thread: waking the pool
 * costs more than it saves */
#define MIN_PARALLEL_WORK 65536.0

/* The threads to split `rows` rows of `work_per_row` multiply-adds each
 * over: each thread at least `min_rows` rows. 1 in a worker process forked
 * from a decoding one (one thread there: GNU OpenMP's pool does not survive
 * a fork, and a region with one thread never touches it). */
static inline int row_threads(int64_t rows, int64_t min_rows, double work_per_row) {
#ifdef _OPENMP
    if ((double)rows * work_per_row < MIN_PARALLEL_WORK || omp_in_parallel()) return 1;
    const int64_t threads = omp_get_max_threads(), most = rows / min_rows;
    return (int)(threads < most ? threads : (most < 1 ? 1 : most));
#else
    (void)rows; (void)min_rows; (void)work_per_row;
    return 1;
#endif
}

/* Thread `t` of `n`'s share of `rows`: [*begin, *end). */
static inline void row_share(int64_t rows, int t, int n, int64_t *begin, int64_t *end) {
    *begin = rows * t / n;
    *end = rows * (t + 1) / n;
}

#endif
