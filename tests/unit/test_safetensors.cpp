// safetensors reader and writer: round trips in every dtype, zero-copy views that outlive the
// file object, the exact byte layout, atomic writes, sharded checkpoints and in-memory sources.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>

#include "support/files.h"
#include "support/reference.h"
#include "xdit/io/safetensors.h"

namespace fs = std::filesystem;
using namespace xdit;
namespace xt = xdit::testing;
using xt::error_of;
using xt::le64;
using xt::read_text;
using xt::write_text;

TEST(safetensors, RoundTripsEveryDTypeWithMetadata) {
  const fs::path dir = xt::scratch_folder("safetensors_RoundTripsEveryDTypeWithMetadata");
  std::vector<std::pair<std::string, Tensor>> tensors;
  const DType dtypes[] = {DType::F32, DType::BF16, DType::F16, DType::F8E4M3, DType::F8E5M2, DType::I32, DType::I64};
  for (size_t i = 0; i < std::size(dtypes); ++i) {
    const DType d = dtypes[i];
    Tensor t = is_floating(d) ? xt::random_tensor({3, 5}, d, 100 + i)
                              : Tensor::from_ints(std::vector<int64_t>{1, -2, 3, 40000, -5, 6}, {2, 3}, d);
    tensors.emplace_back("t_" + std::string(dtype_name(d)), t);
  }
  const std::string path = (dir / "all.safetensors").string();
  write_safetensors(path, tensors, {{"format", "pt"}, {"note", "x"}});

  const SafetensorsFile file = SafetensorsFile::open(path);
  ASSERT_EQ(file.names().size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, expected] = tensors[i];
    EXPECT_EQ(file.names()[i], name) << "names() follows the order the data was written in";
    ASSERT_TRUE(file.contains(name));
    const TensorInfo& info = file.info(name);
    EXPECT_EQ(info.dtype, expected.dtype());
    EXPECT_EQ(info.shape, expected.shape());
    EXPECT_EQ(info.nbytes(), expected.nbytes());
    const Tensor got = file.tensor(name);
    EXPECT_EQ(got.dtype(), expected.dtype());
    EXPECT_EQ(got.shape(), expected.shape());
    EXPECT_EQ(0, std::memcmp(got.raw_data(), expected.raw_data(), expected.nbytes())) << name;
  }
  EXPECT_FALSE(file.contains("t_"));
  EXPECT_EQ(file.metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"note", "x"}}));
}

TEST(safetensors, ExactLayoutMatchesTheReferenceWriter) {
  // The bytes the Python safetensors package writes for {"a": torch.tensor([1.0])}.
  const fs::path dir = xt::scratch_folder("safetensors_ExactLayoutMatchesTheReferenceWriter");
  const std::string path = (dir / "a.safetensors").string();
  write_safetensors(path, {{"a", Tensor::from_floats(std::vector<float>{1.0f}, {1})}});
  const std::string json = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  const std::string padded = json + std::string((8 - json.size() % 8) % 8, ' ');
  const float one = 1.0f;
  const std::string expected = le64(padded.size()) + padded + std::string(reinterpret_cast<const char*>(&one), 4);
  EXPECT_EQ(read_text(path), expected);
}

TEST(safetensors, HeaderIsPaddedToEightBytes) {
  const fs::path dir = xt::scratch_folder("safetensors_HeaderIsPaddedToEightBytes");
  for (const std::string name : {"a", "ab", "abc", "abcd", "abcde", "abcdef", "abcdefg", "abcdefgh"}) {
    const std::string path = (dir / (name + ".safetensors")).string();
    write_safetensors(path, {{name, Tensor::zeros({2}, DType::BF16)}}, {{"k", name}});
    const std::string bytes = read_text(path);
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    EXPECT_EQ(n % 8, 0u) << name;
    EXPECT_EQ(SafetensorsFile::open(path).data_start() % 8, 0u);
  }
}

TEST(safetensors, TensorsAreZeroCopyAndOutliveTheFile) {
  const fs::path dir = xt::scratch_folder("safetensors_TensorsAreZeroCopyAndOutliveTheFile");
  const std::string path = (dir / "w.safetensors").string();
  const Tensor w = xt::random_tensor({4, 8}, DType::F32, 7);
  write_safetensors(path, {{"w", w}});
  Tensor view;
  {
    const SafetensorsFile file = SafetensorsFile::open(path);
    view = file.tensor("w");
    const Tensor again = file.tensor("w");
    EXPECT_EQ(view.raw_data(), again.raw_data()) << "both views point into the one mapping";
  }
  EXPECT_EQ(view.to_floats(), w.to_floats()) << "the mapping stays alive while a view exists";
}

// Resident bytes of this process, from /proc/self/statm.
int64_t resident_bytes() {
  const std::string statm = xt::read_text("/proc/self/statm");
  const int64_t pages = std::stoll(statm.substr(statm.find(' ') + 1));
  return pages * ::sysconf(_SC_PAGESIZE);
}

