#include "xdit/ops/dispatch.h"

#include <sstream>

namespace xdit::ops {

Backend& backend_of(std::string_view op, std::initializer_list<const Tensor*> inputs) {
  const Tensor* first = nullptr;
  for (const Tensor* t : inputs) {
    if (t == nullptr || !t->defined()) continue;
    if (first == nullptr) {
      first = t;
    } else {
      XDIT_CHECK(t->device() == first->device(), op, ": inputs on different devices (", device_str(first->device()),
                 " and ", device_str(t->device()), ")");
    }
  }
  XDIT_CHECK(first != nullptr, op, ": no defined input");
  return backend_for(first->device());
}

void check_dtype(std::string_view op, std::string_view arg, const Tensor& x, std::initializer_list<DType> allowed) {
  XDIT_CHECK(x.defined(), op, ": ", arg, " is undefined");
  for (DType d : allowed) {
    if (x.dtype() == d) return;
  }
  std::ostringstream names;
  for (DType d : allowed) names << (names.tellp() > 0 ? ", " : "") << dtype_name(d);
  fail(op, ": ", arg, " has dtype ", dtype_name(x.dtype()), ", expected one of ", names.str());
}

void check_float(std::string_view op, std::string_view arg, const Tensor& x) {
  check_dtype(op, arg, x, {DType::F32, DType::BF16});
}

}  // namespace xdit::ops
