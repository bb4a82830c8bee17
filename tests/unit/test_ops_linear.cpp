// matmul, linear (bf16/f32 and fp8 weights) and fp8 quantization against float64 references.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "support/reference.h"
#include "xdit/backend/cpu/gemm_fp8.h"
#include "xdit/backend/cpu/gemm_packed.h"
#include "xdit/ops/ops.h"

namespace xdit {
namespace {

using testing::expect_error;
using testing::padded_rows;
using testing::random_tensor;
using testing::transposed_storage;

Shape leading(const Tensor& x, int64_t drop) { return Shape(x.shape().begin(), x.shape().end() - drop); }

// Row-major flat index into `shape` of the multi-index `index` of a (right-aligned) broadcast
// shape: dims of size 1 in `shape` take index 0.
int64_t broadcast_index(const Shape& shape, const Shape& full, int64_t flat) {
  std::vector<int64_t> index(full.size());
  for (size_t d = full.size(); d-- > 0;) {
    index[d] = flat % full[d];
    flat /= full[d];
  }
  int64_t result = 0;
  const size_t lead = full.size() - shape.size();
  for (size_t d = 0; d < shape.size(); ++d) result = result * shape[d] + (shape[d] == 1 ? 0 : index[lead + d]);
  return result;
}

// [..., M, K] x [..., K, N] with numpy broadcasting of the batch dims, in float64.
std::vector<double> reference_matmul(const Tensor& a, const Tensor& b) {
  const std::vector<double> av = a.to_doubles(), bv = b.to_doubles();
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  const Shape a_batch = leading(a, 2), b_batch = leading(b, 2);
  const Shape batch = broadcast_shapes(a_batch, b_batch);
  const int64_t batches = shape_numel(batch);
  std::vector<double> out(static_cast<size_t>(batches * m * n), 0.0);
  for (int64_t t = 0; t < batches; ++t) {
    const double* ap = av.data() + broadcast_index(a_batch, batch, t) * m * k;
    const double* bp = bv.data() + broadcast_index(b_batch, batch, t) * k * n;
    double* op = out.data() + t * m * n;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0;
        for (int64_t p = 0; p < k; ++p) sum += ap[i * k + p] * bp[p * n + j];
        op[i * n + j] = sum;
      }
  }
  return out;
}

// x [..., K] · W^T + bias with W given as float64 values [N, K].
std::vector<double> reference_linear(const Tensor& x, const std::vector<double>& w, int64_t n,
                                     const std::vector<double>& bias) {
  const std::vector<double> xv = x.to_doubles();
  const int64_t k = x.size(-1), rows = shape_numel(leading(x, 1));
  std::vector<double> out(static_cast<size_t>(rows * n));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) {
      double sum = bias.empty() ? 0.0 : bias[j];
      for (int64_t p = 0; p < k; ++p) sum += xv[r * k + p] * w[j * k + p];
      out[r * n + j] = sum;
    }
  return out;
}

class LinearAlgebra : public ::testing::TestWithParam<DType> {};

// ---- matmul

struct MatmulCase {
  Shape a, b;
};

TEST_P(LinearAlgebra, MatmulShapesAndBroadcasts) {
  const DType dtype = GetParam();
  const std::vector<MatmulCase> cases = {
      {{17, 33}, {33, 65}},              // odd sizes
      {{1, 64}, {64, 31}},               // M = 1
      {{29, 1}, {1, 40}},                // K = 1
      {{7, 19}, {19, 1}},                // N = 1
      {{3, 9, 16}, {3, 16, 5}},          // batched
      {{2, 3, 9, 16}, {3, 16, 5}},       // b broadcast over a leading batch dim
      {{4, 1, 6, 10}, {1, 5, 10, 7}},    // both sides broadcast
      {{1, 12, 20}, {3, 20, 11}},        // a broadcast
      {{130, 127}, {127, 67}},           // past a vector width, not a multiple of it
      {{300, 40}, {40, 50}},             // enough rows that b is repacked before the call
      {{2, 150, 40}, {40, 50}},          // the same with a batch sharing b
  };
  uint64_t seed = 1;
  for (const MatmulCase& c : cases) {
    const Tensor a = random_tensor(c.a, dtype, seed++);
    const Tensor b = random_tensor(c.b, dtype, seed++);
    const Tensor out = ops::matmul(a, b);
    Shape expected_shape = broadcast_shapes(leading(a, 2), leading(b, 2));
    expected_shape.insert(expected_shape.end(), {a.size(-2), b.size(-1)});
    EXPECT_EQ(out.shape(), expected_shape) << shape_str(c.a) << " x " << shape_str(c.b);
    EXPECT_EQ(out.dtype(), dtype);
    EXPECT_MATCHES_REFERENCE(out, reference_matmul(a, b)) << shape_str(c.a) << " x " << shape_str(c.b);
  }
}