TEST(safetensors, DroppedPagesLeaveMemoryAndReadBackUnchanged) {
  const fs::path dir = xt::scratch_folder("safetensors_DroppedPages");
  const std::string path = (dir / "w.safetensors").string();
  const Tensor w = xt::random_tensor({1024, 8192}, DType::F32, 11);  // 32 MiB
  write_safetensors(path, {{"w", w}});
  const SafetensorsFile file = SafetensorsFile::open(path);
  const Tensor view = file.tensor("w");
  const std::vector<float> expected = w.to_floats();
  EXPECT_EQ(view.to_floats(), expected);  // touches every page of the view
  const int64_t touched = resident_bytes();
  drop_file_pages(view);
  const int64_t dropped = resident_bytes();
  EXPECT_GT(touched - dropped, int64_t{24} << 20) << "the view's pages should leave the resident set";
  EXPECT_EQ(view.to_floats(), expected) << "dropped pages read back from the file";

  const Tensor owned = w.contiguous();
  drop_file_pages(owned);  // not a file view: nothing happens
  EXPECT_EQ(owned.to_floats(), expected);
}

TEST(safetensors, WritesNonContiguousTensorsContiguously) {
  const fs::path dir = xt::scratch_folder("safetensors_WritesNonContiguousTensorsContiguously");
  const Tensor dense = xt::random_tensor({3, 4}, DType::BF16, 3);
  const Tensor transposed = xt::transposed_storage(dense);
  ASSERT_FALSE(transposed.is_contiguous());
  const std::string path = (dir / "t.safetensors").string();
  write_safetensors(path, {{"t", transposed}, {"d", xt::padded_rows(dense)}});
  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_EQ(xt::values(file.tensor("t")), xt::values(dense));
  EXPECT_EQ(xt::values(file.tensor("d")), xt::values(dense));
}

TEST(safetensors, ScalarsAndEmptyTensors) {
  const fs::path dir = xt::scratch_folder("safetensors_ScalarsAndEmptyTensors");
  const std::string path = (dir / "s.safetensors").string();
  write_safetensors(path, {{"empty", Tensor::zeros({0, 4}, DType::F32)},
                           {"scalar", Tensor::full({}, 2.5f, DType::F32)},
                           {"tail", Tensor::zeros({0}, DType::I64)}});
  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_EQ(file.tensor("empty").shape(), (Shape{0, 4}));
  EXPECT_EQ(file.tensor("scalar").to_floats(), std::vector<float>{2.5f});
  EXPECT_EQ(file.tensor("tail").numel(), 0);
}

TEST(safetensors, EmptyFileWithNoTensors) {
  const fs::path dir = xt::scratch_folder("safetensors_EmptyFileWithNoTensors");
  const std::string path = (dir / "none.safetensors").string();
  write_safetensors(path, {});
  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_TRUE(file.names().empty());
  EXPECT_EQ(read_text(path), le64(8) + "{}      ");
}

TEST(safetensors, UnalignedDataIsCopiedToAlignedMemory) {
  // A header length that is not a multiple of 8 (older writers) puts f32 data at an odd address.
  const fs::path dir = xt::scratch_folder("safetensors_UnalignedDataIsCopiedToAlignedMemory");
  const std::string header = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  ASSERT_NE((8 + header.size()) % 4, 0u);
  const float values[2] = {1.5f, -2.0f};
  const std::string path = (dir / "odd.safetensors").string();
  write_text(path, le64(header.size()) + header + std::string(reinterpret_cast<const char*>(values), 8));
  const Tensor x = SafetensorsFile::open(path).tensor("x");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(x.raw_data()) % 4, 0u);
  EXPECT_EQ(x.to_floats(), (std::vector<float>{1.5f, -2.0f}));
}

