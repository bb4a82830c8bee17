// Element-wise copy between two strided layouts of the same shape, converting the dtype.
#pragma once

#include "xdit/core/dtype.h"
#include "xdit/core/tensor.h"

namespace xdit {

void strided_copy(const void* src, DType src_dtype, const Shape& src_strides, void* dst, DType dst_dtype,
                  const Shape& dst_strides, const Shape& shape);

// Merges adjacent dims that are contiguous in every one of the given stride sets, and drops
// size-1 dims, so loops over strided data run over as few, as long, dims as possible.
void coalesce_dims(Shape& shape, std::vector<Shape*> strides);

}  // namespace xdit