TEST_P(LinearAlgebra, MatmulStridedOperands) {
  const DType dtype = GetParam();
  // a^T of a contiguous [B, K, M] tensor: the operand oneDNN reads transposed without a copy.
  const Tensor a_t = random_tensor({3, 33, 17}, dtype, 11).transpose(-1, -2);
  const Tensor b = random_tensor({3, 33, 21}, dtype, 12);
  EXPECT_MATCHES_REFERENCE(ops::matmul(a_t, b), reference_matmul(a_t, b));
  const Tensor b_t = random_tensor({3, 21, 33}, dtype, 13).transpose(-1, -2);
  EXPECT_MATCHES_REFERENCE(ops::matmul(a_t, b_t), reference_matmul(a_t, b_t));

  // Rows not adjacent, and fully reversed storage order.
  const Tensor a = random_tensor({2, 19, 45}, dtype, 14);
  const Tensor b2 = random_tensor({2, 45, 23}, dtype, 15);
  EXPECT_MATCHES_REFERENCE(ops::matmul(padded_rows(a), padded_rows(b2)), reference_matmul(a, b2));
  EXPECT_MATCHES_REFERENCE(ops::matmul(transposed_storage(a), transposed_storage(b2)), reference_matmul(a, b2));

  // No unit-stride dim at all: every other column of a wider matrix.
  const Tensor wide = random_tensor({19, 90}, dtype, 16);
  const Tensor every_other = wide.slice(1, 0, 90, 2);
  const Tensor b3 = random_tensor({45, 8}, dtype, 17);
  EXPECT_MATCHES_REFERENCE(ops::matmul(every_other, b3), reference_matmul(every_other, b3));

  // Batch dims permuted (attention-style [B, H, S, D] view of [B, S, H, D]) and expanded.
  const Tensor q = random_tensor({2, 13, 3, 16}, dtype, 18).permute({0, 2, 1, 3});
  const Tensor k_t = random_tensor({2, 11, 3, 16}, dtype, 19).permute({0, 2, 3, 1});
  EXPECT_MATCHES_REFERENCE(ops::matmul(q, k_t), reference_matmul(q, k_t));
  const Tensor shared = random_tensor({1, 16, 9}, dtype, 20).expand({4, 16, 9});
  const Tensor many = random_tensor({4, 7, 16}, dtype, 21);
  EXPECT_MATCHES_REFERENCE(ops::matmul(many, shared), reference_matmul(many, shared));
}

TEST_P(LinearAlgebra, MatmulRepeatedCallsReuseAndStayCorrect) {
  const DType dtype = GetParam();
  for (uint64_t seed = 30; seed < 33; ++seed) {
    const Tensor a = random_tensor({24, 40}, dtype, seed);
    const Tensor b = random_tensor({40, 36}, dtype, seed + 100);
    EXPECT_MATCHES_REFERENCE(ops::matmul(a, b), reference_matmul(a, b));
  }
}

TEST_P(LinearAlgebra, MatmulEmptyDims) {
  const DType dtype = GetParam();
  // Empty operands come from Tensor::empty: random_tensor of no elements trips a core UB check
  // (memcpy from a null pointer) under the sanitizer build.
  const Tensor zero_k = ops::matmul(Tensor::empty({5, 0}, dtype), Tensor::empty({0, 4}, dtype));
  EXPECT_EQ(zero_k.shape(), (Shape{5, 4}));
  EXPECT_EQ(zero_k.to_doubles(), std::vector<double>(20, 0.0));
  EXPECT_EQ(ops::matmul(Tensor::empty({0, 3}, dtype), random_tensor({3, 4}, dtype, 4)).shape(), (Shape{0, 4}));
}

// ---- linear

