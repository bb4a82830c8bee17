// The xdit command line: parse, run, report. Every failure is one line on stderr and an exit code
// from exit_code_for (docs/cli.md lists them).
#include <exception>
#include <iostream>
#include <string>

#include "xdit/runtime/model_info.h"
#include "xdit/runtime/pipeline_registry.h"
#include "xdit/runtime/run_options.h"

namespace {

int report(const std::string& message, int exit_code) {
  std::string line = message;
  for (char& c : line) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  std::cerr << "xdit: error: " << line << std::endl;
  return exit_code;
}

int run(int argc, char** argv) {
  const xdit::CliCommand command = xdit::parse_command_line(argc, argv);
  switch (command.kind) {
    case xdit::CliCommand::Kind::Help:
    case xdit::CliCommand::Kind::Version:
      std::cout << command.text;
      break;
    case xdit::CliCommand::Kind::Info:
      xdit::print_model_info(command.info_path, std::cout);
      break;
    case xdit::CliCommand::Kind::Generate:
      xdit::run_generation(command.options);
      break;
  }
  return xdit::kExitSuccess;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    return report(e.what(), xdit::exit_code_for(e));
  } catch (...) {
    return report("unknown failure", xdit::kExitRuntimeError);
  }
}
