#include "xdit/runtime/model_info.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "xdit/io/diffusers.h"

namespace xdit {

namespace {

// value / base^k with one decimal, choosing k so the number shown stays below `base`.
std::string scaled(double value, double base, const char* const* units, int count, const char* space) {
  int k = 0;
  while (k + 1 < count && std::round(value * 10.0) / 10.0 >= base) {
    value /= base;
    ++k;
  }
  char text[64];
  std::snprintf(text, sizeof text, "%.1f%s%s", value, space, units[k]);
  return text;
}

}  // namespace

std::string human_count(int64_t n) {
  if (n < 1000) return std::to_string(n);
  static const char* const kUnits[] = {"", "K", "M", "B", "T"};
  return scaled(static_cast<double>(n), 1000.0, kUnits, 5, "");
}

std::string human_bytes(uint64_t n) {
  if (n < 1024) return std::to_string(n) + " B";
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  return scaled(static_cast<double>(n), 1024.0, kUnits, 5, " ");
}

void print_model_info(const std::string& folder, std::ostream& destination) {
  // Built in full first, so a bad component stops the command before anything is printed.
  std::ostringstream out;
  const DiffusersRepo repo = DiffusersRepo::open(folder);
  out << "pipeline: " << repo.pipeline_class();
  if (!repo.diffusers_version().empty()) out << " (diffusers " << repo.diffusers_version() << ")";
  out << "\nfolder: " << repo.folder() << "\n";

  int64_t total_params = 0;
  uint64_t total_bytes = 0;
  for (const ComponentSpec& c : repo.components()) {
    out << c.name << ": " << c.class_name << " (" << c.library << ")\n";
    const std::optional<std::string> file = repo.component_weights_file(c.name);
    if (!file) continue;  // tokenizers, schedulers
    const WeightStats stats = weight_stats(*repo.component_weights(c.name));
    out << "  weights: " << std::filesystem::path(*file).filename().string() << ", " << stats.tensors << " tensors\n";
    out << "  dtypes:";
    const char* sep = " ";
    for (const auto& [dtype, params] : stats.params_by_dtype) {
      out << sep << dtype_name(dtype) << ": " << human_count(params) << " params";
      sep = ", ";
    }
    out << "\n  params: " << human_count(stats.params) << "\n  memory: " << human_bytes(stats.bytes) << "\n";
    total_params += stats.params;
    total_bytes += stats.bytes;
  }
  out << "total: " << human_count(total_params) << " params, " << human_bytes(total_bytes) << "\n";
  destination << out.str();
}

}  // namespace xdit
