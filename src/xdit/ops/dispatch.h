// Shared argument checks for the ops layer.
#pragma once

#include <initializer_list>
#include <string_view>

#include "xdit/backend/backend.h"

namespace xdit::ops {

// The backend of `op`'s inputs; every defined input must be on the same device.
Backend& backend_of(std::string_view op, std::initializer_list<const Tensor*> inputs);

// Throws unless x is defined and of one of the allowed dtypes.
void check_dtype(std::string_view op, std::string_view arg, const Tensor& x, std::initializer_list<DType> allowed);

// F32 or BF16, the activation dtypes every CPU kernel takes.
void check_float(std::string_view op, std::string_view arg, const Tensor& x);

}  // namespace xdit::ops
