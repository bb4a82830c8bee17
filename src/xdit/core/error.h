// Errors are exceptions carrying context; the CLI turns them into one readable line.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace xdit {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// A known feature that is not built yet: the CLI reports it as "not supported yet".
class NotSupported : public Error {
 public:
  explicit NotSupported(const std::string& message) : Error(message + ": not supported yet") {}
};

template <typename... Parts>
std::string concat_message(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}

template <typename... Parts>
[[noreturn]] void fail(Parts&&... parts) {
  throw Error(concat_message(std::forward<Parts>(parts)...));
}

}  // namespace xdit

// XDIT_CHECK(cond, "tensor ", name, " has ", n, " dims") throws xdit::Error when cond is false.
#define XDIT_CHECK(cond, ...)                  \
  do {                                         \
    if (!(cond)) ::xdit::fail(__VA_ARGS__);    \
  } while (false)
