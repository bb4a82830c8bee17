// Scratch folders, small file helpers and running the xdit binary from tests.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace xdit::testing {

// A file's bytes, exactly ("" when it cannot be read); writing creates the parent folders.
std::string read_text(const std::filesystem::path& path);
void write_text(const std::filesystem::path& path, const std::string& text);

// The 8 little-endian bytes of n, as a safetensors file starts with its header length.
std::string le64(uint64_t n);

// A fresh, empty folder for one test under this process's scratch root (removed at exit).
std::filesystem::path scratch_folder(const std::string& name);

struct ProcessResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs build/bin/xdit with `arguments` (shell words), capturing stdout, stderr and the exit code.
ProcessResult run_xdit(const std::string& arguments);

// The CLI's failure contract: the exit code, exactly one stderr line "xdit: error: ...", naming
// `fragment`, and nothing on stdout.
void expect_one_error_line(const ProcessResult& result, int exit_code, const std::string& fragment);

}  // namespace xdit::testing
