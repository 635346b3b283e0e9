// An LD_PRELOAD library for the tests that watch a server while it loads its models
// (tests/integration/conftest.py, held_loading_server): open() and openat() of a path under
// $TOST_OPEN_GATE_PREFIX wait while the file $TOST_OPEN_GATE exists, after creating
// $TOST_OPEN_GATE.reached to say that the process got there. The test holds the server inside its
// model loading for as long as it needs, instead of racing a slow repository against the machine's
// speed, then removes the gate. A wait ends on its own after $TOST_OPEN_GATE_TIMEOUT_S seconds
// (default 120), so a test that dies cannot leave a server stuck.
#undef _FORTIFY_SOURCE  // its inline open() wrappers would clash with the definitions below
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int (*open_fn)(const char*, int, ...);
typedef int (*openat_fn)(int, const char*, int, ...);

static void wait_at_gate(const char* path) {
  const char* prefix = getenv("TOST_OPEN_GATE_PREFIX");
  const char* gate = getenv("TOST_OPEN_GATE");
  if (path == NULL || prefix == NULL || gate == NULL || *prefix == '\0' ||
      strncmp(path, prefix, strlen(prefix)) != 0) {
    return;
  }
  const int saved_errno = errno;
  char reached[4096];
  if (snprintf(reached, sizeof reached, "%s.reached", gate) < (int)sizeof reached) {
    // Through the next open in line, not this library's: the marker is outside the prefix anyway.
    open_fn real_open = (open_fn)dlsym(RTLD_NEXT, "open");
    const int fd = real_open(reached, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0) close(fd);
  }
  const char* timeout = getenv("TOST_OPEN_GATE_TIMEOUT_S");
  const long limit_ms = 1000L * (timeout != NULL ? atol(timeout) : 120);
  const struct timespec step = {0, 5 * 1000 * 1000};
  for (long waited_ms = 0; waited_ms < limit_ms && access(gate, F_OK) == 0; waited_ms += 5) {
    nanosleep(&step, NULL);
  }
  errno = saved_errno;
}

static int mode_of(int flags, va_list args) {
  return (flags & O_CREAT) != 0 || (flags & O_TMPFILE) == O_TMPFILE ? va_arg(args, int) : 0;
}

#define TOST_GATED_OPEN(name)                                  \
  int name(const char* path, int flags, ...) {                 \
    va_list args;                                              \
    va_start(args, flags);                                     \
    const int mode = mode_of(flags, args);                     \
    va_end(args);                                              \
    wait_at_gate(path);                                        \
    static open_fn real;                                       \
    if (real == NULL) real = (open_fn)dlsym(RTLD_NEXT, #name); \
    return real(path, flags, mode);                            \
  }

#define TOST_GATED_OPENAT(name)                                  \
  int name(int dir, const char* path, int flags, ...) {          \
    va_list args;                                                \
    va_start(args, flags);                                       \
    const int mode = mode_of(flags, args);                       \
    va_end(args);                                                \
    wait_at_gate(path);                                          \
    static openat_fn real;                                       \
    if (real == NULL) real = (openat_fn)dlsym(RTLD_NEXT, #name); \
    return real(dir, path, flags, mode);                         \
  }

TOST_GATED_OPEN(open)
TOST_GATED_OPEN(open64)
TOST_GATED_OPENAT(openat)
TOST_GATED_OPENAT(openat64)
