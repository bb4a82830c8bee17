#include "xdit/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>

#include "xdit/io/atomic_file.h"
#include "xdit/io/json_config.h"

namespace xdit {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace {

struct DTypeName {
  std::string_view name;
  DType dtype;
};
constexpr DTypeName kSupportedDTypes[] = {
    {"F32", DType::F32},         {"BF16", DType::BF16}, {"F16", DType::F16}, {"F8_E4M3", DType::F8E4M3},
    {"F8_E5M2", DType::F8E5M2}, {"I32", DType::I32},   {"I64", DType::I64},
};
// Valid safetensors dtypes that this engine does not compute with.
constexpr std::string_view kUnsupportedDTypes[] = {"F64", "I8",      "U8",      "I16",     "U16",
                                                   "U32", "U64",     "BOOL",    "F8_E8M0", "F4",
                                                   "F6_E2M3", "F6_E3M2", "C64"};

std::string supported_list() {
  std::string out;
  for (const auto& d : kSupportedDTypes) {
    if (!out.empty()) out += ", ";
    out += d.name;
  }
  return out;
}

uint64_t read_le64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

std::string offsets_str(uint64_t begin, uint64_t end) {
  return concat_message('[', begin, ", ", end, ']');
}

// A JSON value printed for a message, cut short.
std::string short_dump(const nlohmann::json& value) {
  const std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return text.size() <= 80 ? sanitize(text) : sanitize(text.substr(0, 80)) + "...";
}

// Reads one tensor entry of the header; `where` is "<label>: tensor \"name\"".
TensorInfo parse_tensor_entry(const std::string& name, const nlohmann::json& entry, const std::string& where,
                              uint64_t data_size) {
  if (!entry.is_object()) fail(where, ": entry must be an object, got ", describe_json(entry));
  for (const auto& item : entry.items()) {
    if (item.key() != "dtype" && item.key() != "shape" && item.key() != "data_offsets")
      fail(where, ": unexpected field ", quote(item.key()));
  }
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(field)) fail(where, ": missing field \"", field, "\"");
  }

  TensorInfo info;
  info.name = name;

  const nlohmann::json& dtype = entry["dtype"];
  if (!dtype.is_string()) fail(where, ": dtype must be a string, got ", describe_json(dtype));
  const auto& dtype_str = dtype.get_ref<const std::string&>();
  const auto supported = std::find_if(std::begin(kSupportedDTypes), std::end(kSupportedDTypes),
                                      [&](const DTypeName& d) { return d.name == dtype_str; });
  if (supported == std::end(kSupportedDTypes)) {
    if (std::find(std::begin(kUnsupportedDTypes), std::end(kUnsupportedDTypes), dtype_str) !=
        std::end(kUnsupportedDTypes))
      fail(where, ": dtype ", quote(dtype_str), " is not supported (supported: ", supported_list(), ")");
    fail(where, ": unknown dtype ", quote(dtype_str));
  }
  info.dtype = supported->dtype;

  const nlohmann::json& shape = entry["shape"];
  if (!shape.is_array()) fail(where, ": shape must be a list of sizes, got ", describe_json(shape));
  uint64_t numel = 1;
  bool overflow = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    const nlohmann::json& dim = shape[i];
    if (!dim.is_number_unsigned())
      fail(where, ": shape entry ", i, " must be a non-negative integer, got ", describe_json(dim));
    const uint64_t size = dim.get<uint64_t>();
    if (size > static_cast<uint64_t>(INT64_MAX)) fail(where, ": shape entry ", i, " is ", size, ", out of range");
    info.shape.push_back(static_cast<int64_t>(size));
    overflow = overflow || __builtin_mul_overflow(numel, size, &numel);
  }

  const nlohmann::json& offsets = entry["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned())
    fail(where, ": data_offsets must be [begin, end] byte offsets, got ", short_dump(offsets));
  info.begin = offsets[0].get<uint64_t>();
  info.end = offsets[1].get<uint64_t>();
  if (info.begin > info.end) fail(where, ": data_offsets ", offsets_str(info.begin, info.end), " have begin > end");
  if (info.end > data_size)
    fail(where, ": data_offsets ", offsets_str(info.begin, info.end), " run past the end of the data section (",
         data_size, " bytes)");

  // Element counts must fit int64 (Tensor sizes are int64) and byte counts uint64.
  uint64_t nbytes = 0;
  overflow = overflow || numel > static_cast<uint64_t>(INT64_MAX) ||
             __builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(info.dtype)), &nbytes);
  if (overflow) fail(where, ": shape ", shape_str(info.shape), " is too large to address");
  if (nbytes != info.nbytes())
    fail(where, ": shape ", shape_str(info.shape), " of ", dtype_str, " needs ", nbytes, " bytes but data_offsets ",
         offsets_str(info.begin, info.end), " hold ", info.nbytes());
  return info;
}

}  // namespace

