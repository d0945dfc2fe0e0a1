# The Python package kvoffload in the build tree: the pure-Python sources of tools/python/kvoffload
# and the shared library they drive through its C ABI (ctypes), put together in
# <build>/python/kvoffload as the wheel lays them out, so that the build tree itself is an
# importable package:
#
#   PYTHONPATH=<build>/python $KVO_PYTHON -c "import kvoffload.hf"
#
# Nothing here compiles against torch or Python: the package is the same files whatever torch
# imports it. pyproject.toml builds the wheel from the same rules (KVO_PYTHON_WHEEL: the library
# and the sources installed into the wheel's kvoffload/, nothing else of the project).
#
# Included once, from the top-level CMakeLists.txt after kvoffload_capi.cmake.
include_guard(GLOBAL)

set(_kvo_py_root ${CMAKE_CURRENT_LIST_DIR}/..)
cmake_path(NORMAL_PATH _kvo_py_root)
file(GLOB _kvo_py_sources CONFIGURE_DEPENDS ${_kvo_py_root}/tools/python/kvoffload/*.py)

if(KVO_PYTHON_WHEEL)
  # scikit-build-core's wheel: platlib/kvoffload holds the sources and libkvoffload.so.0, one file
  # (a wheel cannot hold the links a plain install makes).
  install(FILES ${_kvo_py_sources} DESTINATION kvoffload COMPONENT python)
  install(FILES $<TARGET_FILE:kvoffload_shared> DESTINATION kvoffload
          RENAME libkvoffload.so.${PROJECT_VERSION_MAJOR} COMPONENT python)
  return()
endif()

set(KVO_PYTHON_PACKAGE_DIR ${PROJECT_BINARY_DIR}/python CACHE INTERNAL
    "Build-tree directory to put on PYTHONPATH for the kvoffload package")
set(_kvo_py_out ${KVO_PYTHON_PACKAGE_DIR}/kvoffload)

# A build tree of an older layout holds a compiled kvoffload._native, which Python would import
# before _native.py.
file(GLOB _kvo_py_stale ${_kvo_py_out}/_native*.so)
if(_kvo_py_stale)
  file(REMOVE ${_kvo_py_stale})
endif()

set(_kvo_py_copies)
foreach(source ${_kvo_py_sources})
  cmake_path(GET source FILENAME name)
  add_custom_command(OUTPUT ${_kvo_py_out}/${name}
                     COMMAND ${CMAKE_COMMAND} -E copy_if_different ${source} ${_kvo_py_out}/${name}
                     DEPENDS ${source}
                     COMMENT "kvoffload: Python package file ${name}")
  list(APPEND _kvo_py_copies ${_kvo_py_out}/${name})
endforeach()
set(_kvo_py_library ${_kvo_py_out}/libkvoffload.so.${PROJECT_VERSION_MAJOR})
add_custom_command(OUTPUT ${_kvo_py_library}
                   COMMAND ${CMAKE_COMMAND} -E copy_if_different $<TARGET_FILE:kvoffload_shared>
                           ${_kvo_py_library}
                   DEPENDS kvoffload_shared
                   COMMENT "kvoffload: Python package's libkvoffload.so.${PROJECT_VERSION_MAJOR}")
add_custom_target(kvoffload_python ALL DEPENDS ${_kvo_py_copies} ${_kvo_py_library})
message(STATUS "kvoffload: Python package kvoffload is put together in ${KVO_PYTHON_PACKAGE_DIR}")
