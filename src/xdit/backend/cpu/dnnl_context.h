// oneDNN plumbing shared by the CPU GEMM and convolution kernels: the engine, a stream per
// thread, memory descriptors built from tensor layouts, execution with a scratchpad drawn from
// the host allocator, and a cache of primitives keyed by shapes, strides and dtypes so repeated
// calls with the same problem do not create primitives again.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "xdit/core/tensor.h"
#include "xdit/core/threading.h"

namespace xdit::cpu {

dnnl::engine& dnnl_engine();
// Streams are not meant to be shared between threads, so each thread gets its own.
dnnl::stream& dnnl_stream();

dnnl::memory::data_type dnnl_dtype(DType dtype);
dnnl::memory::dims dnnl_dims(const Shape& shape);
// A descriptor with the given shape and strides (in elements).
dnnl::memory::desc strided_desc(const Shape& shape, const Shape& strides, DType dtype);

// Primitive attributes every cached primitive uses: the scratchpad is passed at execution, so
// one primitive can run on several threads at once.
dnnl::primitive_attr user_scratchpad_attr();

// True when oneDNN fell back to its reference implementation (correct but very slow).
bool is_reference_impl(const char* impl_info);

// Runs `primitive` on this thread's stream with a scratchpad of `scratchpad` bytes from the host
// allocator, and waits for it.
void execute(const dnnl::primitive& primitive, const dnnl::memory::desc& scratchpad,
             std::unordered_map<int, dnnl::memory> args);

// A memory object over existing data; oneDNN takes a non-const handle even for inputs.
dnnl::memory wrap_memory(const dnnl::memory::desc& desc, const void* data);

// A memory object over a fresh host allocation, kept alive by the returned `owner`.
struct OwnedMemory {
  dnnl::memory memory;
  std::shared_ptr<void> owner;
};
OwnedMemory allocate_memory(const dnnl::memory::desc& desc);

// Identifies a problem: every value that changes which primitive is built (shapes, strides,
// dtypes, parameters), appended in a fixed order by the caller. It starts with the number of
// threads oneDNN plans the primitive's work split for: the OpenMP thread count, or 1 inside a
// parallel region, where oneDNN runs on the calling thread alone.
class PrimitiveKey {
 public:
  PrimitiveKey() : values_{omp_in_parallel() ? 1 : num_threads()} {}
  PrimitiveKey& add(int64_t value) {
    values_.push_back(value);
    return *this;
  }
  PrimitiveKey& add(const Shape& values) {
    values_.push_back(static_cast<int64_t>(values.size()));
    values_.insert(values_.end(), values.begin(), values.end());
    return *this;
  }
  bool operator==(const PrimitiveKey&) const = default;
  size_t hash() const;

 private:
  std::vector<int64_t> values_;
};

struct PrimitiveKeyHash {
  size_t operator()(const PrimitiveKey& key) const { return key.hash(); }
};

// Least-recently-used cache of built primitives (and whatever else the caller derives from a
// key). Entries are immutable once built and shared with the callers using them.
template <typename Entry>
class PrimitiveCache {
 public:
  explicit PrimitiveCache(size_t capacity = 512) : capacity_(capacity) {}

  std::shared_ptr<const Entry> get(const PrimitiveKey& key, const std::function<Entry()>& build) {
    {
      std::lock_guard lock(mutex_);
      auto it = index_.find(key);
      if (it != index_.end()) {
        order_.splice(order_.begin(), order_, it->second);
        return it->second->second;
      }
    }
    // Built outside the lock: creation can take milliseconds and may run the JIT.
    auto entry = std::make_shared<const Entry>(build());
    std::lock_guard lock(mutex_);
    auto it = index_.find(key);
    if (it != index_.end()) return it->second->second;
    order_.emplace_front(key, entry);
    index_.emplace(key, order_.begin());
    if (order_.size() > capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();
    }
    return entry;
  }

  size_t size() const {
    std::lock_guard lock(mutex_);
    return order_.size();
  }

 private:
  using Item = std::pair<PrimitiveKey, std::shared_ptr<const Entry>>;
  size_t capacity_;
  mutable std::mutex mutex_;
  std::list<Item> order_;
  std::unordered_map<PrimitiveKey, typename std::list<Item>::iterator, PrimitiveKeyHash> index_;
};

}  // namespace xdit::cpu
