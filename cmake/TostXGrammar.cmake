# tost::xgrammar — XGrammar's C++ core (grammars, JSON schema to grammar, the token-mask matcher),
# compiled from the patched source tree scripts/install-deps.sh unpacks from the pinned PyPI sdist
# (TOST_XGRAMMAR_SOURCE_DIR, recorded in build/deps.env and passed by the Makefile).
#
# The sources are listed here instead of add_subdirectory() of the sdist's own CMakeLists.txt:
# that file appends -Werror -flto=auto -O3 to CMAKE_CXX_FLAGS (its static library would need an LTO
# link, and a newer compiler's warnings would stop our build), and the config.cmake it includes
# sets XGRAMMAR_BUILD_PYTHON_BINDINGS=ON as a plain variable, which overrides the cache option and
# pulls in the TVM-FFI bindings (Python development headers and the tvm_ffi package). The list
# below is what that file compiles into its `xgrammar` library: cpp/**/*.cc without cpp/tvm_ffi
# (the Python bindings); cpptrace (XGRAMMAR_ENABLE_CPPTRACE) and the sdist's tests and GoogleTest
# stay out.
include_guard(GLOBAL)

if(NOT TOST_XGRAMMAR_SOURCE_DIR)
  set(TOST_XGRAMMAR_SOURCE_DIR $ENV{TOST_XGRAMMAR_SOURCE_DIR})
endif()
if(NOT TOST_XGRAMMAR_SOURCE_DIR)
  # A configure that does not go through the Makefile (a lent GPU machine's) may have no XGrammar
  # source: the target and its tests are left out, saying so.
  message(STATUS "tost::xgrammar and tost_structured_tests are left out: "
                 "TOST_XGRAMMAR_SOURCE_DIR is not set (scripts/install-deps.sh unpacks XGrammar; "
                 "configure through the Makefile or pass -DTOST_XGRAMMAR_SOURCE_DIR=<dir>)")
  return()
endif()

set(_tost_xgrammar_sources
  compiled_grammar.cc
  config.cc
  converter_ext/cohere.cc
  converter_ext/deepseek.cc
  converter_ext/glm.cc
  converter_ext/kimi_k3.cc
  converter_ext/minimax.cc
  converter_ext/minimax_m3.cc
  converter_ext/qwen.cc
  earley_parser.cc
  fsm.cc
  fsm_builder.cc
  grammar.cc
  grammar_builder.cc
  grammar_compiler.cc
  grammar_functor.cc
  grammar_matcher.cc
  grammar_parser.cc
  grammar_printer.cc
  json_schema_converter.cc
  lark_converter.cc
  regex_converter.cc
  structural_tag.cc
  suffix_automata.cc
  support/logging.cc
  support/recursion_guard.cc
  testing.cc  # helpers the matcher and compiled grammar use to print tokens, not tests
  tokenizer_info.cc)
list(TRANSFORM _tost_xgrammar_sources PREPEND ${TOST_XGRAMMAR_SOURCE_DIR}/cpp/)
foreach(_file ${_tost_xgrammar_sources} ${TOST_XGRAMMAR_SOURCE_DIR}/include/xgrammar/xgrammar.h
        ${TOST_XGRAMMAR_SOURCE_DIR}/3rdparty/picojson/picojson.h
        ${TOST_XGRAMMAR_SOURCE_DIR}/3rdparty/dlpack/include/dlpack/dlpack.h)
  if(NOT EXISTS ${_file})
    message(FATAL_ERROR "TOST_XGRAMMAR_SOURCE_DIR=${TOST_XGRAMMAR_SOURCE_DIR} is not XGrammar "
                        "0.2.8's source tree: expected ${_file}, which does not exist (run "
                        "scripts/install-deps.sh and configure through the Makefile)")
  endif()
endforeach()
if(NOT EXISTS ${TOST_XGRAMMAR_SOURCE_DIR}/.complete)
  message(FATAL_ERROR "${TOST_XGRAMMAR_SOURCE_DIR} has no .complete marker: "
                      "scripts/install-deps.sh did not finish unpacking and patching it; "
                      "run it again")
endif()
message(STATUS "XGrammar from ${TOST_XGRAMMAR_SOURCE_DIR}")

add_library(tost_xgrammar_core STATIC ${_tost_xgrammar_sources})
# The sdist's own flags would be -O3 with LTO; -O2 keeps the compile affordable on a small machine,
# and -g0 leaves out debug information, most of this archive's size in a RelWithDebInfo build.
# Third-party code: none of our warning flags (tost_target_warnings is not called on it), and its
# own warnings are silenced (-w) so that they do not bury ours in the build log.
set_target_properties(tost_xgrammar_core PROPERTIES
  CXX_STANDARD 17
  CXX_EXTENSIONS OFF
  POSITION_INDEPENDENT_CODE ON)
target_compile_options(tost_xgrammar_core PRIVATE -O2 -g0 -w)
target_compile_definitions(tost_xgrammar_core PRIVATE XGRAMMAR_ENABLE_CPPTRACE=0
                                                      XGRAMMAR_ENABLE_INTERNAL_CHECK=0)
target_include_directories(tost_xgrammar_core
  PRIVATE ${TOST_XGRAMMAR_SOURCE_DIR}/cpp ${TOST_XGRAMMAR_SOURCE_DIR}/3rdparty/picojson)
# Its public headers and the DLPack header they include (matcher.h's token bitmask is a DLTensor),
# as SYSTEM includes: our -Werror never applies to their code.
target_include_directories(tost_xgrammar_core SYSTEM
  PUBLIC ${TOST_XGRAMMAR_SOURCE_DIR}/include ${TOST_XGRAMMAR_SOURCE_DIR}/3rdparty/dlpack/include)
target_link_libraries(tost_xgrammar_core PUBLIC Threads::Threads)
add_library(tost::xgrammar ALIAS tost_xgrammar_core)
