// One oneDNN matmul call with cached primitives, shared by matmul, linear and the FP8 linear:
//   dst[batch..., M, N] = a[batch..., M, K] · b[batch..., K, N] (+ bias[N])
// Operands are passed with their own strides, so transposed weights (an [N, K] checkpoint tensor
// seen as [K, N]) and transposed activations are not copied. Two exceptions: a row-major right
// operand shared by all rows of a large product is reordered once per call into the blocked
// layout oneDNN runs fastest on (cheaper than oneDNN's repacking inside the call), and an operand
// for which oneDNN has nothing better than its reference kernel (no unit-stride dim, say) is first
// copied into a dense buffer.
#pragma once

#include "xdit/core/tensor.h"

namespace xdit::cpu {

struct GemmLayout {
  Shape shape;    // [batch..., rows, cols]; a batch dim of size 1 broadcasts against the others
  Shape strides;  // in elements
};

struct GemmProblem {
  DType dtype = DType::F32;  // a, b and dst (F32 or BF16); accumulation is f32
  GemmLayout a, b, dst;      // all of the same rank
  bool has_bias = false;
  DType bias_dtype = DType::F32;  // F32 or dtype; the bias is contiguous [N]
};

struct GemmData {
  const void* a = nullptr;
  const void* b = nullptr;
  const void* bias = nullptr;
  void* dst = nullptr;
};

void run_gemm(const GemmProblem& problem, const GemmData& data);

// The GEMM of a linear layer, out[..., N] = x[..., K] · weight[N, K]^T (+ bias), for any strides
// of x, weight and out. Leading dims of x that can be merged into one row dim are merged, the
// rest become broadcast batch dims of the weight. The bias, when given, is contiguous.
GemmProblem linear_problem(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out);

// Gives size-1 dims the stride they would have in a dense layout of the dims inside them, so
// oneDNN recognises plain layouts whatever stride a view left on a dim of size 1.
void normalize_unit_strides(GemmLayout& layout);

}  // namespace xdit::cpu
