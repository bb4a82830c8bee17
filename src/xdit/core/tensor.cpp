#include "xdit/core/tensor.h"

#include <algorithm>
#include <numeric>
#include <sstream>

#include "xdit/core/allocator.h"
#include "xdit/core/strided.h"

namespace xdit {

std::string shape_str(const Shape& shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) {
    XDIT_CHECK(s >= 0, "negative size in shape ", shape_str(shape));
    XDIT_CHECK(!__builtin_mul_overflow(n, s, &n), "shape ", shape_str(shape), " has too many elements");
  }
  return n;
}

std::string device_str(Device device) {
  if (device.type == DeviceType::CPU) return "cpu";
  return "cuda:" + std::to_string(device.index);
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    XDIT_CHECK(shape[i] >= 0, "negative size in shape ", shape_str(shape));
    strides[i] = stride;
    XDIT_CHECK(!__builtin_mul_overflow(stride, std::max<int64_t>(shape[i], 1), &stride), "shape ", shape_str(shape),
               " is too large to address");
  }
  return strides;
}

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    XDIT_CHECK(da == db || da == 1 || db == 1, "shapes ", shape_str(a), " and ", shape_str(b), " do not broadcast");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

namespace {

std::shared_ptr<Storage> allocate_storage(size_t nbytes, Device device) {
  if (device.type != DeviceType::CPU) throw NotSupported("allocating on " + device_str(device));
  auto storage = std::make_shared<Storage>();
  storage->owner = allocate_host(nbytes);
  storage->data = storage->owner.get();
  storage->nbytes = nbytes;
  storage->device = device;
  return storage;
}

}  // namespace

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.storage_ = allocate_storage(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), device);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  std::memset(t.raw_data(), 0, t.nbytes());
  return t;
}

Tensor Tensor::full(const Shape& shape, float value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  const size_t n = static_cast<size_t>(t.numel());
  for (size_t i = 0; i < n; ++i) store_from_f32(t.raw_data(), dtype, i, value);
  return t;
}

Tensor Tensor::from_floats(std::span<const float> values, const Shape& shape, DType dtype) {
  XDIT_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "from_floats: ", values.size(),
             " values for shape ", shape_str(shape));
  Tensor t = empty(shape, dtype);
  convert(values.data(), DType::F32, t.raw_data(), dtype, values.size());
  return t;
}

Tensor Tensor::from_doubles(std::span<const double> values, const Shape& shape, DType dtype) {
  std::vector<float> narrowed(values.begin(), values.end());
  return from_floats(narrowed, shape, dtype);
}

Tensor Tensor::from_ints(std::span<const int64_t> values, const Shape& shape, DType dtype) {
  XDIT_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "from_ints: ", values.size(),
             " values for shape ", shape_str(shape));
  Tensor t = empty(shape, dtype);
  convert(values.data(), DType::I64, t.raw_data(), dtype, values.size());
  return t;
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> owner, Device device) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  auto storage = std::make_shared<Storage>();
  storage->data = data;
  storage->nbytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  storage->device = device;
  storage->owner = std::move(owner);
  t.storage_ = std::move(storage);
  return t;
}

int64_t Tensor::wrap_dim(int64_t d, int64_t ndim_plus) const {
  const int64_t n = dim() + ndim_plus;
  const int64_t wrapped = d < 0 ? d + n : d;
  XDIT_CHECK(wrapped >= 0 && wrapped < std::max<int64_t>(n, 1), "dimension ", d, " out of range for a tensor of shape ",
             shape_str(shape_));
  return wrapped;
}

int64_t Tensor::size(int64_t d) const { return shape_[wrap_dim(d)]; }
int64_t Tensor::stride(int64_t d) const { return strides_[wrap_dim(d)]; }

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] == 1) continue;
    if (strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

void* Tensor::raw_data() const {
  XDIT_CHECK(defined(), "access to an undefined tensor");
  return static_cast<char*>(storage_->data) + offset_ * static_cast<int64_t>(dtype_size(dtype_));
}

Tensor Tensor::with_layout(Shape shape, Shape strides, int64_t offset) const {
  Tensor t = *this;
  t.shape_ = std::move(shape);
  t.strides_ = std::move(strides);
  t.offset_ = offset;
  return t;
}

namespace {

Shape infer_shape(const Shape& requested, int64_t numel, const Shape& from) {
  Shape shape = requested;
  int64_t known = 1;
  int infer_at = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      XDIT_CHECK(infer_at < 0, "only one dimension can be -1 in ", shape_str(requested));
      infer_at = static_cast<int>(i);
    } else {
      XDIT_CHECK(shape[i] >= 0, "invalid size in ", shape_str(requested));
      known *= shape[i];
    }
  }
  if (infer_at >= 0) {
    XDIT_CHECK(known > 0 && numel % known == 0, "cannot reshape ", shape_str(from), " to ", shape_str(requested));
    shape[infer_at] = numel / known;
  }
  XDIT_CHECK(shape_numel(shape) == numel, "cannot reshape ", shape_str(from), " to ", shape_str(requested));
  return shape;
}

