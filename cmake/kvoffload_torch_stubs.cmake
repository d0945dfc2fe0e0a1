# Finding LibTorch's CMake package without a CUDA toolkit. Included by cmake/kvoffload_capi.cmake.
#
# The torch wheel is a CUDA build, and its CMake config (Caffe2's public/cuda.cmake) then insists
# on a full CUDA toolkit (nvcc, headers, a try_run, matching versions) even for CPU use, because
# it serves extensions that compile .cu files. The adapter compiles no CUDA code: it reaches CUDA streams through
# c10::Stream::native_handle(), and libtorch_cuda.so loads its own CUDA runtime (the nvidia-*
# wheels) through its RUNPATH. So torch::cudart is defined here as an empty target beforehand,
# which public/cuda.cmake takes as "already found"; the adapter then configures the same way with
# or without a toolkit.
# (The installed package config, cmake/kvoffloadConfig.cmake.in, does the same for consumers of kvoffload_torch; MKL's
# target is stubbed for the same reason: the wheel links MKL statically, and Caffe2's mkl.cmake
# would otherwise add link directories under an empty MKL_ROOT, /lib/intel64 and the like.)
macro(kvo_torch_without_cuda_toolkit)
  foreach(_kvo_stub torch::cudart caffe2::mkl)
    if(NOT TARGET ${_kvo_stub})
      add_library(${_kvo_stub} INTERFACE IMPORTED)
    endif()
  endforeach()
endmacro()