TEST_P(LinearAlgebra, LinearWithAndWithoutBias) {
  const DType dtype = GetParam();
  struct Case {
    Shape x;
    int64_t n;
  };
  const std::vector<Case> cases = {{{17, 33}, 65}, {{2, 9, 40}, 24}, {{2, 3, 5, 31}, 7}, {{1, 128}, 96}, {{37}, 5}};
  uint64_t seed = 40;
  for (const Case& c : cases) {
    const int64_t k = c.x.back();
    const Tensor x = random_tensor(c.x, dtype, seed++);
    const Tensor w = random_tensor({c.n, k}, dtype, seed++);
    Shape out_shape = leading(x, 1);
    out_shape.push_back(c.n);

    const Tensor plain = ops::linear(x, w);
    EXPECT_EQ(plain.shape(), out_shape);
    EXPECT_MATCHES_REFERENCE(plain, reference_linear(x, w.to_doubles(), c.n, {})) << shape_str(c.x);

    for (DType bias_dtype : {dtype, DType::F32}) {
      const Tensor bias = random_tensor({c.n}, bias_dtype, seed++);
      EXPECT_MATCHES_REFERENCE(ops::linear(x, w, bias), reference_linear(x, w.to_doubles(), c.n, bias.to_doubles()))
          << shape_str(c.x) << " bias " << dtype_name(bias_dtype);
    }
  }
}

TEST_P(LinearAlgebra, LinearStridedInputsAndWeights) {
  const DType dtype = GetParam();
  const Tensor x = random_tensor({3, 11, 29}, dtype, 50);
  const Tensor w = random_tensor({19, 29}, dtype, 51);
  const Tensor bias = random_tensor({19}, dtype, 52);
  const std::vector<double> expected = reference_linear(x, w.to_doubles(), 19, bias.to_doubles());
  // Padded rows merge into one row dim; reversed storage and the [S, B] transpose do not.
  EXPECT_MATCHES_REFERENCE(ops::linear(padded_rows(x), w, bias), expected);
  EXPECT_MATCHES_REFERENCE(ops::linear(transposed_storage(x), w, bias), expected);
  const Tensor x_sb = random_tensor({11, 3, 29}, dtype, 53);
  const Tensor x_bs = x_sb.transpose(0, 1);
  EXPECT_MATCHES_REFERENCE(ops::linear(x_bs, w, bias), reference_linear(x_bs, w.to_doubles(), 19, bias.to_doubles()));
  // One row broadcast to many (stride 0), e.g. a conditioning vector expanded over tokens.
  const Tensor repeated = random_tensor({1, 29}, dtype, 56).expand({7, 29});
  EXPECT_MATCHES_REFERENCE(ops::linear(repeated, w, bias),
                           reference_linear(repeated, w.to_doubles(), 19, bias.to_doubles()));
  // Weights as views: padded rows, column-major storage, a row slice of a fused weight, a strided bias.
  EXPECT_MATCHES_REFERENCE(ops::linear(x, padded_rows(w), bias), expected);
  EXPECT_MATCHES_REFERENCE(ops::linear(x, transposed_storage(w), bias), expected);
  const Tensor fused = random_tensor({57, 29}, dtype, 54);
  const Tensor part = fused.narrow(0, 19, 19);
  const Tensor bias_pairs = random_tensor({19, 2}, dtype, 55).select(1, 1);
  EXPECT_MATCHES_REFERENCE(ops::linear(x, part, bias_pairs),
                           reference_linear(x, part.to_doubles(), 19, bias_pairs.to_doubles()));
}

TEST_P(LinearAlgebra, LinearAtATransformerWidth) {
  const DType dtype = GetParam();
  const Tensor x = random_tensor({2, 140, 384}, dtype, 60);
  const Tensor w = random_tensor({320, 384}, dtype, 61, -0.05f, 0.05f);
  const Tensor bias = random_tensor({320}, DType::F32, 62);
  const std::vector<double> expected = reference_linear(x, w.to_doubles(), 320, bias.to_doubles());
  EXPECT_MATCHES_REFERENCE(ops::linear(x, w, bias), expected);
  // A column-major weight is a row-major [K, N] operand: repacked before the call, bias fused.
  EXPECT_MATCHES_REFERENCE(ops::linear(x, transposed_storage(w), bias), expected);
}

