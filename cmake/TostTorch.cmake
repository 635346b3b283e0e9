# tost::torch — LibTorch from the `torch` wheel in the project's virtual environment.
#
# We build the imported target ourselves instead of find_package(Torch): the wheel's TorchConfig
# pulls in Caffe2's CUDA detection (cuDNN, NVRTC, nvToolsExt, architecture flags it appends to every
# CUDA target), which is fragile against the system nvcc and slows configuration. We need only the
# headers, four shared libraries and the C++ ABI flag, all of which the wheel reports itself.
# requirements.txt pins the wheel to the build the lent GPU machines have installed (2.11.0, cu130;
# docs/architecture.md): bump it only together with theirs.
include_guard(GLOBAL)

if(NOT TOST_PYTHON)
  set(TOST_PYTHON $ENV{TOST_PYTHON})
endif()
if(NOT TOST_PYTHON)
  message(FATAL_ERROR "TOST_PYTHON is not set: run scripts/install-deps.sh and configure through the Makefile "
                      "(or pass -DTOST_PYTHON=<venv>/bin/python)")
endif()

execute_process(
  COMMAND ${TOST_PYTHON} -c "import torch, os; d=os.path.dirname(torch.__file__); print(d); print(int(torch._C._GLIBCXX_USE_CXX11_ABI)); print(torch.__version__); print(torch.version.cuda or '')"
  OUTPUT_VARIABLE _tost_torch_info RESULT_VARIABLE _tost_torch_rc OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _tost_torch_rc EQUAL 0)
  message(FATAL_ERROR "could not import torch with ${TOST_PYTHON}: run scripts/install-deps.sh")
endif()
string(REPLACE "\n" ";" _tost_torch_info "${_tost_torch_info}")
list(GET _tost_torch_info 0 TOST_TORCH_DIR)
list(GET _tost_torch_info 1 TOST_TORCH_CXX11_ABI)
list(GET _tost_torch_info 2 TOST_TORCH_VERSION)
list(LENGTH _tost_torch_info _n)
set(TOST_TORCH_CUDA_VERSION "")
if(_n GREATER 3)
  list(GET _tost_torch_info 3 TOST_TORCH_CUDA_VERSION)
endif()
message(STATUS "LibTorch ${TOST_TORCH_VERSION} (CUDA '${TOST_TORCH_CUDA_VERSION}') from ${TOST_TORCH_DIR}")

set(TOST_TORCH_LIB_DIR ${TOST_TORCH_DIR}/lib)
function(_tost_torch_lib name)
  add_library(tost_torch_${name} SHARED IMPORTED GLOBAL)
  set_target_properties(tost_torch_${name} PROPERTIES IMPORTED_LOCATION ${TOST_TORCH_LIB_DIR}/lib${name}.so)
endfunction()
foreach(lib c10 torch_cpu torch)
  _tost_torch_lib(${lib})
endforeach()

