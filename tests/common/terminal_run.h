// terminal_run.h: run a command with a pseudo-terminal as its stdin, stdout and stderr (util-linux `script`), for
// the tests of what the binary draws only on a terminal (Progress's bar: preprocess, convert, checkpoint save and
// load).
#pragma once

#include <cstdlib>
#include <string>

#include "tests/common/job_run.h"

namespace ms::test {

// Whether `script` is here to give a command a pseudo-terminal (the tests skip without it).
inline bool have_pseudo_terminal() { return std::system("command -v script > /dev/null 2>&1") == 0; }

// Runs the shell command line `command` (no double quotes in it) on a pseudo-terminal and waits for it; `output`
// is everything it printed there, stdout and stderr interleaved as a terminal shows them.
inline JobRun run_on_terminal(const std::string& command) {
    return run_command("script -qec \"" + command + "\" /dev/null 2>&1", "");
}

}  // namespace ms::test