TEST_P(LinearAlgebra, LinearWithZeroK) {
  const DType dtype = GetParam();
  const Tensor bias = random_tensor({6}, DType::F32, 63);
  const Tensor x = Tensor::empty({4, 0}, dtype);
  const Tensor out = ops::linear(x, Tensor::empty({6, 0}, dtype), bias);
  EXPECT_MATCHES_REFERENCE(out, reference_linear(x, {}, 6, bias.to_doubles()));
}

// ---- fp8

// The real weight: fp8 values (decoded by the reference converters) times the row scale.
std::vector<double> dequantized(const Tensor& codes, const Tensor& scale) {
  std::vector<double> w = codes.to_doubles();
  const std::vector<double> s = scale.to_doubles();
  const int64_t k = codes.size(1);
  for (size_t i = 0; i < w.size(); ++i) w[i] *= s[i / static_cast<size_t>(k)];
  return w;
}

TEST_P(LinearAlgebra, Fp8LinearMatchesDequantizedWeights) {
  const DType dtype = GetParam();
  // K is large enough that the panel holds fewer rows than N, so N = 300 spans several blocks
  // and ends in a partial one for both panel dtypes.
  const int64_t k = 4113, n = 300;
  for (DType fp8 : {DType::F8E4M3, DType::F8E5M2}) {
    const Tensor w = random_tensor({n, k}, DType::F32, 70, -0.2f, 0.2f);
    const ops::Fp8Weight q = ops::quantize_fp8_per_channel(w, fp8);
    ASSERT_EQ(q.data.dtype(), fp8);
    const std::vector<double> w_real = dequantized(q.data, q.scale);
    const Tensor x = random_tensor({2, 3, k}, dtype, 71);
    const Tensor bias = random_tensor({n}, dtype, 72);
    EXPECT_MATCHES_REFERENCE(ops::linear(x, q.data, {}, q.scale), reference_linear(x, w_real, n, {}))
        << dtype_name(fp8);
    EXPECT_MATCHES_REFERENCE(ops::linear(x, q.data, bias, q.scale),
                             reference_linear(x, w_real, n, bias.to_doubles()))
        << dtype_name(fp8);
    EXPECT_MATCHES_REFERENCE(ops::linear(transposed_storage(x), q.data, bias, q.scale),
                             reference_linear(x, w_real, n, bias.to_doubles()))
        << dtype_name(fp8) << " strided x";
  }
}

// Many rows and a short K: one weight panel, x split into several row tiles (the last partial).
TEST_P(LinearAlgebra, Fp8LinearManyRows) {
  const DType dtype = GetParam();
  const int64_t k = 64, n = 300;
  const Tensor w = random_tensor({n, k}, DType::F32, 77);
  const ops::Fp8Weight q = ops::quantize_fp8_per_channel(w, DType::F8E4M3);
  const std::vector<double> w_real = dequantized(q.data, q.scale);
  const Tensor bias = random_tensor({n}, DType::F32, 78);
  const Tensor x = random_tensor({3, 1001, k}, dtype, 79);
  EXPECT_MATCHES_REFERENCE(ops::linear(x, q.data, bias, q.scale), reference_linear(x, w_real, n, bias.to_doubles()));
}

TEST_P(LinearAlgebra, Fp8LinearSmallAndOddShapes) {
  const DType dtype = GetParam();
  for (DType fp8 : {DType::F8E4M3, DType::F8E5M2}) {
    const Tensor w = random_tensor({37, 21}, DType::F32, 73, -3.0f, 3.0f);
    const ops::Fp8Weight q = ops::quantize_fp8_per_channel(w, fp8);
    const Tensor x = random_tensor({5, 21}, dtype, 74);
    const Tensor bias = random_tensor({37}, DType::F32, 75);
    EXPECT_MATCHES_REFERENCE(ops::linear(padded_rows(x), q.data, bias, q.scale),
                             reference_linear(x, dequantized(q.data, q.scale), 37, bias.to_doubles()));
    const Tensor one = random_tensor({21}, dtype, 76);
    EXPECT_MATCHES_REFERENCE(ops::linear(one, q.data, {}, q.scale),
                             reference_linear(one, dequantized(q.data, q.scale), 37, {}));
    // Codes in column-major storage and every other element of a wider scale buffer.
    const Tensor scale_pairs = Tensor::zeros({37, 2}, DType::F32);
    Tensor strided_scale = scale_pairs.select(1, 1);
    strided_scale.copy_from(q.scale);
    EXPECT_MATCHES_REFERENCE(ops::linear(x, transposed_storage(q.data), bias, strided_scale),
                             reference_linear(x, dequantized(q.data, q.scale), 37, bias.to_doubles()));
  }
}

