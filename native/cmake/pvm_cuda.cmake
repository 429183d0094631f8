# Decide whether the native engine is built with CUDA, and enable the CUDA language if so.
#
# PVM_DIST_CUDA chooses: AUTO builds with CUDA when a CUDA compiler is found, else CPU-only; ON requires
# CUDA and fails clearly without it; OFF builds CPU-only. Precedence: -DPVM_DIST_CUDA=... (the cache
# entry), then the environment variable PVM_DIST_CUDA (so `PVM_DIST_CUDA=OFF pip install .` gives a
# CPU-only build), then AUTO. The cache entry is empty unless set, so a reused build directory (such as
# scikit-build-core's build/{wheel_tag}) follows the environment of each build instead of the first.
#
# Output: PVM_WITH_CUDA (TRUE/FALSE). When TRUE, CUDA is enabled, CUDAToolkit is found, and
# CMAKE_CUDA_ARCHITECTURES is set (default: SASS for sm_80 and sm_90a plus PTX for compute_90, below: sm_86 and
# sm_89 GPUs run sm_80's code, H100/H200 sm_90a's (with the wgmma products, wgmma_product.cuh), newer
# ones JIT the PTX; two compilations per kernel instead of four keeps the install short. Set
# CMAKE_CUDA_ARCHITECTURES or CUDAARCHS for one GPU's own, e.g. 89; 90a for a Hopper GPU, as 90 has
# no wgmma).

set(PVM_DIST_CUDA "" CACHE STRING
    "Build the native engine with CUDA: AUTO, ON or OFF (empty: the PVM_DIST_CUDA environment variable, else AUTO)")
set_property(CACHE PVM_DIST_CUDA PROPERTY STRINGS "" AUTO ON OFF)

if(NOT PVM_DIST_CUDA STREQUAL "")
  set(_pvm_cuda_mode "${PVM_DIST_CUDA}")
  set(_pvm_cuda_source "-DPVM_DIST_CUDA")
elseif(DEFINED ENV{PVM_DIST_CUDA} AND NOT "$ENV{PVM_DIST_CUDA}" STREQUAL "")
  set(_pvm_cuda_mode "$ENV{PVM_DIST_CUDA}")
  set(_pvm_cuda_source "environment variable PVM_DIST_CUDA")
else()
  set(_pvm_cuda_mode AUTO)
  set(_pvm_cuda_source "default")
endif()
string(TOUPPER "${_pvm_cuda_mode}" _pvm_cuda_mode)
if(NOT _pvm_cuda_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "PVM_DIST_CUDA must be AUTO, ON or OFF, not '${_pvm_cuda_mode}' (from ${_pvm_cuda_source})")
endif()
message(STATUS "PVM_DIST_CUDA=${_pvm_cuda_mode} (from ${_pvm_cuda_source})")

set(PVM_WITH_CUDA FALSE)
if(_pvm_cuda_mode STREQUAL "OFF")
  return()
endif()

include(CheckLanguage)
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  if(_pvm_cuda_mode STREQUAL "ON")
    message(FATAL_ERROR
      "PVM_DIST_CUDA=ON but no working CUDA compiler was found. Install the CUDA toolkit and put nvcc on "
      "PATH (or set CUDACXX / -DCMAKE_CUDA_COMPILER=...), or build CPU-only with PVM_DIST_CUDA=OFF.")
  endif()
  message(STATUS "PVM_DIST_CUDA=AUTO: no CUDA compiler found")
  return()
endif()

# Must be set before enable_language(CUDA), which would otherwise pick the compiler's default. sm_90a needs
# nvcc 12.0+ and a CMake that accepts the "a" suffix (3.26+ asked for, to be safe: older ones rejected it); without them
# the default is sm_90's SASS and PTX, with no wgmma.
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND NOT DEFINED ENV{CUDAARCHS})
  execute_process(COMMAND "${CMAKE_CUDA_COMPILER}" --version OUTPUT_VARIABLE _pvm_nvcc_text ERROR_QUIET)
  string(REGEX MATCH "release ([0-9]+)\\." _pvm_nvcc_release "${_pvm_nvcc_text}")
  if(_pvm_nvcc_release AND CMAKE_MATCH_1 GREATER_EQUAL 12 AND CMAKE_VERSION VERSION_GREATER_EQUAL 3.26)
    set(_pvm_archs "80-real;90a-real;90-virtual")
  else()
    set(_pvm_archs "80-real;90")
  endif()
  set(CMAKE_CUDA_ARCHITECTURES "${_pvm_archs}" CACHE STRING "CUDA architectures to build for")
endif()

enable_language(CUDA)
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
set(CMAKE_CUDA_EXTENSIONS OFF)

find_package(CUDAToolkit)
if(NOT TARGET CUDA::cudart_static)
  if(_pvm_cuda_mode STREQUAL "ON")
    message(FATAL_ERROR "PVM_DIST_CUDA=ON: found ${CMAKE_CUDA_COMPILER} but not the CUDA runtime "
                        "(CUDA::cudart_static from find_package(CUDAToolkit)).")
  endif()
  message(WARNING "PVM_DIST_CUDA=AUTO: found ${CMAKE_CUDA_COMPILER} but not the static CUDA runtime "
                  "(CUDA::cudart_static); building without CUDA")
  return()
endif()

set(PVM_WITH_CUDA TRUE)
