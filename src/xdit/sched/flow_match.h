// FlowMatchEulerDiscreteScheduler (diffusers) for the flow-matching families: FLUX.2, Z-Image,
// SD3.5 and Qwen-Image. Sigmas and timesteps follow diffusers' rounding sequence (numpy f64 or
// f32, then torch f32) so they equal diffusers' bit for bit.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "xdit/core/tensor.h"
#include "xdit/io/json_config.h"

namespace xdit::sched {

enum class TimeShiftType { Exponential, Linear };

// scheduler/scheduler_config.json. Members carry diffusers' defaults. Options no family uses
// (karras/exponential/beta sigmas, invert_sigmas, stochastic_sampling) are rejected when set.
struct FlowMatchConfig {
  int64_t num_train_timesteps = 1000;
  double shift = 1.0;
  bool use_dynamic_shifting = false;
  double base_shift = 0.5;
  double max_shift = 1.15;
  int64_t base_image_seq_len = 256;
  int64_t max_image_seq_len = 4096;
  std::optional<double> shift_terminal;
  TimeShiftType time_shift_type = TimeShiftType::Exponential;

  static FlowMatchConfig from_json(const JsonConfig& json);
  static FlowMatchConfig load(const std::string& path);
};

// FLUX.2's mu: linear in the sequence length, interpolated between fits at 10 and 200 steps
// (only the 200-step fit above 4300 tokens).
double compute_empirical_mu(int64_t image_seq_len, int64_t num_steps);
// FLUX.1/SD3/Qwen-Image/Z-Image's mu: linear between (base_image_seq_len, base_shift) and
// (max_image_seq_len, max_shift).
double calculate_shift(int64_t image_seq_len, const FlowMatchConfig& config);

// The custom sigmas FLUX.2 and Qwen-Image pass: np.linspace(1, 1/n, n) in f64.
std::vector<double> linspace_sigmas(int64_t n);
// The custom sigmas Z-Image passes: torch.linspace(1, 1/n, n) in f32.
std::vector<double> linspace_sigmas_f32(int64_t n);

class FlowMatchEulerScheduler {
 public:
  explicit FlowMatchEulerScheduler(FlowMatchConfig config);

  const FlowMatchConfig& config() const { return config_; }

  // `sigmas`, when given, must hold num_steps values; `mu` is required with dynamic shifting.
  void set_timesteps(int64_t num_steps, const std::optional<std::vector<double>>& sigmas = std::nullopt,
                     std::optional<double> mu = std::nullopt);

  const std::vector<float>& sigmas() const { return sigmas_; }        // num_steps + 1, ends in 0
  const std::vector<float>& timesteps() const { return timesteps_; }  // num_steps
  int64_t num_steps() const { return static_cast<int64_t>(timesteps_.size()); }

  // One Euler step: sample + (sigma[i+1] - sigma[i]) * model_output, computed in f32 and
  // returned in model_output's dtype, as diffusers does. F32 or BF16 inputs of equal shape.
  Tensor step(const Tensor& model_output, const Tensor& sample, int64_t step_index) const;

 private:
  FlowMatchConfig config_;
  float sigma_min_;  // the training schedule's ends, as set_timesteps' default linspace uses them
  float sigma_max_;
  std::vector<float> sigmas_;
  std::vector<float> timesteps_;
};

}  // namespace xdit::sched