// Prepacked weights: any row count (not only the one the layout was chosen for), 3-D and
// strided x, bias in either dtype, and a weight that is itself a view.
TEST_P(LinearAlgebra, PackedLinearMatchesReference) {
  const DType dtype = GetParam();
  const Tensor fused = random_tensor({150, 96}, dtype, 90);
  const Tensor w = fused.narrow(0, 20, 130);
  const cpu::PackedLinearWeight packed = cpu::pack_linear_weight(w, 64);
  const std::vector<double> wv = w.to_doubles();
  for (const Shape& shape : {Shape{64, 96}, Shape{1, 96}, Shape{3, 17, 96}, Shape{96}}) {
    const Tensor x = random_tensor(shape, dtype, 91);
    EXPECT_MATCHES_REFERENCE(cpu::linear_packed(x, packed, {}), reference_linear(x, wv, 130, {})) << shape_str(shape);
    const Tensor bias = random_tensor({130}, DType::F32, 92);
    EXPECT_MATCHES_REFERENCE(cpu::linear_packed(transposed_storage(x), packed, bias),
                             reference_linear(x, wv, 130, bias.to_doubles()))
        << shape_str(shape);
  }
  expect_error([&] { cpu::linear_packed(random_tensor({4, 95}, dtype, 93), packed, {}); },
               {"linear_packed", "K = 96"});
  expect_error([&] { cpu::pack_linear_weight(random_tensor({4, 8}, dtype, 94), 0); },
               {"pack_linear_weight", "typical_m"});
}

// Several threads using the same cached primitives at once, each with its own stream and
// scratchpad, and calls from inside an OpenMP parallel region (oneDNN then runs on one thread).
TEST_P(LinearAlgebra, ConcurrentCallsAgree) {
  const DType dtype = GetParam();
  const Tensor w = random_tensor({48, 64}, dtype, 95);
  const Tensor bias = random_tensor({48}, DType::F32, 96);
  std::vector<Tensor> inputs, outputs(6);
  for (uint64_t i = 0; i < outputs.size(); ++i) inputs.push_back(random_tensor({33, 64}, dtype, 100 + i));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < 3; ++i) threads.emplace_back([&, i] { outputs[i] = ops::linear(inputs[i], w, bias); });
  for (std::thread& t : threads) t.join();
