// Output files are written to a temporary file in the target's directory, then renamed over the
// target, so a reader (or a crash) never sees a half-written image, video or tensor file.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace xdit {

class AtomicFile {
 public:
  explicit AtomicFile(std::string target);  // creates the temporary file; throws naming the target
  ~AtomicFile();                            // removes the temporary file unless committed
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t size);
  void write(std::string_view bytes) { write(bytes.data(), bytes.size()); }
  // Flushes to disk and renames over the target.
  void commit();

 private:
  std::string target_;
  std::string temp_path_;
  int fd_ = -1;
  bool committed_ = false;
};

void write_file_atomically(const std::string& path, std::string_view bytes);

}  // namespace xdit
