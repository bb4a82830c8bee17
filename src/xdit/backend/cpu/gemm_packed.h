// Opt-in prepacked linear weights for the CPU. ops::linear reads a weight in its stored [N, K]
// layout (zero copy, straight from an mmap'd checkpoint), and oneDNN then repacks panels of it
// on every call. Packing once at load time into the blocked layout oneDNN's matmul picks
// (format_tag::any) removes that work: it is worth it for weights used many times at large M
// (DiT blocks over thousands of tokens), at the cost of one extra copy of the weight in memory.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <cstdint>
#include <memory>

#include "xdit/core/tensor.h"

namespace xdit::cpu {

struct PackedLinearWeight {
  int64_t n = 0, k = 0;
  DType dtype = DType::F32;
  int64_t typical_m = 0;         // the row count the layout was chosen for
  dnnl::memory::desc layout;     // oneDNN's blocked [K, N] weights layout
  std::shared_ptr<void> packed;  // host memory holding the weight in `layout`
};

// Packs weight [N, K] (F32 or BF16, any strides) for GEMMs of about `typical_m` rows.
PackedLinearWeight pack_linear_weight(const Tensor& weight, int64_t typical_m);

// x [..., K] · W^T (+ bias [N], F32 or x's dtype) -> [..., N] in x's dtype, which must be the
// weight's. Any row count works; the layout is simply tuned for typical_m.
Tensor linear_packed(const Tensor& x, const PackedLinearWeight& weight, const Tensor& bias);

}  // namespace xdit::cpu