#pragma omp parallel for num_threads(2)
  for (size_t i = 3; i < outputs.size(); ++i) outputs[i] = ops::linear(inputs[i], w, bias);
  for (size_t i = 0; i < outputs.size(); ++i) {
    EXPECT_MATCHES_REFERENCE(outputs[i], reference_linear(inputs[i], w.to_doubles(), 48, bias.to_doubles()))
        << "call " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LinearAlgebra, ::testing::Values(DType::F32, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// Every fp8 code, both formats, against the scalar reference decoder: exact in f32 and the same
// bits as xdit::f32_to_bf16 in bf16; odd lengths exercise the vector tail.
TEST(Fp8Dequantize, EveryCodeMatchesScalarDecoder) {
  std::vector<uint8_t> codes(256 + 13);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>(i * 7 + 3);
  for (DType fp8 : {DType::F8E4M3, DType::F8E5M2}) {
    for (float scale : {1.0f, 0.0123f, 3.5e-3f, 1e-30f}) {
      for (size_t n : {codes.size(), size_t{15}, size_t{1}}) {
        std::vector<float> f32(n);
        std::vector<uint16_t> bf16(n);
        cpu::dequantize_fp8(codes.data(), fp8, scale, f32.data(), static_cast<int64_t>(n));
        cpu::dequantize_fp8(codes.data(), fp8, scale, bf16.data(), static_cast<int64_t>(n));
        for (size_t i = 0; i < n; ++i) {
          const float decoded = fp8 == DType::F8E4M3 ? f8e4m3_to_f32(codes[i]) : f8e5m2_to_f32(codes[i]);
          const float expected = decoded * scale;
          if (std::isnan(expected)) {
            EXPECT_TRUE(std::isnan(f32[i])) << "code " << int(codes[i]);
            EXPECT_TRUE(std::isnan(bf16_to_f32(bf16[i]))) << "code " << int(codes[i]);
            continue;
          }
          EXPECT_EQ(f32[i], expected) << dtype_name(fp8) << " code " << int(codes[i]) << " scale " << scale;
          EXPECT_EQ(bf16[i], f32_to_bf16(expected)) << dtype_name(fp8) << " code " << int(codes[i]);
        }
      }
    }
  }
}

// The largest magnitude below 2^e in a format with `man_bits` mantissa bits spaces values by
// 2^(e - 1 - man_bits); below the smallest normal the spacing is that of the subnormals.
double fp8_half_ulp(double magnitude, DType fp8) {
  const int man_bits = fp8 == DType::F8E4M3 ? 3 : 2;
  const int min_exponent = fp8 == DType::F8E4M3 ? -6 : -14;
  const int exponent = magnitude > 0 ? std::max(static_cast<int>(std::floor(std::log2(magnitude))), min_exponent)
                                     : min_exponent;
  return std::ldexp(0.5, exponent - man_bits);
}

TEST(Fp8Quantize, ScalesCodesAndErrorBound) {
  const int64_t n = 6, k = 133;
  std::vector<float> values(static_cast<size_t>(n * k));
  const std::vector<double> random = random_tensor({n, k}, DType::F32, 80).to_doubles();
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) {
      const double v = random[r * k + c];
      float& out = values[r * k + c];
      switch (r) {
        case 0: out = static_cast<float>(v); break;
        case 1: out = 0.0f; break;                                      // an all-zero row
        case 2: out = static_cast<float>(v * 1e-3); break;              // small weights
        case 3: out = c == 5 ? 100.0f : static_cast<float>(v * 1e-2); break;  // one outlier: subnormal codes
        case 4: out = static_cast<float>(-std::fabs(v) * 1e4); break;  // large, negative
        default: out = c % 2 == 0 ? 0.0f : static_cast<float>(v); break;
      }
    }
  for (DType source : {DType::F32, DType::BF16}) {
    const Tensor w = Tensor::from_floats(values, {n, k}, source);
    for (DType fp8 : {DType::F8E4M3, DType::F8E5M2}) {
      const double fp8_max = fp8 == DType::F8E4M3 ? 448.0 : 57344.0;
      for (const Tensor& view : {w, transposed_storage(w)}) {
        const ops::Fp8Weight q = ops::quantize_fp8_per_channel(view, fp8);
        ASSERT_EQ(q.data.shape(), (Shape{n, k}));
        ASSERT_EQ(q.scale.shape(), (Shape{n}));
        const std::vector<double> wv = w.to_doubles();
        const std::vector<double> scale = q.scale.to_doubles();
        const auto* codes = q.data.data<uint8_t>();
        for (int64_t r = 0; r < n; ++r) {
          double amax = 0;
          for (int64_t c = 0; c < k; ++c) amax = std::max(amax, std::fabs(wv[r * k + c]));
          const float expected_scale = amax > 0 ? static_cast<float>(amax) / static_cast<float>(fp8_max) : 1.0f;
          EXPECT_EQ(scale[r], expected_scale) << "row " << r;
          for (int64_t c = 0; c < k; ++c) {
            const float quotient = static_cast<float>(wv[r * k + c]) / expected_scale;
            const uint8_t expected_code = fp8 == DType::F8E4M3 ? f32_to_f8e4m3(quotient) : f32_to_f8e5m2(quotient);
            ASSERT_EQ(codes[r * k + c], expected_code) << dtype_name(fp8) << " row " << r << " col " << c;
            const double decoded = fp8 == DType::F8E4M3 ? f8e4m3_to_f32(codes[r * k + c]) : f8e5m2_to_f32(codes[r * k + c]);
            const double error = std::fabs(decoded * scale[r] - wv[r * k + c]);
            // Half an ulp of the quotient, plus the rounding of the quotient itself in f32.
            const double bound = (fp8_half_ulp(std::fabs(quotient), fp8) + std::fabs(quotient) * 0x1p-23) * scale[r];
            ASSERT_LE(error, bound) << dtype_name(fp8) << " row " << r << " col " << c << " value " << wv[r * k + c];
          }
        }
      }
    }
  }
}

// Special values against the scalar encoder: signed zeros, the format limits, ties, subnormals,
// overflow, infinities and NaN.
TEST(Fp8Quantize, VectorEncoderMatchesScalarEncoder) {
  std::vector<float> inputs = {0.0f, -0.0f, 448.0f, -448.0f, 464.0f, 480.0f, 1e9f, -1e9f, INFINITY, -INFINITY,
                               NAN, 57344.0f, 61440.0f, 0x1p-6f, 0x1p-9f, 0x1p-10f, 0x3p-11f, 0x1p-14f, 0x1p-16f,
                               0x1p-17f, 0x3p-18f, 1e-40f, 1.0625f, 1.1875f, 1.125f, 3.0f, 17.0f, 0.3f};
  for (int i = -200; i <= 200; ++i) inputs.push_back(std::ldexp(1.0f + static_cast<float>(i % 37) / 37.0f, i / 10));
  for (DType fp8 : {DType::F8E4M3, DType::F8E5M2}) {
    std::vector<uint8_t> codes(inputs.size());
    cpu::quantize_fp8(inputs.data(), 1.0f, fp8, codes.data(), static_cast<int64_t>(inputs.size()));
    for (size_t i = 0; i < inputs.size(); ++i) {
      const uint8_t expected = fp8 == DType::F8E4M3 ? f32_to_f8e4m3(inputs[i]) : f32_to_f8e5m2(inputs[i]);
      EXPECT_EQ(codes[i], expected) << dtype_name(fp8) << " input " << inputs[i];
    }
  }
}

// ---- validation

TEST(LinearValidation, RejectsBadArguments) {
  const Tensor a = random_tensor({4, 8}, DType::F32, 1);
  const Tensor b = random_tensor({8, 3}, DType::F32, 2);
  expect_error([&] { ops::matmul(a, random_tensor({7, 3}, DType::F32, 3)); }, {"matmul", "inner dims"});
  expect_error([&] { ops::matmul(a, b.to(DType::BF16)); }, {"matmul", "bf16"});
  expect_error([&] { ops::matmul(random_tensor({8}, DType::F32, 4), b); }, {"matmul", "at least 2 dims"});
  expect_error([&] { ops::matmul(random_tensor({2, 4, 8}, DType::F32, 5), random_tensor({3, 8, 3}, DType::F32, 6)); },
               {"matmul", "broadcast"});
  expect_error([&] { ops::matmul(a.to(DType::I32), b); }, {"matmul", "i32"});

  const Tensor x = random_tensor({5, 8}, DType::BF16, 7);
  const Tensor w = random_tensor({6, 8}, DType::BF16, 8);
  expect_error([&] { ops::linear(x, random_tensor({6, 7}, DType::BF16, 9)); }, {"linear", "K = 7"});
  expect_error([&] { ops::linear(x, w.to(DType::F32)); }, {"linear", "weight is f32"});
  expect_error([&] { ops::linear(x, random_tensor({6, 8, 1}, DType::BF16, 10)); }, {"linear", "[N, K]"});
  expect_error([&] { ops::linear(x, w, random_tensor({5}, DType::BF16, 11)); }, {"linear", "bias [5]"});
  expect_error([&] { ops::linear(x, w, random_tensor({6}, DType::F16, 12)); }, {"linear", "bias is f16"});
  expect_error([&] { ops::linear(x, w, {}, Tensor::full({6}, 1.0f, DType::F32)); }, {"linear", "only for fp8"});

  const ops::Fp8Weight q = ops::quantize_fp8_per_channel(w.to(DType::F32));
  expect_error([&] { ops::linear(x, q.data); }, {"linear", "needs weight_scale"});
  expect_error([&] { ops::linear(x, q.data, {}, Tensor::full({5}, 1.0f, DType::F32)); },
               {"linear", "weight_scale [5]"});
  expect_error([&] { ops::linear(x, q.data, {}, q.scale.to(DType::BF16)); }, {"linear", "weight_scale"});

  expect_error([&] { ops::quantize_fp8_per_channel(w, DType::BF16); }, {"quantize_fp8_per_channel", "bf16"});
  expect_error([&] { ops::quantize_fp8_per_channel(random_tensor({6}, DType::F32, 13)); },
               {"quantize_fp8_per_channel", "[N, K]"});
  const Tensor with_nan = Tensor::from_floats(std::vector<float>{1.0f, 2.0f, NAN, 4.0f}, {2, 2});
  expect_error([&] { ops::quantize_fp8_per_channel(with_nan); }, {"quantize_fp8_per_channel", "row 1"});
}

}  // namespace
}  // namespace xdit
