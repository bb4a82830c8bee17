// Host memory: a caching allocator for long-lived and reusable buffers, and a per-step arena
// for temporaries. Tensor::empty draws from the arena while a StepArena::Scope is active on the
// calling thread, and from the caching allocator otherwise.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace xdit {

inline constexpr size_t kHostAlignment = 64;

struct AllocatorStats {
  size_t bytes_in_use = 0;    // handed out and not yet returned
  size_t bytes_cached = 0;    // returned and kept for reuse
  size_t peak_bytes_in_use = 0;
  size_t allocations = 0;     // requests served
  size_t cache_hits = 0;      // requests served from the cache
};

class CachingAllocator {
 public:
  static CachingAllocator& instance();

  // A block of at least `bytes` bytes, 64-byte aligned; returned to the cache when the last
  // shared_ptr copy goes away. Sizes are rounded to size classes so blocks are reusable.
  std::shared_ptr<void> allocate(size_t bytes);
  void empty_cache();  // frees every cached block
  AllocatorStats stats() const;
  static size_t round_size(size_t bytes);

  ~CachingAllocator();

 private:
  CachingAllocator() = default;
  void release(void* ptr, size_t rounded);

  mutable std::mutex mutex_;
  std::map<size_t, std::vector<void*>> free_blocks_;  // ordered: large requests take the best fit
  AllocatorStats stats_;
};

// Bump allocation from chunks, reset between denoising steps. Resetting while a block is still
// referenced is a bug in the caller and throws, so a temporary cannot be silently overwritten.
class StepArena {
 public:
  explicit StepArena(size_t chunk_bytes = size_t{64} << 20);
  ~StepArena();
  StepArena(const StepArena&) = delete;
  StepArena& operator=(const StepArena&) = delete;

  std::shared_ptr<void> allocate(size_t bytes);
  void reset();  // makes all chunks reusable; throws if any allocation is still alive
  size_t live_allocations() const;
  size_t capacity_bytes() const;

  // While alive, Tensor::empty on this thread allocates from `arena`.
  class Scope {
   public:
    explicit Scope(StepArena& arena);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    StepArena* previous_;
  };
  static StepArena* current();

 private:
  struct Chunk {
    std::shared_ptr<void> memory;
    size_t size = 0;
    size_t used = 0;
  };
  std::vector<Chunk> chunks_;
  size_t chunk_bytes_;
  std::shared_ptr<size_t> live_;  // shared with each block's deleter
};

// Allocates host memory from the active arena, else the caching allocator.
std::shared_ptr<void> allocate_host(size_t bytes);

}  // namespace xdit
