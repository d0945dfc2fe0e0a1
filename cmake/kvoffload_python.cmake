# The Python package kvoffload: the native extension kvoffload._native
# (tools/python/kvoffload/_native.cpp, pybind11 from the torch wheel's own headers, over the
# LibTorch adapter kvoffload_torch) and the pure-Python sources of tools/python/kvoffload, put
# together in <build>/python/kvoffload, so that the build tree itself is an importable package:
#
#   PYTHONPATH=<build>/python $KVO_PYTHON -c "import kvoffload.hf"
#
# `cmake --install <build> --component python` copies the same package into KVO_PYTHON_SITE_DIR
# (by default the site-packages of KVO_PYTHON). The rules are EXCLUDE_FROM_ALL: a plain
# `cmake --install` (the C/C++ package) never writes into a Python environment.
#
# Included once, from the top-level CMakeLists.txt after kvoffload_capi.cmake. Nothing is fetched: torch, its headers and Python come from
# KVO_PYTHON's installation.
include_guard(GLOBAL)


set(_kvo_py_root ${CMAKE_CURRENT_LIST_DIR}/..)
cmake_path(NORMAL_PATH _kvo_py_root)

if(NOT TARGET kvoffload_torch)
  message(STATUS "kvoffload: Python package not built (it needs the LibTorch adapter)")
  return()
endif()

# The headers and the module suffix of the very interpreter torch was imported from.
set(Python3_EXECUTABLE ${KVO_PYTHON})
find_package(Python3 COMPONENTS Interpreter Development.Module)
if(NOT Python3_Development.Module_FOUND)
  # KVO_PYTHON asked for the package, so say it loudly: its tests are not registered either.
  message(WARNING "kvoffload: Python package not built: no Python headers for ${KVO_PYTHON} "
                  "(on Debian: apt-get install python3-dev)")
  return()
endif()

# torch's own targets are defined in the directory scope that found them (kvoffload_capi.cmake's
# includer); look the package up again here, from the cached Torch_DIR, so that the targets the
# adapter links are visible to this one too. torch::cudart: see kvoffload_capi.cmake.
if(NOT TARGET torch)
  kvo_torch_without_cuda_toolkit()
  find_package(Torch REQUIRED)
endif()

# Two paths from the interpreter: torch's library folder (for libtorch_python, the
# torch.Tensor <-> at::Tensor conversions the binding uses) and its site-packages.
execute_process(
  COMMAND ${KVO_PYTHON} -c
          "import os, sysconfig, torch; print(os.path.dirname(torch.__file__) + '/lib;' + \
sysconfig.get_paths()['platlib'], end='')"
  OUTPUT_VARIABLE _kvo_py_paths
  RESULT_VARIABLE _kvo_py_rc)
list(GET _kvo_py_paths 0 _kvo_torch_lib_dir)
list(GET _kvo_py_paths 1 _kvo_py_platlib)
unset(KVO_TORCH_PYTHON_LIBRARY CACHE)  # looked up each time: KVO_PYTHON may have changed
find_library(KVO_TORCH_PYTHON_LIBRARY torch_python HINTS ${_kvo_torch_lib_dir} NO_DEFAULT_PATH)
if(NOT _kvo_py_rc EQUAL 0 OR NOT KVO_TORCH_PYTHON_LIBRARY)
  message(WARNING "kvoffload: Python package not built: no libtorch_python under "
                  "${_kvo_torch_lib_dir}")
  return()
endif()

set(KVO_PYTHON_PACKAGE_DIR ${PROJECT_BINARY_DIR}/python CACHE INTERNAL
    "Build-tree directory to put on PYTHONPATH for the kvoffload package")
set(_kvo_py_out ${KVO_PYTHON_PACKAGE_DIR}/kvoffload)

Python3_add_library(kvoffload_python MODULE WITH_SOABI ${_kvo_py_root}/tools/python/kvoffload/_native.cpp)
set_target_properties(kvoffload_python PROPERTIES
  OUTPUT_NAME _native
  LIBRARY_OUTPUT_DIRECTORY ${_kvo_py_out}
  CXX_VISIBILITY_PRESET hidden)
target_link_libraries(kvoffload_python PRIVATE kvoffload_torch ${KVO_TORCH_PYTHON_LIBRARY})

# The pure-Python sources, copied next to the extension whenever they change.
file(GLOB _kvo_py_sources CONFIGURE_DEPENDS ${_kvo_py_root}/tools/python/kvoffload/*.py)
set(_kvo_py_copies)
foreach(source ${_kvo_py_sources})
  cmake_path(GET source FILENAME name)
  add_custom_command(OUTPUT ${_kvo_py_out}/${name}
                     COMMAND ${CMAKE_COMMAND} -E copy_if_different ${source} ${_kvo_py_out}/${name}
                     DEPENDS ${source}
                     COMMENT "kvoffload: Python package file ${name}")
  list(APPEND _kvo_py_copies ${_kvo_py_out}/${name})
endforeach()
add_custom_target(kvoffload_python_sources ALL DEPENDS ${_kvo_py_copies})
add_dependencies(kvoffload_python kvoffload_python_sources)

# Installation into a Python environment (opt-in, see above).
set(KVO_PYTHON_SITE_DIR "${_kvo_py_platlib}" CACHE PATH
    "Where `cmake --install <build> --component python` puts the kvoffload package")
install(TARGETS kvoffload_python
        LIBRARY DESTINATION ${KVO_PYTHON_SITE_DIR}/kvoffload
        COMPONENT python EXCLUDE_FROM_ALL)
install(FILES ${_kvo_py_sources}
        DESTINATION ${KVO_PYTHON_SITE_DIR}/kvoffload
        COMPONENT python EXCLUDE_FROM_ALL)

message(STATUS "kvoffload: Python package kvoffload is built into ${KVO_PYTHON_PACKAGE_DIR}")
