#include "xdit/backend/cpu/dnnl_context.h"

#include <cstring>

#include "xdit/core/allocator.h"

namespace xdit::cpu {

dnnl::engine& dnnl_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::stream& dnnl_stream() {
  thread_local dnnl::stream stream(dnnl_engine());
  return stream;
}

dnnl::memory::data_type dnnl_dtype(DType dtype) {
  switch (dtype) {
    case DType::F32: return dnnl::memory::data_type::f32;
    case DType::BF16: return dnnl::memory::data_type::bf16;
    case DType::F16: return dnnl::memory::data_type::f16;
    default: break;
  }
  fail("oneDNN: no memory type for dtype ", dtype_name(dtype));
}

dnnl::memory::dims dnnl_dims(const Shape& shape) { return dnnl::memory::dims(shape.begin(), shape.end()); }

dnnl::memory::desc strided_desc(const Shape& shape, const Shape& strides, DType dtype) {
  return dnnl::memory::desc(dnnl_dims(shape), dnnl_dtype(dtype), dnnl_dims(strides));
}

dnnl::primitive_attr user_scratchpad_attr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

bool is_reference_impl(const char* impl_info) { return std::strncmp(impl_info, "ref", 3) == 0; }

dnnl::memory wrap_memory(const dnnl::memory::desc& desc, const void* data) {
  return dnnl::memory(desc, dnnl_engine(), const_cast<void*>(data));
}

OwnedMemory allocate_memory(const dnnl::memory::desc& desc) {
  OwnedMemory result;
  result.owner = allocate_host(desc.get_size());
  result.memory = dnnl::memory(desc, dnnl_engine(), result.owner.get());
  return result;
}

void execute(const dnnl::primitive& primitive, const dnnl::memory::desc& scratchpad,
             std::unordered_map<int, dnnl::memory> args) {
  std::shared_ptr<void> scratch_owner;
  if (scratchpad.get_size() > 0) {
    OwnedMemory scratch = allocate_memory(scratchpad);
    scratch_owner = std::move(scratch.owner);
    args.emplace(DNNL_ARG_SCRATCHPAD, scratch.memory);
  }
  dnnl::stream& stream = dnnl_stream();
  primitive.execute(stream, args);
  stream.wait();
}

size_t PrimitiveKey::hash() const {
  // FNV-1a over the values' bytes: keys are short, so this is cheap next to a primitive call.
  uint64_t h = 1469598103934665603ull;
  for (int64_t v : values_) {
    uint64_t u = static_cast<uint64_t>(v);
    for (int byte = 0; byte < 8; ++byte) {
      h ^= (u >> (8 * byte)) & 0xffu;
      h *= 1099511628211ull;
    }
  }
  return static_cast<size_t>(h);
}

}  // namespace xdit::cpu
