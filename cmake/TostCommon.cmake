# Shared build settings: compiler cache, warnings, CUDA architectures.
# Included by the top-level project and by kernels/ when it is configured on its own.
include_guard(GLOBAL)

find_program(TOST_CCACHE ccache)
if(TOST_CCACHE)
  # base_dir + hash_dir=false make cache hits survive a fresh clone at another path (CI).
  set(ENV{CCACHE_BASEDIR} ${CMAKE_SOURCE_DIR})
  set(CMAKE_C_COMPILER_LAUNCHER ${CMAKE_COMMAND} -E env CCACHE_BASEDIR=${CMAKE_SOURCE_DIR} CCACHE_NOHASHDIR=true CCACHE_SLOPPINESS=include_file_mtime,include_file_ctime,time_macros,pch_defines ${TOST_CCACHE})
  set(CMAKE_CXX_COMPILER_LAUNCHER ${CMAKE_C_COMPILER_LAUNCHER})
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${CMAKE_C_COMPILER_LAUNCHER})
endif()

# Warnings as errors on our own targets only (third-party headers come in as SYSTEM). The code is
# kept warning-free with the compilers CI uses; a newer compiler (another distribution's, a lent GPU
# machine's) brings warnings the code was never checked against, so TOST_WERROR=OFF keeps them
# warnings there instead of stopping the build.
option(TOST_WERROR "Treat compiler warnings as errors on the project's own targets" ON)
function(tost_target_warnings target)
  if(TOST_WERROR)
    set(_werror_cxx -Werror)
    set(_werror_cuda -Werror=all-warnings)
    set(_werror_host ",-Werror")
  else()
    set(_werror_cxx "")
    set(_werror_cuda "")
    set(_werror_host "")
  endif()
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra ${_werror_cxx} -Wno-unused-parameter -Wno-psabi>
    $<$<COMPILE_LANGUAGE:CUDA>:${_werror_cuda} -Xcompiler=-Wall,-Wextra${_werror_host},-Wno-unused-parameter>)
endfunction()

# tost_forbid_includes(NAME test PATHS file-or-folder... FORBID prefix... [PATTERNS regex...])
# A unit test that fails, naming each line, when a C++ or CUDA source under PATHS (relative to the
# source tree) includes a header under one of the FORBID prefixes (`grpc` forbids <grpc/...> and
# "grpc/...") or matches one of PATTERNS (extended regexes, e.g. a generated header's name): the
# layer boundary a target's links draw, checked on the sources too, so that a forbidden include
# shows here and not first in a build that lacks the dependency.
function(tost_forbid_includes)
  cmake_parse_arguments(arg "" "NAME" "PATHS;FORBID;PATTERNS" ${ARGN})
  if(NOT arg_NAME OR NOT arg_PATHS OR NOT (arg_FORBID OR arg_PATTERNS))
    message(FATAL_ERROR "tost_forbid_includes needs NAME, PATHS and FORBID or PATTERNS")
  endif()
  set(_alternatives "")
  if(arg_FORBID)
    list(JOIN arg_FORBID "|" _prefixes)
    string(REPLACE "." "[.]" _prefixes "${_prefixes}")
    list(APPEND _alternatives "^[[:space:]]*#[[:space:]]*include[[:space:]]*[<\"](${_prefixes})/")
  endif()
  list(APPEND _alternatives ${arg_PATTERNS})
  list(JOIN _alternatives "|" _regex)
  list(TRANSFORM arg_PATHS PREPEND ${PROJECT_SOURCE_DIR}/)
  add_test(NAME ${arg_NAME}
           COMMAND bash ${PROJECT_SOURCE_DIR}/scripts/forbid-includes.sh "${_regex}" ${arg_PATHS})
  set_tests_properties(${arg_NAME} PROPERTIES LABELS unit)
endfunction()

if(TOST_ENABLE_CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    find_program(_tost_nvcc nvcc HINTS /usr/local/cuda/bin)
    if(_tost_nvcc)
      set(CMAKE_CUDA_COMPILER ${_tost_nvcc})
    endif()
  endif()
  # The one place that lists the CUDA architectures: the kernels' build and the ptxas spill check
  # (kernels/cuda/CMakeLists.txt) both read it.
  set(CMAKE_CUDA_ARCHITECTURES 80 90 CACHE STRING "CUDA architectures compiled in every build")
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  set(CMAKE_CUDA_STANDARD 17)  # CMake 3.25 has no C++20 dialect flag for nvcc
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
endif()
