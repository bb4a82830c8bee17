#include "xdit/sched/flow_match.h"

#include <cmath>
#include <utility>

#include "xdit/core/error.h"
#include "xdit/ops/ops.h"

namespace xdit::sched {

FlowMatchConfig FlowMatchConfig::from_json(const JsonConfig& json) {
  FlowMatchConfig c;
  json.read_optional("num_train_timesteps", c.num_train_timesteps);
  json.read_optional("shift", c.shift);
  json.read_optional("use_dynamic_shifting", c.use_dynamic_shifting);
  json.read_optional("base_shift", c.base_shift);
  json.read_optional("max_shift", c.max_shift);
  json.read_optional("base_image_seq_len", c.base_image_seq_len);
  json.read_optional("max_image_seq_len", c.max_image_seq_len);
  json.read_optional("shift_terminal", c.shift_terminal);
  const std::string type = json.get_string("time_shift_type", "exponential");
  if (type == "exponential") {
    c.time_shift_type = TimeShiftType::Exponential;
  } else if (type == "linear") {
    c.time_shift_type = TimeShiftType::Linear;
  } else {
    json.fail_field("time_shift_type", concat_message("is ", quote(type), "; expected \"exponential\" or \"linear\""));
  }
  for (const char* field : {"use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas", "invert_sigmas",
                            "stochastic_sampling"}) {
    if (json.get_bool(field, false)) json.fail_field(field, "is true, which is not supported");
  }
  if (c.num_train_timesteps <= 0) json.fail_field("num_train_timesteps", "must be positive");
  // diffusers treats shift_terminal 0 as unset; 1 would divide by zero.
  if (c.shift_terminal == 0.0) c.shift_terminal.reset();
  if (c.shift_terminal && *c.shift_terminal >= 1.0) json.fail_field("shift_terminal", "must be below 1");
  return c;
}

FlowMatchConfig FlowMatchConfig::load(const std::string& path) { return from_json(JsonConfig::load(path)); }

namespace {

// a * b rounded on its own. diffusers rounds every product before the add that follows; the
// compiler could otherwise fuse the two into one FMA with a single rounding.
template <typename T>
T mul(T a, T b) {
  volatile T product = a * b;
  return product;
}

// np.linspace in f64: start + i * step, with the last value set to `stop` exactly.
std::vector<double> numpy_linspace(double start, double stop, int64_t n) {
  std::vector<double> out(static_cast<size_t>(n), start);
  if (n == 1) return out;
  const double step = (stop - start) / static_cast<double>(n - 1);
  for (int64_t i = 0; i < n; ++i) out[i] = mul(static_cast<double>(i), step) + start;
  out.back() = stop;
  return out;
}

// diffusers' static shift s' = shift·s / (1 + (shift - 1)·s), in T.
template <typename T>
T static_shift(T s, double shift) {
  return static_cast<T>(shift) * s / (T(1) + mul(static_cast<T>(shift - 1.0), s));
}

// set_timesteps' time shift (dynamic or static), then the stretch to shift_terminal, in T.
template <typename T>
void shift_sigmas(std::vector<T>& sigmas, const FlowMatchConfig& c, std::optional<double> mu) {
  if (c.use_dynamic_shifting) {
    const bool exponential = c.time_shift_type == TimeShiftType::Exponential;
    const T e = static_cast<T>(exponential ? std::exp(*mu) : *mu);
    for (T& v : sigmas) v = e / (e + (T(1) / v - T(1)));  // (1/t - 1) ** 1.0 is exact
  } else {
    for (T& v : sigmas) v = static_shift(v, c.shift);
  }
  if (c.shift_terminal) {
    const T scale = (T(1) - sigmas.back()) / static_cast<T>(1.0 - *c.shift_terminal);
    for (T& v : sigmas) v = T(1) - (T(1) - v) / scale;
  }
}

void check_steps(int64_t n) {
  XDIT_CHECK(n > 0, "flow-match scheduler: the number of steps must be positive, got ", n);
}

}  // namespace

double compute_empirical_mu(int64_t image_seq_len, int64_t num_steps) {
  const double a1 = 8.73809524e-05, b1 = 1.89833333;
  const double a2 = 0.00016927, b2 = 0.45666666;
  const double seq = static_cast<double>(image_seq_len);
  if (image_seq_len > 4300) return mul(a2, seq) + b2;
  const double m_200 = mul(a2, seq) + b2;
  const double m_10 = mul(a1, seq) + b1;
  const double a = (m_200 - m_10) / 190.0;
  const double b = m_200 - mul(200.0, a);
  return mul(a, static_cast<double>(num_steps)) + b;
}

double calculate_shift(int64_t image_seq_len, const FlowMatchConfig& config) {
  const double m = (config.max_shift - config.base_shift) /
                   static_cast<double>(config.max_image_seq_len - config.base_image_seq_len);
  const double b = config.base_shift - mul(m, static_cast<double>(config.base_image_seq_len));
  return mul(static_cast<double>(image_seq_len), m) + b;
}

std::vector<double> linspace_sigmas(int64_t n) {
  check_steps(n);
  return numpy_linspace(1.0, 1.0 / static_cast<double>(n), n);
}

std::vector<double> linspace_sigmas_f32(int64_t n) {
  check_steps(n);
  // torch.linspace in f32: the first half counts up from start, the second half down from end,
  // each value one fused multiply-add (as torch's vectorized CPU kernel computes it).
  const float start = 1.0f, end = static_cast<float>(1.0 / static_cast<double>(n));
  std::vector<double> out(static_cast<size_t>(n), start);
  if (n == 1) return out;
  const float step = (end - start) / static_cast<float>(n - 1);
  for (int64_t i = 0; i < n; ++i) {
    out[i] = i < n / 2 ? std::fma(step, static_cast<float>(i), start)
                       : std::fma(-step, static_cast<float>(n - 1 - i), end);
  }
  return out;
}

FlowMatchEulerScheduler::FlowMatchEulerScheduler(FlowMatchConfig config) : config_(std::move(config)) {
  // diffusers' __init__ builds the training sigmas t / T in torch f32 (statically shifted unless
  // shifting is dynamic); set_timesteps' default schedule runs between their ends.
  float lo = 1.0f / static_cast<float>(config_.num_train_timesteps);
  float hi = 1.0f;
  if (!config_.use_dynamic_shifting) {
    lo = static_shift(lo, config_.shift);
    hi = static_shift(hi, config_.shift);
  }
  sigma_min_ = lo;
  sigma_max_ = hi;
}

void FlowMatchEulerScheduler::set_timesteps(int64_t num_steps, const std::optional<std::vector<double>>& sigmas,
                                            std::optional<double> mu) {
  check_steps(num_steps);
  XDIT_CHECK(!sigmas || static_cast<int64_t>(sigmas->size()) == num_steps, "flow-match scheduler: ",
             sigmas ? sigmas->size() : 0, " custom sigmas given for ", num_steps, " steps");
  XDIT_CHECK(!config_.use_dynamic_shifting || mu, "flow-match scheduler: mu is required with use_dynamic_shifting");
  const size_t n = static_cast<size_t>(num_steps);
  const double T = static_cast<double>(config_.num_train_timesteps);
  std::vector<float> out(n);

  if (sigmas) {
    // Custom sigmas become an f32 numpy array; Python scalars are weak under NumPy 2 promotion,
    // so every operation rounds to f32.
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>((*sigmas)[i]);
    shift_sigmas(out, config_, mu);
  } else {
    // The default schedule is numpy f64 throughout, then converted to f32.
    std::vector<double> s = numpy_linspace(static_cast<double>(sigma_max_) * T, static_cast<double>(sigma_min_) * T,
                                           num_steps);
    for (double& v : s) v /= T;
    shift_sigmas(s, config_, mu);
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(s[i]);
  }

  timesteps_.resize(n);
  for (size_t i = 0; i < n; ++i) timesteps_[i] = out[i] * static_cast<float>(T);
  sigmas_ = std::move(out);
  sigmas_.push_back(0.0f);
}

Tensor FlowMatchEulerScheduler::step(const Tensor& model_output, const Tensor& sample, int64_t step_index) const {
  XDIT_CHECK(step_index >= 0 && step_index < num_steps(), "flow-match step: step index ", step_index,
             " is outside the ", num_steps(), " steps set by set_timesteps");
  XDIT_CHECK(model_output.shape() == sample.shape(), "flow-match step: model output ", shape_str(model_output.shape()),
             " and sample ", shape_str(sample.shape()), " differ in shape");
  const float dt = sigmas_[step_index + 1] - sigmas_[step_index];
  // torch multiplies by the f32 scalar dt in model_output's dtype, then adds in f32.
  const Tensor update = ops::scale(model_output, dt).to(DType::F32);
  return ops::add(sample.to(DType::F32), update).to(model_output.dtype());
}

}  // namespace xdit::sched
