#include <gtest/gtest.h>

#include <numeric>

#include "support/reference.h"
#include "xdit/core/allocator.h"
#include "xdit/core/tensor.h"

namespace xdit {
namespace {

Tensor iota(const Shape& shape, DType dtype = DType::F32) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  std::iota(v.begin(), v.end(), 0.0f);
  return Tensor::from_floats(v, shape, dtype);
}

// Value at a multi-index, computed from the shape alone, for an iota tensor.
double iota_at(const Shape& shape, const std::vector<int64_t>& index) {
  double flat = 0;
  for (size_t d = 0; d < shape.size(); ++d) flat = flat * static_cast<double>(shape[d]) + static_cast<double>(index[d]);
  return flat;
}

TEST(Tensor, EmptyIsContiguousWithRowMajorStrides) {
  Tensor t = Tensor::empty({2, 3, 4}, DType::BF16);
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 48u);
}

TEST(Tensor, PermuteIsAViewWithPermutedValues) {
  Tensor t = iota({2, 3, 4});
  Tensor p = t.permute({2, 0, 1});
  EXPECT_TRUE(p.shares_storage_with(t));
  EXPECT_FALSE(p.is_contiguous());
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  const std::vector<double> v = p.to_doubles();
  size_t i = 0;
  for (int64_t c = 0; c < 4; ++c)
    for (int64_t a = 0; a < 2; ++a)
      for (int64_t b = 0; b < 3; ++b) EXPECT_EQ(v[i++], iota_at({2, 3, 4}, {a, b, c}));
}

TEST(Tensor, ContiguousMaterialisesPermutedView) {
  Tensor t = iota({3, 5, 7});
  Tensor c = t.transpose(0, 2).contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_FALSE(c.shares_storage_with(t));
  EXPECT_EQ(c.to_doubles(), t.transpose(0, 2).to_doubles());
  Tensor same = t.contiguous();
  EXPECT_TRUE(same.shares_storage_with(t));
}

TEST(Tensor, NarrowSliceSelectChunkAreViews) {
  Tensor t = iota({4, 6});
  Tensor n = t.narrow(1, 2, 3);
  EXPECT_TRUE(n.shares_storage_with(t));
  EXPECT_EQ(n.to_doubles(), (std::vector<double>{2, 3, 4, 8, 9, 10, 14, 15, 16, 20, 21, 22}));
  Tensor s = t.slice(0, 1, 4, 2);
  EXPECT_EQ(s.shape(), (Shape{2, 6}));
  EXPECT_EQ(s.to_doubles()[0], 6);
  EXPECT_EQ(s.to_doubles()[6], 18);
  Tensor sel = t.select(1, -1);
  EXPECT_EQ(sel.to_doubles(), (std::vector<double>{5, 11, 17, 23}));
  auto parts = t.chunk(3, 1);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[2].to_doubles(), (std::vector<double>{4, 5, 10, 11, 16, 17, 22, 23}));
  auto uneven = t.split({1, 5}, 1);
  EXPECT_EQ(uneven[1].shape(), (Shape{4, 5}));
}

TEST(Tensor, ReshapeViewsWhenPossibleAndCopiesOtherwise) {
  Tensor t = iota({2, 3, 4});
  Tensor r = t.reshape({6, -1});
  EXPECT_TRUE(r.shares_storage_with(t));
  EXPECT_EQ(r.shape(), (Shape{6, 4}));
  // Splitting a dim of a narrowed view keeps it a view.
  Tensor split_view = t.narrow(2, 0, 2).reshape({2, 3, 2, 1});
  EXPECT_TRUE(split_view.shares_storage_with(t));
  // Merging transposed dims needs a copy.
  Tensor tt = t.transpose(1, 2);
  EXPECT_THROW(tt.view({2, 12}), Error);
  Tensor merged = tt.reshape({2, 12});
  EXPECT_FALSE(merged.shares_storage_with(t));
  EXPECT_EQ(merged.to_doubles(), tt.contiguous().to_doubles());
  EXPECT_THROW(t.reshape({5, -1}), Error);
  EXPECT_THROW(t.reshape({-1, -1}), Error);
}