// Strides for viewing (shape, strides) as new_shape without copying, if possible. Walks the old
// dims from the innermost, grouping runs that are contiguous with each other; each run must be
// covered exactly by a run of new dims, which then get strides inside that run.
bool compute_view_strides(Shape shape, Shape strides, const Shape& new_shape, Shape& out) {
  out.assign(new_shape.size(), 0);
  if (shape_numel(shape) == 0) {
    out = contiguous_strides(new_shape);
    return true;
  }
  if (shape.empty()) {
    shape = {1};
    strides = {1};
  }
  int64_t view_d = static_cast<int64_t>(new_shape.size()) - 1;
  int64_t run_base_stride = strides.back();
  int64_t run_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    run_numel *= shape[d];
    const bool run_ends = d == 0 || (shape[d - 1] != 1 && strides[d - 1] != run_numel * run_base_stride);
    if (!run_ends) continue;
    while (view_d >= 0 && (view_numel < run_numel || new_shape[view_d] == 1)) {
      out[view_d] = view_numel * run_base_stride;
      view_numel *= new_shape[view_d];
      --view_d;
    }
    if (view_numel != run_numel) return false;
    if (d > 0) {
      run_base_stride = strides[d - 1];
      run_numel = 1;
      view_numel = 1;
    }
  }
  return view_d == -1;
}

}  // namespace

Tensor Tensor::view(const Shape& shape) const {
  Shape new_shape = infer_shape(shape, numel(), shape_);
  Shape new_strides;
  XDIT_CHECK(compute_view_strides(shape_, strides_, new_shape, new_strides), "cannot view a tensor of shape ",
             shape_str(shape_), " with strides ", shape_str(strides_), " as ", shape_str(new_shape),
             " without a copy");
  return with_layout(std::move(new_shape), std::move(new_strides), offset_);
}

Tensor Tensor::reshape(const Shape& shape) const {
  Shape new_shape = infer_shape(shape, numel(), shape_);
  Shape new_strides;
  if (compute_view_strides(shape_, strides_, new_shape, new_strides)) {
    return with_layout(std::move(new_shape), std::move(new_strides), offset_);
  }
  return contiguous().view(new_shape);
}

Tensor Tensor::permute(const std::vector<int64_t>& order) const {
  XDIT_CHECK(static_cast<int64_t>(order.size()) == dim(), "permute order has ", order.size(),
             " entries for a tensor of shape ", shape_str(shape_));
  Shape new_shape(order.size()), new_strides(order.size());
  std::vector<bool> seen(order.size(), false);
  for (size_t i = 0; i < order.size(); ++i) {
    const int64_t d = wrap_dim(order[i]);
    XDIT_CHECK(!seen[d], "permute order repeats dimension ", order[i]);
    seen[d] = true;
    new_shape[i] = shape_[d];
    new_strides[i] = strides_[d];
  }
  return with_layout(std::move(new_shape), std::move(new_strides), offset_);
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  std::vector<int64_t> order(shape_.size());
  std::iota(order.begin(), order.end(), 0);
  std::swap(order[wrap_dim(d0)], order[wrap_dim(d1)]);
  return permute(order);
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  const int64_t w = wrap_dim(d);
  XDIT_CHECK(start >= 0 && length >= 0 && start + length <= shape_[w], "narrow(dim ", d, ", start ", start,
             ", length ", length, ") out of range for shape ", shape_str(shape_));
  Shape new_shape = shape_;
  new_shape[w] = length;
  return with_layout(std::move(new_shape), strides_, offset_ + start * strides_[w]);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  const int64_t w = wrap_dim(d);
  XDIT_CHECK(step >= 1, "slice step must be >= 1, got ", step);
  const int64_t n = shape_[w];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape new_shape = shape_;
  Shape new_strides = strides_;
  new_shape[w] = (end - start + step - 1) / step;
  new_strides[w] = strides_[w] * step;
  return with_layout(std::move(new_shape), std::move(new_strides), offset_ + start * strides_[w]);
}

std::vector<Tensor> Tensor::chunk(int64_t chunks, int64_t d) const {
  const int64_t w = wrap_dim(d);
  XDIT_CHECK(chunks >= 1 && shape_[w] % chunks == 0, "cannot chunk dimension ", d, " of shape ", shape_str(shape_),
             " into ", chunks, " equal parts");
  return split(std::vector<int64_t>(chunks, shape_[w] / chunks), d);
}