std::string_view safetensors_dtype_name(DType dtype) {
  for (const auto& d : kSupportedDTypes)
    if (d.dtype == dtype) return d.name;
  fail("safetensors: no name for dtype ", static_cast<int>(dtype));
}

SafetensorsHeader parse_safetensors(std::span<const std::byte> file, std::string_view label) {
  const uint64_t size = file.size();
  if (size < 8) fail(label, ": file is ", size, " bytes, too short to hold the 8-byte header length");
  const uint64_t header_size = read_le64(file.data());
  if (header_size > kMaxSafetensorsHeaderBytes)
    fail(label, ": header length ", header_size, " exceeds the limit of ", kMaxSafetensorsHeaderBytes, " bytes");
  if (header_size > size - 8)
    fail(label, ": header length ", header_size, " runs past the end of the file (", size, " bytes)");
  if (header_size == 0) fail(label, ": header is empty");
  const std::string_view text(reinterpret_cast<const char*>(file.data() + 8), header_size);
  if (text[0] != '{')
    fail(label, ": header does not start with '{' (first byte ", sanitize(text.substr(0, 1)), ")");

  // The header starts with '{' and parse_json accepts only one value plus whitespace, so it is an object.
  const nlohmann::json header = parse_json(text, std::string(label) + " header");

  SafetensorsHeader out;
  out.data_start = 8 + header_size;
  const uint64_t data_size = size - out.data_start;
  for (const auto& item : header.items()) {
    const std::string& key = item.key();
    const nlohmann::json& value = item.value();
    if (key == "__metadata__") {
      if (!value.is_object()) fail(label, ": __metadata__ must be an object, got ", describe_json(value));
      for (const auto& meta : value.items()) {
        if (!meta.value().is_string())
          fail(label, ": __metadata__ entry ", quote(meta.key()), " must be a string, got ",
               describe_json(meta.value()));
        out.metadata.emplace(meta.key(), meta.value().get<std::string>());
      }
      continue;
    }
    out.tensors.push_back(
        parse_tensor_entry(key, value, concat_message(label, ": tensor ", quote(key)), data_size));
  }

  std::sort(out.tensors.begin(), out.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  // Sorted by begin, the tensors must tile the data section exactly.
  uint64_t covered = 0;
  const TensorInfo* previous = nullptr;
  for (const TensorInfo& t : out.tensors) {
    if (t.begin < covered)
      fail(label, ": tensors ", quote(previous->name), " and ", quote(t.name), " overlap (data_offsets ",
           offsets_str(previous->begin, previous->end), " and ", offsets_str(t.begin, t.end), ")");
    if (t.begin > covered)
      fail(label, ": hole in the data section: bytes [", covered, ", ", t.begin, ") before tensor ", quote(t.name),
           " belong to no tensor");
    covered = t.end;
    previous = &t;
  }
  if (covered != data_size)
    fail(label, ": the tensors end at data byte ", covered, " but the data section holds ", data_size, " bytes (",
         data_size - covered, " bytes belong to no tensor)");
  return out;
}

// ---- SafetensorsFile ----

SafetensorsFile::SafetensorsFile(std::span<const std::byte> bytes, std::shared_ptr<void> owner, std::string label)
    : bytes_(bytes), owner_(std::move(owner)), label_(std::move(label)), header_(parse_safetensors(bytes_, label_)) {
  names_.reserve(header_.tensors.size());
  for (size_t i = 0; i < header_.tensors.size(); ++i) {
    names_.push_back(header_.tensors[i].name);
    index_.emplace(header_.tensors[i].name, i);
  }
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  size_t size = 0;
  const int fd = open_regular_file(path, size);
  if (size == 0) {
    ::close(fd);
    return SafetensorsFile({}, nullptr, path);  // mmap cannot map zero bytes; the parser reports it
  }
  void* addr = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (addr == MAP_FAILED) fail("cannot map ", path, ": ", std::strerror(map_errno));
  std::shared_ptr<void> mapping(addr, [size](void* p) { ::munmap(p, size); });
  return SafetensorsFile({static_cast<const std::byte*>(addr), size}, std::move(mapping), path);
}

SafetensorsFile SafetensorsFile::from_buffer(std::span<const std::byte> bytes, std::shared_ptr<void> owner,
                                             std::string label) {
  return SafetensorsFile(bytes, std::move(owner), std::move(label));
}

bool SafetensorsFile::contains(std::string_view name) const { return index_.find(name) != index_.end(); }

const TensorInfo& SafetensorsFile::info(std::string_view name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) fail(label_, ": no tensor ", quote(name));
  return header_.tensors[it->second];
}

