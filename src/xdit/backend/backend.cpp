#include "xdit/backend/backend.h"

#include <array>

#include "xdit/backend/cpu/cpu_backend.h"

namespace xdit {

namespace {

std::array<Backend*, 2>& registry() {
  static std::array<Backend*, 2> backends{&cpu_backend(), nullptr};
  return backends;
}

}  // namespace

Backend& backend_for(Device device) {
  Backend* backend = registry()[static_cast<size_t>(device.type)];
  if (backend == nullptr) throw NotSupported("the " + device_str(device) + " backend");
  return *backend;
}

void register_backend(DeviceType type, Backend* backend) { registry()[static_cast<size_t>(type)] = backend; }

}  // namespace xdit
