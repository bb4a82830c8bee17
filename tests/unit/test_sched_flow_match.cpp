#include <gtest/gtest.h>


#include "support/fixtures.h"
#include "support/reference.h"
#include "xdit/sched/flow_match.h"

namespace xdit::sched {
namespace {

using testing::ReferenceFile;

FlowMatchConfig fixture_config(const std::string& family) {
  return FlowMatchConfig::load((testing::fixture_model_dir(family) / "scheduler" / "scheduler_config.json").string());
}

// How each family's pipeline calls set_timesteps for a recorded case.
enum class Setup { Flux2, QwenImage, ZImage, Sd35 };

void check_family(const std::string& family, Setup setup) {
  const ReferenceFile ref = ReferenceFile::load(family);
  const FlowMatchConfig config = fixture_config(family);
  const nlohmann::json& cases = ref.sidecar().json().at("scheduler_cases");
  ASSERT_FALSE(cases.empty());
  for (const nlohmann::json& c : cases) {
    const std::string name = c.at("name");
    SCOPED_TRACE(family + " " + name);
    const int64_t steps = c.at("steps");
    const int64_t seq = c.value("image_seq_len", int64_t{0});
    FlowMatchEulerScheduler scheduler(config);
    switch (setup) {
      case Setup::Flux2: {
        const double mu = compute_empirical_mu(seq, steps);
        EXPECT_EQ(mu, c.at("mu").get<double>());
        scheduler.set_timesteps(steps, linspace_sigmas(steps), mu);
        break;
      }
      case Setup::QwenImage: {
        const double mu = calculate_shift(seq, config);
        EXPECT_EQ(mu, c.at("mu").get<double>());
        scheduler.set_timesteps(steps, linspace_sigmas(steps), mu);
        break;
      }
      case Setup::ZImage:
        scheduler.set_timesteps(steps, linspace_sigmas_f32(steps), calculate_shift(seq, config));
        break;
      case Setup::Sd35:
        scheduler.set_timesteps(steps);
        break;
    }
    const std::vector<double> sigmas(scheduler.sigmas().begin(), scheduler.sigmas().end());
    const std::vector<double> timesteps(scheduler.timesteps().begin(), scheduler.timesteps().end());
    const std::vector<double> want_sigmas = testing::values(ref.tensor(name + ".sigmas"));
    const std::vector<double> want_timesteps = testing::values(ref.tensor(name + ".timesteps"));
    ASSERT_EQ(sigmas.size(), want_sigmas.size());
    ASSERT_EQ(timesteps.size(), want_timesteps.size());
    const testing::Comparison s = testing::compare(sigmas, want_sigmas);
    const testing::Comparison t = testing::compare(timesteps, want_timesteps);
    // The rounding sequence follows diffusers step by step, so the results are bit-exact (the
    // required bound is 1e-6 on sigmas).
    EXPECT_EQ(s.max_abs, 0.0) << s.describe();
    EXPECT_EQ(t.max_abs, 0.0) << t.describe();
    EXPECT_EQ(sigmas.back(), 0.0);
  }
}

TEST(FlowMatchFixtures, Flux2Klein) { check_family("flux2-klein", Setup::Flux2); }
TEST(FlowMatchFixtures, Flux2Dev) { check_family("flux2-dev", Setup::Flux2); }
TEST(FlowMatchFixtures, QwenImage) { check_family("qwen-image", Setup::QwenImage); }
TEST(FlowMatchFixtures, ZImage) { check_family("z-image", Setup::ZImage); }
TEST(FlowMatchFixtures, Sd35) { check_family("sd35", Setup::Sd35); }

TEST(FlowMatchConfig, ReadsFixtureFields) {
  const FlowMatchConfig qwen = fixture_config("qwen-image");
  EXPECT_TRUE(qwen.use_dynamic_shifting);
  EXPECT_EQ(qwen.max_image_seq_len, 8192);
  ASSERT_TRUE(qwen.shift_terminal.has_value());
  EXPECT_DOUBLE_EQ(*qwen.shift_terminal, 0.02);
  const FlowMatchConfig sd35 = fixture_config("sd35");
  EXPECT_FALSE(sd35.use_dynamic_shifting);
  EXPECT_DOUBLE_EQ(sd35.shift, 3.0);
  EXPECT_FALSE(sd35.shift_terminal.has_value());
}

TEST(FlowMatchConfig, RejectsUnsupportedOptions) {
  testing::expect_error(
      [] { FlowMatchConfig::from_json(JsonConfig::parse(R"({"use_karras_sigmas": true})", "s.json")); },
      {"s.json", "use_karras_sigmas"});
  testing::expect_error([] { FlowMatchConfig::from_json(JsonConfig::parse(R"({"invert_sigmas": true})", "s.json")); },
                        {"s.json", "invert_sigmas"});
  testing::expect_error(
      [] { FlowMatchConfig::from_json(JsonConfig::parse(R"({"time_shift_type": "cosine"})", "s.json")); },
      {"s.json", "time_shift_type", "cosine"});
  testing::expect_error([] { FlowMatchConfig::from_json(JsonConfig::parse(R"({"shift": "3"})", "s.json")); },
                        {"s.json", "shift"});
}

TEST(FlowMatchScheduler, RejectsBadArguments) {
  FlowMatchConfig dynamic;
  dynamic.use_dynamic_shifting = true;
  FlowMatchEulerScheduler scheduler(dynamic);
  testing::expect_error([&] { scheduler.set_timesteps(0, std::nullopt, 1.0); }, {"steps must be positive"});
  testing::expect_error([&] { scheduler.set_timesteps(-3, std::nullopt, 1.0); }, {"steps must be positive"});
  testing::expect_error([&] { scheduler.set_timesteps(4); }, {"mu is required"});
  testing::expect_error([&] { scheduler.set_timesteps(4, std::vector<double>{1.0, 0.5}, 1.0); }, {"2 custom sigmas"});
  testing::expect_error([] { linspace_sigmas(0); }, {"steps must be positive"});
  scheduler.set_timesteps(2, std::nullopt, 1.0);
  const Tensor x = Tensor::zeros({2, 3}, DType::F32);
  testing::expect_error([&] { scheduler.step(x, x, 2); }, {"step index 2"});
  testing::expect_error([&] { scheduler.step(x, Tensor::zeros({3, 2}, DType::F32), 0); }, {"differ in shape"});
}

TEST(FlowMatchScheduler, MuFormulas) {
  // Above 4300 tokens FLUX.2's mu ignores the step count.
  EXPECT_DOUBLE_EQ(compute_empirical_mu(16384, 1), compute_empirical_mu(16384, 50));
  FlowMatchConfig config;
  EXPECT_DOUBLE_EQ(calculate_shift(config.base_image_seq_len, config), config.base_shift);
  EXPECT_NEAR(calculate_shift(config.max_image_seq_len, config), config.max_shift, 1e-15);
}

TEST(FlowMatchScheduler, StepMatchesFloat64Reference) {
  FlowMatchConfig config;
  config.shift = 3.0;
  FlowMatchEulerScheduler scheduler(config);
  scheduler.set_timesteps(4);
  const Shape shape = {2, 3, 5};
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    const Tensor v = testing::random_tensor(shape, dtype, 1);
    const Tensor x = testing::random_tensor(shape, DType::F32, 2);
    for (int64_t i = 0; i < scheduler.num_steps(); ++i) {
      const Tensor out = scheduler.step(v, x, i);
      EXPECT_EQ(out.dtype(), dtype);
      const double dt = static_cast<double>(scheduler.sigmas()[i + 1]) - scheduler.sigmas()[i];
      const std::vector<double> vv = testing::values(v), xv = testing::values(x);
      std::vector<double> expected(vv.size());
      for (size_t k = 0; k < vv.size(); ++k) expected[k] = xv[k] + dt * vv[k];
      EXPECT_MATCHES_REFERENCE(out, expected);
      if (dtype == DType::F32) {
        // diffusers' f32 sequence exactly: the product rounds to f32, then the sum does.
        const std::vector<double> got = testing::values(out);
        for (size_t k = 0; k < vv.size(); ++k) {
          volatile float product = static_cast<float>(dt) * static_cast<float>(vv[k]);  // no FMA
          ASSERT_EQ(got[k], static_cast<double>(static_cast<float>(xv[k]) + product)) << k;
        }
      }
    }
  }
}

}  // namespace
}  // namespace xdit::sched
