# Sanitizer builds (scripts/run-sanitizers.sh configures them):
#   -DTOST_SANITIZE=address,undefined   AddressSanitizer + UndefinedBehaviorSanitizer, no recovery:
#                                       the first report ends the process. Also float-cast-overflow
#                                       (in clang's "undefined", not in GCC's), libstdc++'s
#                                       assertions (indices, empty containers) and its std::vector
#                                       annotations (ASan sees reads past size() within capacity)
#   -DTOST_SANITIZE=thread              ThreadSanitizer
# Every target of the build is compiled and linked with the sanitizer, GoogleTest included (built
# here from TOST_GTEST_SOURCE_DIR, Debian's googletest package, instead of the uninstrumented
# libgtest). Only the LibTorch-free targets can be instrumented, so TOST_SANITIZE needs
# TOST_TORCH_FREE_ONLY=ON.
#
# ThreadSanitizer needs every library that synchronises the code under test to be instrumented:
# Debian's Abseil is not, so its absl::Mutex is invisible to TSan and every access it orders looks
# like a race. A thread build therefore takes Abseil from an instrumented install
# (-Dabsl_DIR=<prefix>/lib/cmake/absl; scripts/run-sanitizers.sh builds Debian's Abseil source
# with -fsanitize=thread) and refuses the system one.
include_guard(GLOBAL)

set(TOST_SANITIZE "" CACHE STRING "Sanitizers for every target: address,undefined | thread | empty (none)")
set_property(CACHE TOST_SANITIZE PROPERTY STRINGS "" "address,undefined" "thread")
set(TOST_GTEST_SOURCE_DIR /usr/src/googletest CACHE PATH
    "GoogleTest source tree, built with the sanitizer when TOST_SANITIZE is set")

if(NOT TOST_SANITIZE)
  return()
endif()
if(NOT TOST_TORCH_FREE_ONLY)
  message(FATAL_ERROR "TOST_SANITIZE=${TOST_SANITIZE} needs -DTOST_TORCH_FREE_ONLY=ON: LibTorch, CUDA "
                      "and gRPC are not instrumented")
endif()
if(TOST_SANITIZE STREQUAL "address,undefined")
  set(_tost_sanitize_flags -fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all)
  add_compile_definitions(_GLIBCXX_ASSERTIONS _GLIBCXX_SANITIZE_VECTOR)
elseif(TOST_SANITIZE STREQUAL "thread")
  set(_tost_sanitize_flags -fsanitize=thread)
  # find_package(absl) has run: refuse an Abseil that is not the instrumented one.
  if(NOT absl_DIR OR absl_DIR MATCHES "^/usr/")
    message(FATAL_ERROR "TOST_SANITIZE=thread needs an Abseil built with -fsanitize=thread "
                        "(-Dabsl_DIR=<prefix>/lib/cmake/absl); found '${absl_DIR}'. "
                        "scripts/run-sanitizers.sh builds and caches one.")
  endif()
else()
  message(FATAL_ERROR "TOST_SANITIZE must be 'address,undefined' or 'thread', not '${TOST_SANITIZE}'")
endif()
# -O1 keeps the tests fast and the reports' stacks exact; asserts stay on (no NDEBUG). -g1 (after
# the Debug configuration's -g, so it wins): the line tables and function names a report's stack
# needs, compiled in about two thirds of -g's time (37 s -> 25 s for the scheduler's test).
add_compile_options(${_tost_sanitize_flags} -O1 -g1 -fno-omit-frame-pointer)
add_link_options(${_tost_sanitize_flags})
message(STATUS "Sanitizers: ${_tost_sanitize_flags} (absl: ${absl_DIR})")

if(TOST_BUILD_TESTS)
  if(NOT EXISTS ${TOST_GTEST_SOURCE_DIR}/CMakeLists.txt)
    message(FATAL_ERROR "no GoogleTest source at TOST_GTEST_SOURCE_DIR=${TOST_GTEST_SOURCE_DIR} "
                        "(Debian package googletest)")
  endif()
  set(BUILD_GMOCK ON CACHE BOOL "" FORCE)
  set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
  add_subdirectory(${TOST_GTEST_SOURCE_DIR} ${CMAKE_BINARY_DIR}/googletest EXCLUDE_FROM_ALL SYSTEM)
endif()
