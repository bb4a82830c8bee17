#include "xdit/runtime/progress.h"

#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <sstream>

namespace xdit {

Progress::Progress(bool quiet) : quiet_(quiet), terminal_(::isatty(STDERR_FILENO) == 1) {}

void Progress::stage(const std::string& name) {
  stage_ = name;
  stage_start_ = Clock::now();
  if (quiet_) return;
  if (bar_open_) std::cerr << '\n';
  bar_open_ = false;
  std::cerr << "xdit: " << name << std::endl;
}

void Progress::step(int64_t done, int64_t total) {
  if (quiet_ || total <= 0) return;
  const double elapsed = std::chrono::duration<double>(Clock::now() - stage_start_).count();
  const double per_step = elapsed / static_cast<double>(done);
  const double eta = per_step * static_cast<double>(total - done);
  char timing[96];
  std::snprintf(timing, sizeof timing, "%.2f it/s, %.2f s/it, ETA %.1f s", per_step > 0 ? 1.0 / per_step : 0.0,
                per_step, eta);
  std::ostringstream line;
  if (terminal_) {
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * done / total);
    line << '\r' << stage_ << " [" << std::string(static_cast<size_t>(filled), '#')
         << std::string(static_cast<size_t>(kWidth - filled), ' ') << "] " << done << '/' << total << ' ' << timing;
    std::cerr << line.str() << std::flush;
    bar_open_ = done < total;
    if (!bar_open_) std::cerr << '\n';
  } else {
    line << "xdit: " << stage_ << " step " << done << '/' << total << " (" << timing << ')';
    std::cerr << line.str() << std::endl;
  }
}

void Progress::message(const std::string& line) {
  if (quiet_) return;
  if (bar_open_) std::cerr << '\n';
  bar_open_ = false;
  std::cerr << "xdit: " << line << std::endl;
}

void Progress::warning(const std::string& line) {
  if (bar_open_) std::cerr << '\n';
  bar_open_ = false;
  std::cerr << "xdit: warning: " << line << std::endl;
}

}  // namespace xdit
