// Progress on stderr: a redrawn bar when stderr is a terminal, plain lines otherwise (logs, CI),
// nothing with --quiet. Pipelines report stages and denoising steps; they never print directly.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace xdit {

class Progress {
 public:
  explicit Progress(bool quiet);

  void stage(const std::string& name);  // "text encoder", "transformer", "vae decode", ...
  // Call after step `done` of `total` finished (done counts from 1).
  void step(int64_t done, int64_t total);
  void message(const std::string& line);  // a one-line note, silenced by --quiet
  void warning(const std::string& line);  // printed even with --quiet

 private:
  using Clock = std::chrono::steady_clock;
  bool quiet_;
  bool terminal_;
  std::string stage_;
  Clock::time_point stage_start_;
  bool bar_open_ = false;
};

}  // namespace xdit