TEST(Tensor, ViewAcrossSizeOneDims) {
  Tensor t = iota({1, 4, 1, 3});
  Tensor v = t.view({4, 3});
  EXPECT_EQ(v.strides(), (Shape{3, 1}));
  Tensor back = v.view({2, 1, 2, 3, 1});
  EXPECT_EQ(back.to_doubles(), t.to_doubles());
  Tensor u = t.unsqueeze(0).unsqueeze(-1);
  EXPECT_EQ(u.shape(), (Shape{1, 1, 4, 1, 3, 1}));
  EXPECT_EQ(u.squeeze(0).shape(), (Shape{1, 4, 1, 3, 1}));
  EXPECT_THROW(t.squeeze(1), Error);
  EXPECT_EQ(t.flatten(1, 3).shape(), (Shape{1, 12}));
}

TEST(Tensor, ExpandBroadcastsWithZeroStride) {
  Tensor t = iota({3, 1});
  Tensor e = t.expand({2, 3, 4});
  EXPECT_EQ(e.strides()[0], 0);
  EXPECT_EQ(e.strides()[2], 0);
  const std::vector<double> v = e.to_doubles();
  EXPECT_EQ(v.size(), 24u);
  EXPECT_EQ(v[4], 1);
  EXPECT_EQ(v[12 + 11], 2);
  EXPECT_THROW(t.expand({3, 2, 2}), Error);
}

TEST(Tensor, DtypeConversionRoundTripsThroughStridedViews) {
  Tensor t = testing::random_tensor({5, 7, 3}, DType::F32, 1);
  Tensor b = t.transpose(0, 1).to(DType::BF16);
  EXPECT_EQ(b.dtype(), DType::BF16);
  EXPECT_TRUE(b.is_contiguous());
  const std::vector<double> expect = t.transpose(0, 1).to_doubles();
  const std::vector<double> got = b.to_doubles();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], bf16_to_f32(f32_to_bf16(static_cast<float>(expect[i]))));
}

TEST(Tensor, CopyFromIntoStridedDestination) {
  Tensor dst = Tensor::zeros({4, 6}, DType::F32);
  Tensor src = iota({3, 4}, DType::BF16);
  dst.narrow(1, 1, 3).copy_from(src.transpose(0, 1));
  const std::vector<double> v = dst.to_doubles();
  EXPECT_EQ(v[0], 0);
  EXPECT_EQ(v[1], 0);   // src[0][0]
  EXPECT_EQ(v[2], 4);   // src[1][0]
  EXPECT_EQ(v[3], 8);   // src[2][0]
  EXPECT_EQ(v[7], 1);   // src[0][1]
  EXPECT_THROW(dst.copy_from(src), Error);
}

TEST(Tensor, BadArgumentsThrowNamedErrors) {
  Tensor t = iota({2, 3});
  EXPECT_THROW(t.size(2), Error);
  EXPECT_THROW(t.narrow(1, 2, 2), Error);
  EXPECT_THROW(t.permute({0, 0}), Error);
  EXPECT_THROW(t.chunk(2, 1), Error);
  EXPECT_THROW(t.split({1, 1}, 1), Error);
  EXPECT_THROW(Tensor::empty({-1, 2}, DType::F32), Error);
  EXPECT_THROW(Tensor::empty({int64_t{1} << 40, int64_t{1} << 40}, DType::F32), Error);
  EXPECT_THROW(Tensor::empty({0, int64_t{1} << 40, int64_t{1} << 40}, DType::F32), Error);
  EXPECT_THROW(Tensor::empty({2}, DType::F32, Device::cuda()), NotSupported);
  try {
    t.narrow(1, 2, 2);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 3]"), std::string::npos) << e.what();
  }
}

TEST(Tensor, BroadcastShapes) {
  EXPECT_EQ(broadcast_shapes({2, 1, 4}, {3, 1}), (Shape{2, 3, 4}));
  EXPECT_EQ(broadcast_shapes({}, {5}), (Shape{5}));
  EXPECT_THROW(broadcast_shapes({2, 3}, {4}), Error);
}

