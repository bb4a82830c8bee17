#include "xdit/backend/cpu/cpu_backend.h"

namespace xdit {

CpuBackend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

}  // namespace xdit
