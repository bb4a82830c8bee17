// One threading policy: OpenMP, which honours OMP_NUM_THREADS (oneDNN shares the same runtime).
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace xdit {

inline int num_threads() { return omp_get_max_threads(); }
inline void set_num_threads(int n) { omp_set_num_threads(n); }

// Runs fn(begin, end) over [0, n) split into at most num_threads() contiguous ranges of at
// least `grain` items each; runs inline when one range is enough.
template <typename Fn>
void parallel_for(int64_t n, int64_t grain, Fn&& fn) {
  if (n <= 0) return;
  const int64_t max_tasks = std::min<int64_t>(num_threads(), grain > 0 ? (n + grain - 1) / grain : n);
  if (max_tasks <= 1 || omp_in_parallel()) {
    fn(int64_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(static_cast<int>(max_tasks))
  {
    const int64_t tasks = omp_get_num_threads();
    const int64_t t = omp_get_thread_num();
    fn(n * t / tasks, n * (t + 1) / tasks);
  }
}

}  // namespace xdit
