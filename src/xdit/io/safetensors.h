// safetensors files: a validating reader (mmap, zero-copy tensors), sharded checkpoints
// (*.safetensors.index.json) and an atomic writer.
//
// Layout: 8-byte little-endian header length N, N bytes of JSON header
//   {"__metadata__": {"k": "v"}, "name": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]}, ...}
// padded with spaces, then the data section. Offsets are relative to the data section; sorted by
// begin, the tensors must tile it exactly (no overlap, no hole, nothing after the last tensor).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "xdit/core/dtype.h"
#include "xdit/core/tensor.h"

namespace xdit {

class JsonConfig;

inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  // Byte range in the data section of the file that holds the tensor ([0, nbytes) for in-memory sources).
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t nbytes() const { return end - begin; }
};

// Anything that hands out named tensors: one safetensors file, a sharded checkpoint, or tensors
// held in memory. Loaders take a TensorSource and do not care which.
class TensorSource {
 public:
  virtual ~TensorSource() = default;
  virtual const std::string& label() const = 0;                // the path, for messages
  virtual const std::vector<std::string>& names() const = 0;  // in file order
  virtual bool contains(std::string_view name) const = 0;
  virtual const TensorInfo& info(std::string_view name) const = 0;  // throws naming the tensor
  virtual Tensor tensor(std::string_view name) const = 0;           // throws naming the tensor
};

// The validated header of a safetensors file.
struct SafetensorsHeader {
  uint64_t data_start = 0;               // 8 + N: where the data section begins in the file
  std::vector<TensorInfo> tensors;       // in data order (by begin offset, ties by name)
  std::map<std::string, std::string> metadata;
};

// Validates a whole safetensors file held in memory. Throws xdit::Error (one line, naming `label`
// and, where relevant, the tensor and the offending value) on any malformed input; the only other
// exception it can throw is std::bad_alloc.
SafetensorsHeader parse_safetensors(std::span<const std::byte> file, std::string_view label);

// safetensors dtype names ("BF16", "F8_E4M3", ...).
std::string_view safetensors_dtype_name(DType dtype);

class SafetensorsFile final : public TensorSource {
 public:
  // Maps the file read-only. Tensors handed out keep the mapping alive, so they may outlive this
  // object. They point into read-only memory: never write through them.
  static SafetensorsFile open(const std::string& path);
  // Parses bytes already in memory; `owner` keeps them alive for the tensors handed out.
  static SafetensorsFile from_buffer(std::span<const std::byte> bytes, std::shared_ptr<void> owner,
                                     std::string label);

  const std::string& label() const override { return label_; }
  const std::vector<std::string>& names() const override { return names_; }
  bool contains(std::string_view name) const override;
  const TensorInfo& info(std::string_view name) const override;
  // A zero-copy view of the file. A tensor whose data is not aligned to its element size (files
  // whose header length is not a multiple of 8) is returned as an aligned copy instead.
  Tensor tensor(std::string_view name) const override;

  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  uint64_t data_start() const { return header_.data_start; }
  size_t file_size() const { return bytes_.size(); }

 private:
  SafetensorsFile(std::span<const std::byte> bytes, std::shared_ptr<void> owner, std::string label);

  std::span<const std::byte> bytes_;
  std::shared_ptr<void> owner_;
  std::string label_;
  SafetensorsHeader header_;
  std::vector<std::string> names_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in header_.tensors
};

// The weight_map of a sharded index: tensor name -> shard file name (a plain file name in the
// index's folder). Throws naming the index and the entry.
std::map<std::string, std::string, std::less<>> parse_weight_map(const JsonConfig& index);

// A checkpoint split over several files, described by an index
//   {"metadata": {...}, "weight_map": {"tensor name": "shard file name", ...}}
// Each shard is opened once. Every listed tensor must be in its shard, and every tensor of a shard
// must be listed for that shard (so no tensor is in two shards).
class ShardedSafetensors final : public TensorSource {
 public:
  static ShardedSafetensors open(const std::string& index_path);

  const std::string& label() const override { return label_; }
  const std::vector<std::string>& names() const override { return names_; }  // shard by shard
  bool contains(std::string_view name) const override;
  const TensorInfo& info(std::string_view name) const override;
  Tensor tensor(std::string_view name) const override;

  const std::vector<SafetensorsFile>& shards() const { return shards_; }

 private:
  std::string label_;
  std::vector<SafetensorsFile> shards_;  // sorted by file name
  std::vector<std::string> names_;
  std::map<std::string, size_t, std::less<>> shard_of_;
};

// Tensors held in memory (random weights for benchmarks, converted weights, tests).
class TensorMap final : public TensorSource {
 public:
  explicit TensorMap(std::string label = "tensors in memory") : label_(std::move(label)) {}
  void add(std::string name, Tensor tensor);  // throws on a duplicate name

  const std::string& label() const override { return label_; }
  const std::vector<std::string>& names() const override { return names_; }  // in order added
  bool contains(std::string_view name) const override;
  const TensorInfo& info(std::string_view name) const override;
  Tensor tensor(std::string_view name) const override;

 private:
  struct Entry {
    TensorInfo info;
    Tensor tensor;
  };
  std::string label_;
  std::vector<std::string> names_;
  std::map<std::string, Entry, std::less<>> entries_;
};

// After a weight was converted or quantized from a checkpoint view, drops the pages of that view
// from the process's memory, so the copy does not double the resident weights. A later read of
// the view maps the pages in again. Does nothing for tensors that are not views of a mapped file.
void drop_file_pages(const Tensor& view);

// Writes tensors in the given order (header and data alike) with optional metadata. Writes a
// temporary file in the same directory and renames it over `path`, so `path` is never left
// half-written. Tensors may be non-contiguous views; they must be CPU tensors.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace xdit
