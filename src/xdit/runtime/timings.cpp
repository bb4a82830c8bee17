#include "xdit/runtime/timings.h"

#include <sys/resource.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "xdit/core/error.h"
#include "xdit/io/atomic_file.h"

namespace xdit {

int64_t peak_rss_bytes() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports kilobytes
}

double median(std::vector<double> values) {
  XDIT_CHECK(!values.empty(), "median of an empty list");
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

void write_timings_json(const std::string& folder, int warmup_calls, const CallTimings& first_call,
                        const std::vector<CallTimings>& timed_calls) {
  XDIT_CHECK(!timed_calls.empty(), "write_timings_json: no timed calls");
  nlohmann::ordered_json iterations = nlohmann::ordered_json::array();
  std::vector<double> load, text, denoise, steps, vae, total;
  for (const CallTimings& call : timed_calls) {
    iterations.push_back({{"load_s", call.load_s},
                          {"text_encode_s", call.text_encode_s},
                          {"denoise_s", call.denoise_s},
                          {"step_s", call.step_s},
                          {"vae_decode_s", call.vae_decode_s},
                          {"total_s", call.total_s},
                          {"peak_rss_bytes_after",
                           {{"text_encode", call.peak_rss_after_text_encode},
                            {"denoise", call.peak_rss_after_denoise},
                            {"vae_decode", call.peak_rss_after_vae_decode}}}});
    load.push_back(call.load_s);
    text.push_back(call.text_encode_s);
    denoise.push_back(call.denoise_s);
    steps.insert(steps.end(), call.step_s.begin(), call.step_s.end());
    vae.push_back(call.vae_decode_s);
    total.push_back(call.total_s);
  }
  nlohmann::ordered_json medians = {{"load_s", median(load)},
                                    {"text_encode_s", median(text)},
                                    {"denoise_s", median(denoise)},
                                    {"step_s", steps.empty() ? 0.0 : median(steps)},
                                    {"vae_decode_s", median(vae)},
                                    {"total_s", median(total)}};
  const nlohmann::ordered_json out = {{"warmup_calls", warmup_calls},
                                      {"time_to_first_image_s", first_call.total_s},
                                      {"load_s", first_call.load_s},
                                      {"iterations", iterations},
                                      {"median", medians},
                                      {"peak_rss_bytes", peak_rss_bytes()}};
  write_file_atomically((std::filesystem::path(folder) / "timings.json").string(), out.dump(2) + "\n");
}

}  // namespace xdit