# The wheel's include/ also carries protobuf's headers (google/: 3.13 in torch 2.11, 3.21 in 2.15),
# which would shadow Debian's, the ones protoc generated our stubs for, in every file that includes
# both ATen and a .pb.h. So the headers are offered through a folder of links to every entry of
# include/ but google/.
set(TOST_TORCH_INCLUDE_DIR ${CMAKE_BINARY_DIR}/torch-include)
file(REMOVE_RECURSE ${TOST_TORCH_INCLUDE_DIR})
file(MAKE_DIRECTORY ${TOST_TORCH_INCLUDE_DIR})
file(GLOB _tost_torch_include_entries RELATIVE ${TOST_TORCH_DIR}/include ${TOST_TORCH_DIR}/include/*)
foreach(entry IN LISTS _tost_torch_include_entries)
  if(NOT entry STREQUAL "google")
    file(CREATE_LINK ${TOST_TORCH_DIR}/include/${entry} ${TOST_TORCH_INCLUDE_DIR}/${entry} SYMBOLIC)
  endif()
endforeach()

add_library(tost_torch INTERFACE)
add_library(tost::torch ALIAS tost_torch)
target_include_directories(tost_torch SYSTEM INTERFACE
  ${TOST_TORCH_INCLUDE_DIR} ${TOST_TORCH_INCLUDE_DIR}/torch/csrc/api/include)
target_compile_definitions(tost_torch INTERFACE _GLIBCXX_USE_CXX11_ABI=${TOST_TORCH_CXX11_ABI})
target_link_libraries(tost_torch INTERFACE tost_torch_torch tost_torch_torch_cpu tost_torch_c10)
# torch 2.11's libtorch.so exports a std::filesystem of its own (64 symbols of the older libstdc++ it
# was built with, ABI-incompatible with gcc 12's: std::filesystem::remove_all jumped to address 0).
# A binary resolves such symbols in the order of the libraries it needs, so libstdc++ is made the
# first of them, before anything of the wheel.
target_link_options(tost_torch INTERFACE "LINKER:--push-state,--no-as-needed,-lstdc++,--pop-state")
# The wheel's libraries find their own dependencies through $ORIGIN; our binaries find the wheel here.
set(CMAKE_BUILD_RPATH ${CMAKE_BUILD_RPATH} ${TOST_TORCH_LIB_DIR} PARENT_SCOPE)
set(CMAKE_BUILD_RPATH ${CMAKE_BUILD_RPATH} ${TOST_TORCH_LIB_DIR})

if(TOST_ENABLE_CUDA)
  if(TOST_TORCH_CUDA_VERSION STREQUAL "")
    message(FATAL_ERROR "TOST_ENABLE_CUDA=ON but the installed torch is CPU-only")
  endif()
  string(REGEX MATCH "^[0-9]+" _torch_cuda_major "${TOST_TORCH_CUDA_VERSION}")
  if(NOT _torch_cuda_major STREQUAL CUDAToolkit_VERSION_MAJOR)
    message(FATAL_ERROR "torch was built for CUDA ${TOST_TORCH_CUDA_VERSION} but nvcc is CUDA ${CUDAToolkit_VERSION}: "
                        "major versions must match")
  endif()
  foreach(lib c10_cuda torch_cuda)
    _tost_torch_lib(${lib})
  endforeach()
  add_library(tost_torch_cuda INTERFACE)
  add_library(tost::torch_cuda ALIAS tost_torch_cuda)
  # The CUDA runtime LibTorch was built with ships in the wheel (nvidia/cu<N>/lib); link that one,
  # not the toolkit's, so one process never mixes two runtime versions.
  file(GLOB _tost_wheel_cudart ${TOST_TORCH_DIR}/../nvidia/cu[0-9]*/lib/libcudart.so.[0-9]*)
  if(_tost_wheel_cudart)
    list(GET _tost_wheel_cudart 0 _tost_wheel_cudart)
    add_library(tost_torch_cudart SHARED IMPORTED GLOBAL)
    set_target_properties(tost_torch_cudart PROPERTIES IMPORTED_LOCATION ${_tost_wheel_cudart})
    set(_tost_cudart tost_torch_cudart)
  else()
    set(_tost_cudart CUDA::cudart)
  endif()
  # Nothing of ours calls into libtorch_cuda.so directly: it matters for its static initialisers,
  # which register ATen's CUDA backend (at::hasCUDA(), CUDA tensors, the CUDA allocator). A linker
  # that defaults to --as-needed (Debian's and Ubuntu's gcc do) drops a library no symbol is taken
  # from, and the binary then sees no CUDA at all. TorchConfig links it with --no-as-needed for
  # that reason; so does this link feature, for every target that links tost::torch_cuda (the
  # ctest torch_cuda_needed checks the binaries' NEEDED entries).
  set(CMAKE_LINK_LIBRARY_USING_tost_no_as_needed
      "LINKER:--push-state,--no-as-needed" "<LINK_ITEM>" "LINKER:--pop-state")
  set(CMAKE_LINK_LIBRARY_USING_tost_no_as_needed_SUPPORTED TRUE)
  target_link_libraries(tost_torch_cuda INTERFACE
    tost_torch "$<LINK_LIBRARY:tost_no_as_needed,tost_torch_torch_cuda>" tost_torch_c10_cuda
    ${_tost_cudart})
  target_compile_definitions(tost_torch_cuda INTERFACE TOST_WITH_CUDA=1)
  # libtorch_cuda needs the wheel's CUDA libraries (nvidia/*/lib) at link time only to resolve its
  # own dependencies; at run time it finds them through its RPATH.
  file(GLOB _tost_nv_dirs LIST_DIRECTORIES true ${TOST_TORCH_DIR}/../nvidia/*/lib ${TOST_TORCH_DIR}/../nvidia/cu*/lib)
  foreach(d ${_tost_nv_dirs})
    target_link_options(tost_torch_cuda INTERFACE "-Wl,-rpath-link,${d}")
  endforeach()
endif()