TEST(Tensor, FromBlobKeepsOwnerAlive) {
  auto buffer = std::make_shared<std::vector<float>>(std::vector<float>{1, 2, 3, 4});
  std::weak_ptr<std::vector<float>> watch = buffer;
  Tensor t = Tensor::from_blob(buffer->data(), {2, 2}, DType::F32, buffer);
  buffer.reset();
  EXPECT_FALSE(watch.expired());
  EXPECT_EQ(t.transpose(0, 1).to_doubles(), (std::vector<double>{1, 3, 2, 4}));
  t = Tensor();
  EXPECT_TRUE(watch.expired());
}

TEST(Allocator, CachingAllocatorReusesFreedBlocks) {
  CachingAllocator& alloc = CachingAllocator::instance();
  alloc.empty_cache();
  void* first;
  {
    auto block = alloc.allocate(3000);
    first = block.get();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % kHostAlignment, 0u);
  }
  const size_t hits_before = alloc.stats().cache_hits;
  auto again = alloc.allocate(4000);  // same 4096 size class
  EXPECT_EQ(again.get(), first);
  EXPECT_EQ(alloc.stats().cache_hits, hits_before + 1);
  EXPECT_EQ(CachingAllocator::round_size(1), kHostAlignment);
  EXPECT_EQ(CachingAllocator::round_size((size_t{3} << 20) + 1), size_t{4} << 20);
}

TEST(Allocator, LargeRequestsReuseBlocksUpToTwiceTheirSize) {
  CachingAllocator& alloc = CachingAllocator::instance();
  alloc.empty_cache();
  void* eight;
  {
    auto block = alloc.allocate(size_t{8} << 20);
    eight = block.get();
  }
  EXPECT_EQ(alloc.stats().bytes_cached, size_t{8} << 20);
  {
    auto ten = alloc.allocate(size_t{10} << 20);  // the cached 8 MiB block is too small
    EXPECT_NE(ten.get(), eight);
  }
  auto five = alloc.allocate(size_t{5} << 20);  // best fit: the 8 MiB block, not the 10 MiB one
  EXPECT_EQ(five.get(), eight);
  auto three = alloc.allocate(size_t{3} << 20);  // 10 MiB is more than twice 4 MiB: a new block
  EXPECT_EQ(alloc.stats().bytes_cached, size_t{10} << 20);
  auto small = alloc.allocate(100);  // small requests only reuse their own size class
  alloc.empty_cache();
  EXPECT_EQ(alloc.stats().bytes_cached, 0u);
}

TEST(Allocator, StepArenaServesTensorsInScopeAndRefusesResetWhileAlive) {
  StepArena arena(1 << 16);
  {
    StepArena::Scope scope(arena);
    Tensor a = Tensor::empty({100}, DType::F32);
    Tensor b = Tensor::empty({100}, DType::F32);
    EXPECT_EQ(arena.live_allocations(), 2u);
    EXPECT_NE(a.raw_data(), b.raw_data());
    EXPECT_THROW(arena.reset(), Error);
  }
  EXPECT_EQ(arena.live_allocations(), 0u);
  arena.reset();
  Tensor outside = Tensor::empty({10}, DType::F32);
  EXPECT_EQ(arena.live_allocations(), 0u);
  // Allocations larger than a chunk get their own chunk.
  StepArena::Scope scope(arena);
  Tensor big = Tensor::empty({1 << 16}, DType::F32);
  EXPECT_GE(arena.capacity_bytes(), size_t{1} << 18);
}

TEST(Allocator, ArenaBlocksOutliveTheArena) {
  Tensor survivor;
  {
    StepArena arena(1 << 12);
    StepArena::Scope scope(arena);
    survivor = Tensor::full({16}, 3.0f, DType::F32);
  }
  EXPECT_EQ(survivor.to_doubles()[15], 3.0);
}

}  // namespace
}  // namespace xdit
