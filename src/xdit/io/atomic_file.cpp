#include "xdit/io/atomic_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <utility>

#include "xdit/core/error.h"

namespace xdit {

AtomicFile::AtomicFile(std::string target) : target_(std::move(target)) {
  const std::filesystem::path p(target_);
  const std::filesystem::path dir = p.parent_path().empty() ? std::filesystem::path(".") : p.parent_path();
  temp_path_ = (dir / concat_message('.', p.filename().string(), ".tmp-XXXXXX")).string();
  fd_ = ::mkstemp(temp_path_.data());
  if (fd_ < 0) {
    fail("cannot write ", target_, ": cannot create a temporary file in ", dir.string(), ": ", std::strerror(errno));
  }
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_path_.c_str());
}

void AtomicFile::write(const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t done = ::write(fd_, p, size);
    if (done < 0 && errno == EINTR) continue;
    if (done <= 0) fail("cannot write ", target_, ": ", std::strerror(errno));
    p += done;
    size -= static_cast<size_t>(done);
  }
}

void AtomicFile::commit() {
  if (::fchmod(fd_, 0644) != 0 || ::fsync(fd_) != 0) fail("cannot write ", target_, ": ", std::strerror(errno));
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) fail("cannot write ", target_, ": ", std::strerror(errno));
  if (::rename(temp_path_.c_str(), target_.c_str()) != 0) {
    fail("cannot write ", target_, ": rename failed: ", std::strerror(errno));
  }
  committed_ = true;
}

void write_file_atomically(const std::string& path, std::string_view bytes) {
  AtomicFile file(path);
  file.write(bytes);
  file.commit();
}

}  // namespace xdit