std::vector<Tensor> Tensor::split(const std::vector<int64_t>& sizes, int64_t d) const {
  const int64_t w = wrap_dim(d);
  int64_t total = 0;
  for (int64_t s : sizes) {
    XDIT_CHECK(s >= 0, "negative split size");
    total += s;
  }
  XDIT_CHECK(total == shape_[w], "split sizes sum to ", total, " but dimension ", d, " of shape ", shape_str(shape_),
             " has ", shape_[w]);
  std::vector<Tensor> parts;
  int64_t start = 0;
  for (int64_t s : sizes) {
    parts.push_back(narrow(w, start, s));
    start += s;
  }
  return parts;
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  const int64_t w = wrap_dim(d);
  if (index < 0) index += shape_[w];
  XDIT_CHECK(index >= 0 && index < shape_[w], "index ", index, " out of range for dimension ", d, " of shape ",
             shape_str(shape_));
  Shape new_shape = shape_, new_strides = strides_;
  new_shape.erase(new_shape.begin() + w);
  new_strides.erase(new_strides.begin() + w);
  return with_layout(std::move(new_shape), std::move(new_strides), offset_ + index * strides_[w]);
}

Tensor Tensor::unsqueeze(int64_t d) const {
  const int64_t w = wrap_dim(d, 1);
  Shape new_shape = shape_, new_strides = strides_;
  const int64_t stride = w < dim() ? strides_[w] * shape_[w] : 1;
  new_shape.insert(new_shape.begin() + w, 1);
  new_strides.insert(new_strides.begin() + w, stride);
  return with_layout(std::move(new_shape), std::move(new_strides), offset_);
}

Tensor Tensor::squeeze(int64_t d) const {
  const int64_t w = wrap_dim(d);
  XDIT_CHECK(shape_[w] == 1, "cannot squeeze dimension ", d, " of shape ", shape_str(shape_));
  return select(w, 0);
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return reshape({1});
  const int64_t s = wrap_dim(start_dim), e = wrap_dim(end_dim);
  XDIT_CHECK(s <= e, "flatten start ", start_dim, " is after end ", end_dim);
  Shape new_shape(shape_.begin(), shape_.begin() + s);
  int64_t merged = 1;
  for (int64_t i = s; i <= e; ++i) merged *= shape_[i];
  new_shape.push_back(merged);
  new_shape.insert(new_shape.end(), shape_.begin() + e + 1, shape_.end());
  return reshape(new_shape);
}

Tensor Tensor::expand(const Shape& shape) const {
  XDIT_CHECK(shape.size() >= shape_.size(), "cannot expand shape ", shape_str(shape_), " to ", shape_str(shape));
  const size_t lead = shape.size() - shape_.size();
  Shape new_strides(shape.size(), 0);
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i < lead) continue;
    const int64_t own = shape_[i - lead];
    if (own == shape[i]) {
      new_strides[i] = strides_[i - lead];
    } else {
      XDIT_CHECK(own == 1, "cannot expand shape ", shape_str(shape_), " to ", shape_str(shape));
    }
  }
  return with_layout(shape, std::move(new_strides), offset_);
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape_, dtype_, device());
  out.copy_from(*this);
  return out;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return *this;
  Tensor out = empty(shape_, dtype, device());
  out.copy_from(*this);
  return out;
}

void Tensor::copy_from(const Tensor& src) {
  XDIT_CHECK(defined() && src.defined(), "copy between undefined tensors");
  XDIT_CHECK(shape_ == src.shape_, "copy from shape ", shape_str(src.shape_), " into shape ", shape_str(shape_));
  XDIT_CHECK(device().type == DeviceType::CPU && src.device().type == DeviceType::CPU,
             "host copy between ", device_str(src.device()), " and ", device_str(device()));
  strided_copy(src.raw_data(), src.dtype_, src.strides_, raw_data(), dtype_, strides_, shape_);
}

std::vector<double> Tensor::to_doubles() const {
  Tensor dense = contiguous();
  const size_t n = static_cast<size_t>(numel());
  std::vector<double> out(n);
  if (dtype_ == DType::I64) {
    const int64_t* p = dense.data<int64_t>();
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<double>(p[i]);
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = load_as_f32(dense.raw_data(), dtype_, i);
  }
  return out;
}

std::vector<float> Tensor::to_floats() const {
  Tensor dense = to(DType::F32).contiguous();
  const float* p = dense.data<float>();
  return std::vector<float>(p, p + numel());
}

}  // namespace xdit
