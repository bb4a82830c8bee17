// Per-stage wall times of pipeline calls, and timings.json for benchmark mode
// (--num_iterations N --warmup_calls W), which records each timed call and the medians.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace xdit {

struct CallTimings {
  double load_s = 0;          // reading and converting weights (every component)
  double text_encode_s = 0;   // tokenizing and running the text encoder
  double denoise_s = 0;       // the whole denoising loop
  std::vector<double> step_s; // each denoising step
  double vae_decode_s = 0;
  double total_s = 0;         // the whole call, load included
  // The process's peak resident bytes so far, read at the end of each stage: where it rises
  // tells which stage sets the peak.
  int64_t peak_rss_after_text_encode = 0;
  int64_t peak_rss_after_denoise = 0;
  int64_t peak_rss_after_vae_decode = 0;
};

class StopWatch {
 public:
  StopWatch() : start_(std::chrono::steady_clock::now()) {}
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }

 private:
  std::chrono::steady_clock::time_point start_;
};

// The process's peak resident set so far (getrusage), in bytes.
int64_t peak_rss_bytes();

double median(std::vector<double> values);  // of a non-empty list

// Writes <folder>/timings.json atomically: {"warmup_calls", "time_to_first_image_s" and "load_s"
// (of the first call, warm-up or timed), "iterations": [...], "median": {...}, "peak_rss_bytes"}.
void write_timings_json(const std::string& folder, int warmup_calls, const CallTimings& first_call,
                        const std::vector<CallTimings>& timed_calls);

}  // namespace xdit
