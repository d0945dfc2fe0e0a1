# The C ABI, the LibTorch adapter, and installation: headers, library, CMake package files
# (find_package(kvoffload) -> kvoffload::kvoffload) and a pkg-config file.
#
# Included once, from the top-level CMakeLists.txt, before the tests that need its targets.
include_guard(GLOBAL)

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(_kvo_root ${CMAKE_CURRENT_LIST_DIR}/..)
cmake_path(NORMAL_PATH _kvo_root)

# The C ABI (prefetch/api/c_api.cpp) is part of kvo_core, beside the cache it wraps; kvo_core's
# build-only dependencies (Boost.Lockfree, xxHash, warning flags) stay inside the objects.

# ---- the LibTorch adapter (optional) ---------------------------------------------------------
# LibTorch comes from the torch wheel of KVO_PYTHON (cmake/kvoffload_torch_stubs.cmake says how
# it is found without a CUDA toolkit).
include(${CMAKE_CURRENT_LIST_DIR}/kvoffload_torch_stubs.cmake)

function(kvo_find_torch)
  set(KVO_TORCH_FOUND OFF PARENT_SCOPE)
  if(NOT KVO_PYTHON)
    message(STATUS "kvoffload: LibTorch adapter not built (KVO_PYTHON is not set; "
                   "tools/python-env.sh makes a Python with torch)")
    return()
  endif()
  execute_process(
    COMMAND ${KVO_PYTHON} -c "import sys, torch; sys.stdout.write(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE torch_prefix
    ERROR_VARIABLE torch_error
    RESULT_VARIABLE torch_rc)
  if(NOT torch_rc EQUAL 0)
    string(STRIP "${torch_error}" torch_error)
    string(REGEX REPLACE ".*\n" "" torch_error "${torch_error}")  # the exception's last line
    message(STATUS "kvoffload: LibTorch adapter not built (${KVO_PYTHON} cannot import torch: "
                   "${torch_error})")
    return()
  endif()
  # A different torch than last time: forget where the old one was.
  if(NOT "${torch_prefix}" STREQUAL "${_KVO_TORCH_PREFIX}")
    unset(Torch_DIR CACHE)
    unset(Caffe2_DIR CACHE)
    unset(TORCH_LIBRARY CACHE)
    unset(C10_CUDA_LIBRARY CACHE)
    set(_KVO_TORCH_PREFIX "${torch_prefix}" CACHE INTERNAL "torch.utils.cmake_prefix_path")
  endif()
  kvo_torch_without_cuda_toolkit()
  list(PREPEND CMAKE_PREFIX_PATH "${torch_prefix}")
  find_package(Torch QUIET)
  if(NOT Torch_FOUND OR NOT TARGET torch)
    message(STATUS "kvoffload: LibTorch adapter not built (no usable Torch CMake package under "
                   "${torch_prefix})")
    return()
  endif()
  execute_process(COMMAND ${KVO_PYTHON} -c "import sys, torch; sys.stdout.write(torch.__version__)"
                  OUTPUT_VARIABLE torch_version)
  message(STATUS "kvoffload: LibTorch adapter kvoffload_torch is built (torch ${torch_version} "
                 "from ${KVO_PYTHON})")
  set(KVO_TORCH_FOUND ON PARENT_SCOPE)
endfunction()

kvo_find_torch()
if(KVO_TORCH_FOUND)
  # Only this file and its test include LibTorch headers (slow to compile). LibTorch needs C++20;
  # its target says so and passes it on to whoever links the adapter.
  add_library(kvoffload_torch STATIC ${_kvo_root}/prefetch/api/torch_cache.cpp)
  add_library(kvoffload::kvoffload_torch ALIAS kvoffload_torch)
  target_link_libraries(kvoffload_torch PUBLIC kvoffload torch
                                        PRIVATE $<BUILD_INTERFACE:kvo_warnings>)
endif()

# ---- installation ----------------------------------------------------------------------------
# kvoffload::kvoffload (the shared library) needs nothing but itself; the static library, the
# planner and the LibTorch adapter are components: find_package(kvoffload COMPONENTS static
# planner torch).
install(TARGETS kvoffload_shared
        EXPORT kvoffload-targets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS kvoffload
        EXPORT kvoffload-static-targets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY ${_kvo_root}/include/kvoffload
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h" PATTERN "*.hpp" PATTERN "torch.hpp" EXCLUDE)
install(EXPORT kvoffload-targets
        NAMESPACE kvoffload::
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kvoffload)
install(EXPORT kvoffload-static-targets
        NAMESPACE kvoffload::
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kvoffload)
# The adapter, when built, as the package's optional component `torch`:
# find_package(kvoffload COMPONENTS torch) -> kvoffload::kvoffload_torch (over the static
# library).
if(KVO_TORCH_FOUND)
  install(TARGETS kvoffload_torch
          EXPORT kvoffload-torch-targets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(FILES ${_kvo_root}/include/kvoffload/torch.hpp
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kvoffload)
  install(EXPORT kvoffload-torch-targets
          NAMESPACE kvoffload::
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kvoffload)
endif()

set(_kvo_config_dir ${PROJECT_BINARY_DIR}/kvoffload-package)
configure_package_config_file(${_kvo_root}/cmake/kvoffloadConfig.cmake.in
                              ${_kvo_config_dir}/kvoffloadConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kvoffload)
write_basic_package_version_file(${_kvo_config_dir}/kvoffloadConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION}
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${_kvo_config_dir}/kvoffloadConfig.cmake
              ${_kvo_config_dir}/kvoffloadConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kvoffload)

# pkg-config: -lkvoffload links the shared library, which needs nothing more. For a static link
# (pkg-config --static), Libs.private lists what libkvoffload.a needs: the C++ runtime, threads,
# and on CUDA builds the static CUDA runtime, found on the linker's own path (never a path of
# this machine). The prefix is found relative to the .pc file, so the tree can be moved.
file(RELATIVE_PATH KVO_PC_PREFIX_FROM_PCDIR /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
string(REGEX REPLACE "/$" "" KVO_PC_PREFIX_FROM_PCDIR "${KVO_PC_PREFIX_FROM_PCDIR}")
set(KVO_PC_LIBS_PRIVATE "-lstdc++ -lm -pthread")
if(KVO_WITH_CUDA)
  string(APPEND KVO_PC_LIBS_PRIVATE " -lcudart_static -ldl -lrt")
endif()
configure_file(${_kvo_root}/cmake/kvoffload.pc.in ${_kvo_config_dir}/kvoffload.pc @ONLY)
install(FILES ${_kvo_config_dir}/kvoffload.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
