// libFuzzer harness: arbitrary bytes as a safetensors file. A malformed file must give a one-line
// xdit::Error; anything else (a crash, a sanitizer report, another exception) is a bug.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "xdit/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const xdit::SafetensorsFile file = xdit::SafetensorsFile::from_buffer(
        {reinterpret_cast<const std::byte*>(data), size}, nullptr, "fuzz.safetensors");
    // Read every byte of every tensor so ASan sees any view that reaches outside the input.
    unsigned checksum = 0;
    for (const std::string& name : file.names()) {
      const xdit::Tensor t = file.tensor(name);
      const auto* bytes = static_cast<const unsigned char*>(t.raw_data());
      for (size_t i = 0; i < t.nbytes(); ++i) checksum += bytes[i];
      if (file.info(name).nbytes() != t.nbytes()) std::abort();
    }
    for (const auto& [key, value] : file.metadata()) checksum += static_cast<unsigned>(key.size() + value.size());
    volatile unsigned sink = checksum;
    (void)sink;
  } catch (const xdit::Error& e) {
    if (std::string_view(e.what()).find('\n') != std::string_view::npos) std::abort();
  }
  return 0;
}
