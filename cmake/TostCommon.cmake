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

# Warnings as errors on our own targets only (third-party headers come in as SYSTEM).
function(tost_target_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror -Wno-unused-parameter -Wno-psabi>
    $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings -Xcompiler=-Wall,-Wextra,-Werror,-Wno-unused-parameter>)
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
