#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <string>
#include <vector>

#include "xdit/core/threading.h"

namespace xdit {
namespace {

TEST(Threading, ParallelForCoversEachIndexExactlyOnce) {
  for (int64_t n : {0, 1, 7, 1000, 100003}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    parallel_for(n, 16, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) hits[static_cast<size_t>(i)]++;
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "n=" << n << " i=" << i;
  }
}

TEST(Threading, SmallRangesRunInline) {
  int calls = 0;
  parallel_for(10, 100, [&](int64_t begin, int64_t end) {
    ++calls;
    EXPECT_EQ(begin, 0);
    EXPECT_EQ(end, 10);
  });
  EXPECT_EQ(calls, 1);
}

TEST(Threading, HonoursOmpNumThreads) {
  // A child process sees the variable at OpenMP start-up, as a user's run would.
  const std::string self = XDIT_BINARY_DIR "/bin/test_threading";
  FILE* pipe = popen(("OMP_NUM_THREADS=3 " + self + " --gtest_filter=Threading.PrintThreadCount 2>&1").c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[256];
  while (fgets(buffer, sizeof buffer, pipe)) output += buffer;
  pclose(pipe);
  EXPECT_NE(output.find("threads=3"), std::string::npos) << output;
}

TEST(Threading, PrintThreadCount) { std::printf("threads=%d\n", num_threads()); }

}  // namespace
}  // namespace xdit
