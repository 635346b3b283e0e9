// Names the calling thread, so that `top -H`, `ps -L`, perf, gdb and /proc/PID/task/*/comm tell
// the server's threads apart (a decode step loop from a gRPC handler, one model's from another's)
// instead of showing every one as "tost_server".
#pragma once

#include <string_view>

namespace tost {

// Linux keeps 15 bytes of a thread's name: a longer one is cut there (at a UTF-8 character's
// start), so put what tells threads apart first ("step:<model>", not "<model>-step"). Does
// nothing where the platform has no thread names.
void NameThisThread(std::string_view name);

}  // namespace tost
