// Running a program from a test: one shell command line, its output (stdout and stderr together)
// and exit status, for the tests that run the CLI or a worker process.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace bsjit::testing {

struct CommandResult {
  int status = -1;  // the exit status; -1 when the command did not exit (a signal) or could not start
  std::string output;
};

// `env` (e.g. "BSJIT_STRICT_CACHE=1") is put before the command line.
inline CommandResult run_command(const std::string& command, const std::string& env = "") {
  CommandResult r;
  FILE* p = popen((env + " " + command + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  while (fgets(buf.data(), buf.size(), p)) r.output += buf.data();
  const int s = pclose(p);
  r.status = WIFEXITED(s) ? WEXITSTATUS(s) : -1;
  return r;
}

}  // namespace bsjit::testing