Tensor SafetensorsFile::tensor(std::string_view name) const {
  const TensorInfo& ti = info(name);
  const std::byte* data = bytes_.data() + header_.data_start + ti.begin;
  if (reinterpret_cast<uintptr_t>(data) % dtype_size(ti.dtype) != 0) {
    Tensor copy = Tensor::empty(ti.shape, ti.dtype);
    std::memcpy(copy.raw_data(), data, ti.nbytes());
    return copy;
  }
  // The mapping is read-only; Tensor has no const storage, so the constness is dropped here.
  Tensor view = Tensor::from_blob(const_cast<std::byte*>(data), ti.shape, ti.dtype, owner_);
  view.storage()->file_mapping = true;
  return view;
}

void drop_file_pages(const Tensor& view) {
  if (!view.defined() || !view.storage()->file_mapping) return;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(view.storage()->data);
  const uintptr_t end = begin + view.storage()->nbytes;
  // Only whole pages inside the view: the pages it shares with its neighbours stay.
  const uintptr_t first = (begin + page - 1) / page * page;
  const uintptr_t last = end / page * page;
  // MADV_DONTNEED on a private read-only file mapping only forgets the pages; they read back
  // from the file unchanged.
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

// ---- ShardedSafetensors ----

std::map<std::string, std::string, std::less<>> parse_weight_map(const JsonConfig& index) {
  const JsonConfig weight_map = index.get_object("weight_map");
  std::map<std::string, std::string, std::less<>> shard_for;
  for (const auto& item : weight_map.json().items()) {
    const std::string& name = item.key();
    if (!item.value().is_string())
      fail(index.label(), ": weight_map entry for tensor ", quote(name), " must be a shard file name, got ",
           describe_json(item.value()));
    const std::string& file = item.value().get_ref<const std::string&>();
    if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos)
      fail(index.label(), ": tensor ", quote(name), ": shard ", quote(file),
           " must be a file name in the index's folder");
    shard_for.emplace(name, file);
  }
  return shard_for;
}

