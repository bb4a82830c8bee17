// Tensor: shape, strides (in elements), dtype, device and shared storage.
// View operations (reshape of contiguous data, permute, transpose, narrow, slice, chunk, select,
// expand) share storage and never copy; contiguous() materialises a dense copy when needed.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "xdit/core/dtype.h"
#include "xdit/core/error.h"

namespace xdit {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& shape);  // "[2, 3, 4]"
int64_t shape_numel(const Shape& shape);     // throws on negative sizes or int64 overflow

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;
  bool operator==(const Device&) const = default;
  static Device cpu() { return {}; }
  static Device cuda(int index = 0) { return {DeviceType::CUDA, index}; }
};
std::string device_str(Device device);

// A block of memory. `owner` keeps whatever backs it alive (an allocator block, an mmap).
struct Storage {
  void* data = nullptr;
  size_t nbytes = 0;
  Device device;
  std::shared_ptr<void> owner;
  // A read-only view of a mapped file: its pages can be dropped from memory and read again.
  bool file_mapping = false;
};

class Tensor {
 public:
  Tensor() = default;  // undefined: used for optional arguments (bias, mask, ...)

  // Allocation through the current allocator (the caching allocator or an active StepArena).
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::cpu());
  static Tensor full(const Shape& shape, float value, DType dtype, Device device = Device::cpu());
  // Copies values (converted from float/double/int) into a new contiguous CPU tensor.
  static Tensor from_floats(std::span<const float> values, const Shape& shape, DType dtype = DType::F32);
  static Tensor from_doubles(std::span<const double> values, const Shape& shape, DType dtype = DType::F32);
  static Tensor from_ints(std::span<const int64_t> values, const Shape& shape, DType dtype = DType::I64);
  // Wraps existing memory without copying; `owner` keeps it alive (an mmap, say).
  static Tensor from_blob(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> owner,
                          Device device = Device::cpu());

  bool defined() const { return storage_ != nullptr; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t size(int64_t d) const;    // negative d counts from the end
  int64_t stride(int64_t d) const;
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device : Device{}; }
  int64_t offset() const { return offset_; }  // in elements
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  bool is_contiguous() const;
  bool shares_storage_with(const Tensor& other) const { return storage_ == other.storage_; }

  // Pointer to the first element of this view.
  void* raw_data() const;
  template <typename T>
  T* data() const { return static_cast<T*>(raw_data()); }

  // Views.
  Tensor view(const Shape& shape) const;      // requires strides compatible with the new shape; one -1 allowed
  Tensor reshape(const Shape& shape) const;   // a view when possible, otherwise a contiguous copy
  Tensor permute(const std::vector<int64_t>& order) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor narrow(int64_t d, int64_t start, int64_t length) const;
  Tensor slice(int64_t d, int64_t start, int64_t end, int64_t step = 1) const;
  std::vector<Tensor> chunk(int64_t chunks, int64_t d) const;  // equal parts; d's size must divide
  std::vector<Tensor> split(const std::vector<int64_t>& sizes, int64_t d) const;
  Tensor select(int64_t d, int64_t index) const;  // drops dimension d
  Tensor unsqueeze(int64_t d) const;
  Tensor squeeze(int64_t d) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor expand(const Shape& shape) const;  // broadcasts size-1 dims with stride 0

  // Copies.
  Tensor contiguous() const;                 // this tensor itself when already contiguous
  Tensor clone() const;                      // always a fresh contiguous copy
  Tensor to(DType dtype) const;              // this tensor itself when the dtype already matches
  void copy_from(const Tensor& src);         // same shape; converts dtype; any strides on both sides

  // Host readback for tests and tools (CPU only): contiguous values converted to double.
  std::vector<double> to_doubles() const;
  std::vector<float> to_floats() const;

 private:
  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;
  Shape shape_;
  Shape strides_;
  DType dtype_ = DType::F32;

  Tensor with_layout(Shape shape, Shape strides, int64_t offset) const;
  int64_t wrap_dim(int64_t d, int64_t ndim_plus = 0) const;
};

Shape contiguous_strides(const Shape& shape);

// Numpy broadcasting of two shapes; throws naming both shapes when they do not broadcast.
Shape broadcast_shapes(const Shape& a, const Shape& b);

}  // namespace xdit