TEST(safetensors, AcceptsHeadersFromOtherWriters) {
  // Keys in any order, whitespace inside the JSON, tensors listed out of data order.
  const std::string header =
      "{ \"b\" : {\"shape\": [1], \"data_offsets\": [4, 8], \"dtype\": \"I32\"},\n"
      "  \"__metadata__\": {\"format\": \"pt\"},\n  \"a\": {\"dtype\": \"I32\", \"shape\": [], \"data_offsets\": [0, 4]} }";
  const int32_t data[2] = {11, 22};
  const std::string bytes = le64(header.size()) + header + std::string(reinterpret_cast<const char*>(data), 8);
  const SafetensorsFile file = SafetensorsFile::from_buffer(
      {reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()}, nullptr, "memory");
  EXPECT_EQ(file.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(file.tensor("a").to_doubles(), std::vector<double>{11});
  EXPECT_EQ(file.tensor("b").to_doubles(), std::vector<double>{22});
  EXPECT_EQ(file.metadata().at("format"), "pt");
}

TEST(safetensors, ParseWorksOnBytesInMemory) {
  const std::string header = R"({"a":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]}})";
  const std::string bytes = le64(header.size()) + header + std::string(8, '\0');
  const SafetensorsHeader h =
      parse_safetensors({reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()}, "mem");
  ASSERT_EQ(h.tensors.size(), 1u);
  EXPECT_EQ(h.data_start, 8 + header.size());
  EXPECT_EQ(h.tensors[0].dtype, DType::BF16);
  EXPECT_EQ(h.tensors[0].shape, (Shape{2, 2}));
  EXPECT_EQ(h.tensors[0].end, 8u);
}

TEST(safetensors, LookupErrorsNameFileAndTensor) {
  const fs::path dir = xt::scratch_folder("safetensors_LookupErrorsNameFileAndTensor");
  const std::string path = (dir / "x.safetensors").string();
  write_safetensors(path, {{"a", Tensor::zeros({1}, DType::F32)}});
  const SafetensorsFile file = SafetensorsFile::open(path);
  const std::string msg = error_of([&] { file.tensor("nope"); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"nope\""), std::string::npos) << msg;
  const std::string missing = (dir / "missing.safetensors").string();
  EXPECT_NE(error_of([&] { SafetensorsFile::open(missing); }).find("missing.safetensors"), std::string::npos);
  EXPECT_NE(error_of([&] { SafetensorsFile::open(dir.string()); }).find("not a regular file"),
            std::string::npos);
}

TEST(safetensors, WriteIsAtomicAndLeavesNoTemporaryFiles) {
  const fs::path dir = xt::scratch_folder("safetensors_WriteIsAtomicAndLeavesNoTemporaryFiles");
  const std::string path = (dir / "w.safetensors").string();
  write_safetensors(path, {{"a", Tensor::full({4}, 1.0f, DType::F32)}});
  write_safetensors(path, {{"b", Tensor::full({2}, 2.0f, DType::F32)}});  // replaces the file
  EXPECT_EQ(SafetensorsFile::open(path).names(), std::vector<std::string>{"b"});
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);

  // A failing write (duplicate name) leaves the existing file untouched and no temporary behind.
  const std::string before = read_text(path);
  EXPECT_THROW(write_safetensors(path, {{"c", Tensor::zeros({1}, DType::F32)}, {"c", Tensor::zeros({1}, DType::F32)}}),
               Error);
  EXPECT_EQ(read_text(path), before);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);

  EXPECT_THROW(write_safetensors((dir / "no/such/dir/x.safetensors").string(), {}), Error);
  EXPECT_THROW(write_safetensors(path, {{"__metadata__", Tensor::zeros({1}, DType::F32)}}), Error);
  EXPECT_THROW(write_safetensors(path, {{"u", Tensor()}}), Error);
}

TEST(safetensors, ShardedCheckpoint) {
  const fs::path dir = xt::scratch_folder("safetensors_ShardedCheckpoint");
  const Tensor a = xt::random_tensor({2, 3}, DType::BF16, 1);
  const Tensor b = xt::random_tensor({4}, DType::F32, 2);
  const Tensor c = xt::random_tensor({5}, DType::F16, 3);
  write_safetensors((dir / "model-00001-of-00002.safetensors").string(), {{"a", a}, {"b", b}});
  write_safetensors((dir / "model-00002-of-00002.safetensors").string(), {{"c", c}});
  write_text((dir / "model.safetensors.index.json").string(),
              R"({"metadata": {"total_size": 34}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                  "b": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"}})");
  const ShardedSafetensors sharded = ShardedSafetensors::open((dir / "model.safetensors.index.json").string());
  EXPECT_EQ(sharded.shards().size(), 2u);
  EXPECT_EQ(sharded.names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_TRUE(sharded.contains("c"));
  EXPECT_FALSE(sharded.contains("d"));
  EXPECT_EQ(sharded.info("c").dtype, DType::F16);
  EXPECT_EQ(xt::values(sharded.tensor("a")), xt::values(a));
  EXPECT_EQ(xt::values(sharded.tensor("c")), xt::values(c));

  const TensorSource& source = sharded;  // the common interface
  EXPECT_EQ(source.tensor("b").to_floats(), b.to_floats());
  EXPECT_NE(error_of([&] { source.info("d"); }).find("model.safetensors.index.json"), std::string::npos);
}

TEST(safetensors, TensorMapSource) {
  TensorMap map("random weights");
  const Tensor w = Tensor::full({2, 2}, 3.0f, DType::BF16);
  map.add("w", w);
  map.add("b", Tensor::zeros({2}, DType::F32));
  EXPECT_EQ(map.names(), (std::vector<std::string>{"w", "b"}));
  EXPECT_TRUE(map.tensor("w").shares_storage_with(w));
  EXPECT_EQ(map.info("w").nbytes(), 8u);
  EXPECT_THROW(map.add("w", w), Error);
  EXPECT_NE(error_of([&] { map.tensor("x"); }).find("random weights"), std::string::npos);
}

TEST(safetensors, DTypeNames) {
  EXPECT_EQ(safetensors_dtype_name(DType::F8E4M3), "F8_E4M3");
  EXPECT_EQ(safetensors_dtype_name(DType::BF16), "BF16");
  EXPECT_EQ(safetensors_dtype_name(DType::I64), "I64");
}