ShardedSafetensors ShardedSafetensors::open(const std::string& index_path) {
  const auto shard_for = parse_weight_map(JsonConfig::load(index_path));  // tensor -> shard file name
  const std::filesystem::path dir = std::filesystem::path(index_path).parent_path();
  std::map<std::string, std::string> first_tensor_of;  // shard file name -> a tensor listed for it
  for (const auto& [name, file] : shard_for) first_tensor_of.emplace(file, name);

  ShardedSafetensors out;
  out.label_ = index_path;
  std::map<std::string, size_t> shard_index;
  for (const auto& [file, some_tensor] : first_tensor_of) {
    const std::filesystem::path path = dir / file;
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec))
      fail(index_path, ": shard ", quote(file), " (listed for tensor ", quote(some_tensor),
           ") does not exist: ", path.string());
    shard_index.emplace(file, out.shards_.size());
    out.shards_.push_back(SafetensorsFile::open(path.string()));
  }

  for (const auto& [name, file] : shard_for) {
    const SafetensorsFile& shard = out.shards_[shard_index.at(file)];
    if (!shard.contains(name))
      fail(index_path, ": tensor ", quote(name), " is listed in shard ", quote(file), " but ", shard.label(),
           " does not contain it");
  }
  for (const auto& [file, i] : shard_index) {
    for (const std::string& name : out.shards_[i].names()) {
      const auto it = shard_for.find(name);
      if (it == shard_for.end())
        fail(index_path, ": tensor ", quote(name), " in ", out.shards_[i].label(), " is not listed in the weight_map");
      if (it->second != file)
        fail(index_path, ": tensor ", quote(name), " appears in two shards: ", quote(it->second), " and ",
             quote(file));
      out.names_.push_back(name);
      out.shard_of_.emplace(name, i);
    }
  }
  return out;
}

bool ShardedSafetensors::contains(std::string_view name) const { return shard_of_.find(name) != shard_of_.end(); }

const TensorInfo& ShardedSafetensors::info(std::string_view name) const {
  const auto it = shard_of_.find(name);
  if (it == shard_of_.end()) fail(label_, ": no tensor ", quote(name));
  return shards_[it->second].info(name);
}

Tensor ShardedSafetensors::tensor(std::string_view name) const {
  const auto it = shard_of_.find(name);
  if (it == shard_of_.end()) fail(label_, ": no tensor ", quote(name));
  return shards_[it->second].tensor(name);
}

// ---- TensorMap ----

void TensorMap::add(std::string name, Tensor tensor) {
  XDIT_CHECK(tensor.defined(), label_, ": tensor ", quote(name), " is undefined");
  XDIT_CHECK(!contains(name), label_, ": duplicate tensor ", quote(name));
  TensorInfo info{name, tensor.dtype(), tensor.shape(), 0, tensor.nbytes()};
  names_.push_back(name);
  entries_.emplace(std::move(name), Entry{std::move(info), std::move(tensor)});
}

bool TensorMap::contains(std::string_view name) const { return entries_.find(name) != entries_.end(); }

const TensorInfo& TensorMap::info(std::string_view name) const {
  const auto it = entries_.find(name);
  if (it == entries_.end()) fail(label_, ": no tensor ", quote(name));
  return it->second.info;
}

Tensor TensorMap::tensor(std::string_view name) const {
  const auto it = entries_.find(name);
  if (it == entries_.end()) fail(label_, ": no tensor ", quote(name));
  return it->second.tensor;
}

// ---- writer ----

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string_view> seen;
  std::vector<Tensor> dense;
  dense.reserve(tensors.size());
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    XDIT_CHECK(name != "__metadata__", "cannot write ", path, ": \"__metadata__\" is not a valid tensor name");
    XDIT_CHECK(seen.insert(name).second, "cannot write ", path, ": duplicate tensor ", quote(name));
    XDIT_CHECK(tensor.defined(), "cannot write ", path, ": tensor ", quote(name), " is undefined");
    XDIT_CHECK(tensor.device().type == DeviceType::CPU, "cannot write ", path, ": tensor ", quote(name), " is on ",
               device_str(tensor.device()), ", not the CPU");
    dense.push_back(tensor.contiguous());
    const uint64_t nbytes = dense.back().nbytes();
    header[name] = {{"dtype", safetensors_dtype_name(tensor.dtype())},
                    {"shape", tensor.shape()},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }

  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::type_error&) {
    fail("cannot write ", path, ": a tensor name or metadata string is not valid UTF-8");
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // pad so the data section starts 8-byte aligned
  XDIT_CHECK(text.size() <= kMaxSafetensorsHeaderBytes, "cannot write ", path, ": header of ", text.size(),
             " bytes exceeds the safetensors limit");

  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(static_cast<uint64_t>(text.size()) >> (8 * i));
  AtomicFile out(path);
  out.write(length, sizeof length);
  out.write(text);
  for (const Tensor& t : dense) out.write(t.raw_data(), t.nbytes());
  out.commit();
}

}  // namespace xdit
