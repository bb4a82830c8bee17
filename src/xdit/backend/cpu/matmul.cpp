// matmul and linear on oneDNN matmul primitives (gemm_core), FP8 weights through gemm_fp8.
#include "xdit/backend/cpu/cpu_backend.h"
#include "xdit/backend/cpu/gemm_core.h"
#include "xdit/backend/cpu/gemm_fp8.h"
#include "xdit/core/strided.h"

namespace xdit {

namespace {

Shape batch_shape(const Tensor& x) { return Shape(x.shape().begin(), x.shape().end() - 2); }

// Strides of x's batch dims (all but the last two) seen through broadcasting to `batch`: 0 where
// x lacks the dim or has size 1.
Shape broadcast_batch_strides(const Tensor& x, const Shape& batch) {
  const size_t own = static_cast<size_t>(x.dim() - 2);
  const size_t lead = batch.size() - own;
  Shape strides(batch.size(), 0);
  for (size_t d = 0; d < own; ++d) {
    if (x.shape()[d] != 1) strides[lead + d] = x.strides()[d];
  }
  return strides;
}

// One matmul operand: the merged batch dims (size 1 where the operand broadcasts) and its matrix.
cpu::GemmLayout operand_layout(const Shape& batch, const Shape& batch_strides, const Tensor& x) {
  cpu::GemmLayout layout{batch, batch_strides};
  for (size_t d = 0; d < batch.size(); ++d) {
    if (batch_strides[d] == 0) layout.shape[d] = 1;
  }
  layout.shape.insert(layout.shape.end(), {x.size(-2), x.size(-1)});
  layout.strides.insert(layout.strides.end(), {x.stride(-2), x.stride(-1)});
  cpu::normalize_unit_strides(layout);
  return layout;
}

// The result of an empty sum (K = 0): the bias broadcast over the rows, or zeros.
Tensor empty_product(const Shape& shape, DType dtype, const Tensor& bias) {
  Tensor out = Tensor::zeros(shape, dtype);
  if (bias.defined()) out.copy_from(bias.expand(shape));
  return out;
}

}  // namespace

Tensor CpuBackend::matmul(const Tensor& a, const Tensor& b) {
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  const Shape batch = broadcast_shapes(batch_shape(a), batch_shape(b));
  Shape out_shape = batch;
  out_shape.insert(out_shape.end(), {m, n});
  if (k == 0) return empty_product(out_shape, a.dtype(), Tensor());
  Tensor out = Tensor::empty(out_shape, a.dtype());
  if (out.numel() == 0) return out;

  const Shape b_batch = batch_shape(b);
  if (shape_numel(b_batch) == 1) {
    // One right operand for the whole batch: a linear layer over all of a's rows, which merges
    // the batch into M where a's layout allows (one large GEMM instead of many small ones).
    const Tensor b2 = b.reshape({k, n});
    Shape rows = batch_shape(a);
    rows.insert(rows.end(), {m, n});
    const cpu::GemmProblem problem = cpu::linear_problem(a, b2.transpose(0, 1), Tensor(), out.view(rows));
    cpu::run_gemm(problem, {a.raw_data(), b2.raw_data(), nullptr, out.raw_data()});
    return out;
  }

  // Merge batch dims that are laid out alike in a, b and the result: fewer dims, same problem.
  Shape merged = batch;
  Shape a_strides = broadcast_batch_strides(a, batch);
  Shape b_strides = broadcast_batch_strides(b, batch);
  Shape out_strides(out.strides().begin(), out.strides().end() - 2);
  coalesce_dims(merged, {&a_strides, &b_strides, &out_strides});
  if (merged == Shape{1}) {  // no batch at all: a plain 2-D GEMM
    merged.clear();
    a_strides.clear();
    b_strides.clear();
    out_strides.clear();
  }

  cpu::GemmProblem problem;
  problem.dtype = a.dtype();
  problem.a = operand_layout(merged, a_strides, a);
  problem.b = operand_layout(merged, b_strides, b);
  problem.dst = operand_layout(merged, out_strides, out);
  cpu::run_gemm(problem, {a.raw_data(), b.raw_data(), nullptr, out.raw_data()});
  return out;
}

Tensor CpuBackend::linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& weight_scale) {
  Shape out_shape(x.shape().begin(), x.shape().end() - 1);
  out_shape.push_back(weight.size(0));
  const Tensor dense_bias = bias.defined() ? bias.contiguous() : Tensor();
  if (x.size(-1) == 0) return empty_product(out_shape, x.dtype(), dense_bias);
  Tensor out = Tensor::empty(out_shape, x.dtype());
  if (out.numel() == 0) return out;

  if (weight.dtype() == DType::F8E4M3 || weight.dtype() == DType::F8E5M2) {
    cpu::fp8_linear(x, weight, weight_scale, dense_bias, out);
    return out;
  }
  const cpu::GemmProblem problem = cpu::linear_problem(x, weight, dense_bias, out);
  cpu::run_gemm(problem, {x.raw_data(), weight.raw_data(), dense_bias.defined() ? dense_bias.raw_data() : nullptr,
                          out.raw_data()});
  return out;
}

}  // namespace xdit
