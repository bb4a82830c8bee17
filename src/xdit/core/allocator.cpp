#include "xdit/core/allocator.h"

#include <sys/mman.h>

#include <bit>
#include <cstdlib>

#include "xdit/core/error.h"

namespace xdit {

namespace {

// Cached blocks beyond this total are freed rather than kept.
constexpr size_t kMaxCachedBytes = size_t{4} << 30;
constexpr size_t kLargeBlock = size_t{1} << 20;
constexpr size_t kLargeGranularity = size_t{2} << 20;

thread_local StepArena* current_arena = nullptr;

// Large blocks are mapped directly, so empty_cache() gives them back to the system: glibc keeps
// freed heap blocks below its dynamic mmap threshold (up to 32 MiB), and the activations of one
// stage would otherwise stay resident through the next.
void* aligned_host_alloc(size_t rounded) {
  if (rounded >= kLargeBlock) {
    void* p = ::mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) fail("out of host memory allocating ", rounded, " bytes");
    return p;
  }
  void* p = std::aligned_alloc(kHostAlignment, rounded);
  if (p == nullptr) fail("out of host memory allocating ", rounded, " bytes");
  return p;
}

void free_host(void* p, size_t rounded) {
  if (rounded >= kLargeBlock) {
    ::munmap(p, rounded);
  } else {
    std::free(p);
  }
}

}  // namespace

CachingAllocator& CachingAllocator::instance() {
  static CachingAllocator allocator;
  return allocator;
}

CachingAllocator::~CachingAllocator() { empty_cache(); }

size_t CachingAllocator::round_size(size_t bytes) {
  if (bytes <= kHostAlignment) return kHostAlignment;
  if (bytes < kLargeBlock) return std::bit_ceil(bytes);  // power-of-two classes for small blocks
  return (bytes + kLargeGranularity - 1) / kLargeGranularity * kLargeGranularity;
}

std::shared_ptr<void> CachingAllocator::allocate(size_t bytes) {
  const size_t rounded = round_size(bytes);
  size_t block = rounded;
  void* ptr = nullptr;
  {
    std::lock_guard lock(mutex_);
    ++stats_.allocations;
    // A large request may take a cached block of up to twice its size: a stage's activations
    // come in many sizes, and reusing only exact sizes would keep a block of every one of them.
    const auto it = free_blocks_.lower_bound(rounded);
    if (it != free_blocks_.end() && (it->first == rounded || (rounded >= kLargeBlock && it->first <= 2 * rounded))) {
      block = it->first;
      ptr = it->second.back();
      it->second.pop_back();
      if (it->second.empty()) free_blocks_.erase(it);
      stats_.bytes_cached -= block;
      ++stats_.cache_hits;
    }
    stats_.bytes_in_use += block;
    stats_.peak_bytes_in_use = std::max(stats_.peak_bytes_in_use, stats_.bytes_in_use);
  }
  if (ptr == nullptr) {
    try {
      ptr = aligned_host_alloc(block);
    } catch (...) {
      std::lock_guard lock(mutex_);
      stats_.bytes_in_use -= block;
      throw;
    }
  }
  return std::shared_ptr<void>(ptr, [this, block](void* p) { release(p, block); });
}

void CachingAllocator::release(void* ptr, size_t rounded) {
  std::lock_guard lock(mutex_);
  stats_.bytes_in_use -= rounded;
  if (stats_.bytes_cached + rounded > kMaxCachedBytes) {
    free_host(ptr, rounded);
    return;
  }
  free_blocks_[rounded].push_back(ptr);
  stats_.bytes_cached += rounded;
}

void CachingAllocator::empty_cache() {
  std::lock_guard lock(mutex_);
  for (auto& [size, blocks] : free_blocks_) {
    for (void* p : blocks) free_host(p, size);
  }
  free_blocks_.clear();
  stats_.bytes_cached = 0;
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

StepArena::StepArena(size_t chunk_bytes) : chunk_bytes_(chunk_bytes), live_(std::make_shared<size_t>(0)) {
  XDIT_CHECK(chunk_bytes > 0, "StepArena chunk size must be positive");
}

StepArena::~StepArena() = default;

std::shared_ptr<void> StepArena::allocate(size_t bytes) {
  const size_t aligned = (std::max<size_t>(bytes, 1) + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
  Chunk* target = nullptr;
  for (Chunk& chunk : chunks_) {
    if (chunk.size - chunk.used >= aligned) {
      target = &chunk;
      break;
    }
  }
  if (target == nullptr) {
    const size_t size = std::max(aligned, chunk_bytes_);
    chunks_.push_back({CachingAllocator::instance().allocate(size), size, 0});
    target = &chunks_.back();
  }
  void* ptr = static_cast<char*>(target->memory.get()) + target->used;
  target->used += aligned;
  ++*live_;
  // The block keeps its chunk alive (so it survives the arena) and counts itself as live.
  auto keep = std::make_pair(target->memory, live_);
  return std::shared_ptr<void>(ptr, [keep](void*) { --*keep.second; });
}

void StepArena::reset() {
  XDIT_CHECK(*live_ == 0, "StepArena reset while ", *live_, " temporaries are still referenced");
  for (Chunk& chunk : chunks_) chunk.used = 0;
}

size_t StepArena::live_allocations() const { return *live_; }

size_t StepArena::capacity_bytes() const {
  size_t total = 0;
  for (const Chunk& chunk : chunks_) total += chunk.size;
  return total;
}

StepArena::Scope::Scope(StepArena& arena) : previous_(current_arena) { current_arena = &arena; }
StepArena::Scope::~Scope() { current_arena = previous_; }
StepArena* StepArena::current() { return current_arena; }

std::shared_ptr<void> allocate_host(size_t bytes) {
  if (StepArena* arena = StepArena::current()) return arena->allocate(bytes);
  return CachingAllocator::instance().allocate(bytes);
}

}  // namespace xdit
