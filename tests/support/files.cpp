#include "support/files.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace xdit::testing {

namespace fs = std::filesystem;

namespace {

fs::path scratch_root() { return fs::path(::testing::TempDir()) / ("xdit_test_" + std::to_string(getpid())); }

class ScratchCleanup : public ::testing::Environment {
 public:
  void TearDown() override { fs::remove_all(scratch_root()); }
};
::testing::Environment* const kScratchCleanup = ::testing::AddGlobalTestEnvironment(new ScratchCleanup);

}  // namespace

std::string read_text(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

void write_text(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

std::string le64(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out;
}

fs::path scratch_folder(const std::string& name) {
  const fs::path folder = scratch_root() / name;
  fs::remove_all(folder);
  fs::create_directories(folder);
  return folder;
}

ProcessResult run_xdit(const std::string& arguments) {
  const fs::path folder = scratch_folder("xdit_process");
  const fs::path out = folder / "stdout.txt";
  const fs::path err = folder / "stderr.txt";
  const std::string command = std::string(XDIT_BINARY_DIR) + "/bin/xdit " + arguments + " >" + out.string() +
                              " 2>" + err.string();
  const int status = std::system(command.c_str());
  ProcessResult result;
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  result.out = read_text(out);
  result.err = read_text(err);
  return result;
}

void expect_one_error_line(const ProcessResult& result, int exit_code, const std::string& fragment) {
  EXPECT_EQ(result.exit_code, exit_code);
  EXPECT_TRUE(result.err.starts_with("xdit: error: ")) << result.err;
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
  EXPECT_NE(result.err.find(fragment), std::string::npos) << "stderr lacks \"" << fragment << "\": " << result.err;
  EXPECT_TRUE(result.out.empty()) << result.out;
}

}  // namespace xdit::testing
