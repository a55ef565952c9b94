# Optional parts: each is AUTO (on when found), ON (required) or OFF.
# Configure prints one line saying what was found and what is off.

option(KVRELAY_WERROR "Treat compiler warnings as errors" OFF)
option(KVRELAY_FUZZ "Build the libFuzzer targets (needs clang)" OFF)
# The sanitizer presets leave the benchmarks out: they are measured in release
# builds only, and skipping them shortens those builds (and CI) by minutes.
option(KVRELAY_BENCHMARKS "Build the benchmarks (tools/bench)" ON)
if(KVRELAY_FUZZ AND NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "KVRELAY_FUZZ needs clang (use the fuzz preset)")
endif()

foreach(opt CUDA RDMA PYTHON)
  set(KVRELAY_${opt} AUTO CACHE STRING "Build the ${opt} part: AUTO, ON or OFF")
  set_property(CACHE KVRELAY_${opt} PROPERTY STRINGS AUTO ON OFF)
endforeach()

set(_kvrelay_summary "")

# --- CUDA: GPU copy kernels and CUDA IPC pools.
set(KVRELAY_HAVE_CUDA OFF)
if(NOT KVRELAY_CUDA STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
  # 12.1 is the oldest toolkit that compiles the gather kernel (32 KiB of
  # kernel parameters). 12.8 and later copy host<->device in one batch call
  # (kernels/cuda/cuda_copy_engine.cpp); older 12.x queue each copy. A CUDA
  # 13 build needs an R580 or newer driver where it runs; a 12.x build runs
  # on older drivers too.
  if(CUDAToolkit_FOUND AND CUDAToolkit_VERSION VERSION_LESS 12.1)
    if(KVRELAY_CUDA STREQUAL "ON")
      message(FATAL_ERROR "KVRELAY_CUDA=ON but nvcc ${CUDAToolkit_VERSION} is older than 12.1")
    endif()
    list(APPEND _kvrelay_summary "CUDA off (nvcc ${CUDAToolkit_VERSION} < 12.1)")
    set(CUDAToolkit_FOUND FALSE)
    set(_kvrelay_cuda_too_old ON)
  endif()
  if(_kvrelay_cuda_too_old)
    # (said in the summary above)
  elseif(CUDAToolkit_FOUND AND CUDAToolkit_NVCC_EXECUTABLE)
    if(NOT DEFINED CMAKE_CUDA_COMPILER)
      set(CMAKE_CUDA_COMPILER ${CUDAToolkit_NVCC_EXECUTABLE})
    endif()
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80 90)  # A100, H100/H200
    endif()
    enable_language(CUDA)
    # CMake 3.25 predates nvcc's C++20 (CUDA 12): tell it the flag, so that
    # CUDA sources take the project's C++ standard like the rest.
    if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    set(KVRELAY_HAVE_CUDA ON)
    list(APPEND _kvrelay_summary "CUDA on (nvcc ${CUDAToolkit_VERSION})")
  elseif(KVRELAY_CUDA STREQUAL "ON")
    message(FATAL_ERROR "KVRELAY_CUDA=ON but no CUDA toolkit (nvcc) was found")
  else()
    list(APPEND _kvrelay_summary "CUDA off (no nvcc found)")
  endif()
else()
  list(APPEND _kvrelay_summary "CUDA off (KVRELAY_CUDA=OFF)")
endif()

# --- RDMA: rdma-core verbs and the connection manager.
set(KVRELAY_HAVE_RDMA OFF)
if(NOT KVRELAY_RDMA STREQUAL "OFF")
  find_path(IBVERBS_INCLUDE_DIR infiniband/verbs.h)
  find_library(IBVERBS_LIBRARY ibverbs)
  find_library(RDMACM_LIBRARY rdmacm)
  if(IBVERBS_INCLUDE_DIR AND IBVERBS_LIBRARY AND RDMACM_LIBRARY)
    set(KVRELAY_HAVE_RDMA ON)
    list(APPEND _kvrelay_summary "RDMA on (libibverbs, librdmacm)")
  elseif(KVRELAY_RDMA STREQUAL "ON")
    message(FATAL_ERROR "KVRELAY_RDMA=ON but libibverbs/librdmacm were not found (libibverbs-dev, librdmacm-dev)")
  else()
    list(APPEND _kvrelay_summary "RDMA off (libibverbs-dev/librdmacm-dev not found)")
  endif()
else()
  list(APPEND _kvrelay_summary "RDMA off (KVRELAY_RDMA=OFF)")
endif()

# --- Python: the pybind11 module.
set(KVRELAY_HAVE_PYTHON OFF)
if(NOT KVRELAY_PYTHON STREQUAL "OFF")
  # Prefer Debian's interpreter, the one python3-pytest and python3-numpy
  # install into: a pyenv or virtualenv python earlier on PATH would lack them.
  if(NOT DEFINED Python3_EXECUTABLE AND EXISTS /usr/bin/python3)
    set(Python3_EXECUTABLE /usr/bin/python3)
  endif()
  find_package(Python3 QUIET COMPONENTS Interpreter Development.Module)
  find_package(pybind11 CONFIG QUIET)
  if(Python3_FOUND AND pybind11_FOUND)
    set(KVRELAY_HAVE_PYTHON ON)
    list(APPEND _kvrelay_summary "Python on (${Python3_VERSION}, pybind11 ${pybind11_VERSION})")
  elseif(KVRELAY_PYTHON STREQUAL "ON")
    message(FATAL_ERROR "KVRELAY_PYTHON=ON but Python3 development files or pybind11 were not found")
  else()
    list(APPEND _kvrelay_summary "Python off (python3-dev/pybind11-dev not found)")
  endif()
else()
  list(APPEND _kvrelay_summary "Python off (KVRELAY_PYTHON=OFF)")
endif()

if(NOT KVRELAY_BENCHMARKS)
  list(APPEND _kvrelay_summary "benchmarks off (KVRELAY_BENCHMARKS=OFF)")
endif()

list(JOIN _kvrelay_summary ", " _kvrelay_summary)
message(STATUS "kvrelay: ${_kvrelay_summary}")
