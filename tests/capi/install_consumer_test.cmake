# Installs the built tree into a fresh prefix, then builds and runs consumers against it, with no
# CUDA toolkit in sight (nvcc off the PATH, CUDACXX unset): a C, a C++ and a planner program
# through find_package(kvoffload) (and a LibTorch one through its torch component, when built),
# a C program through pkg-config, a C program built against a copy of the header without its
# newest fields, and Python's ctypes loading the shared library. Run by ctest as a script:
#   cmake -DKVO_BUILD_DIR=... -DKVO_WORK_DIR=... -DKVO_CONSUMER_DIR=... -DKVO_VERSION=...
#         -DKVO_C_COMPILER=... -DKVO_CXX_COMPILER=... [-DKVO_PKG_CONFIG=...]
#         -DKVO_SOURCE_DIR=... [-DKVO_PYTHON3=...] -P this-file
cmake_minimum_required(VERSION 3.24)

# Every consumer command runs without CUDA: no directory with an nvcc on PATH, CUDACXX unset.
string(REPLACE ":" ";" _kvo_path "$ENV{PATH}")
set(_kvo_kept "")
foreach(dir IN LISTS _kvo_path)
  if(NOT EXISTS "${dir}/nvcc" AND NOT dir MATCHES "cuda")
    list(APPEND _kvo_kept "${dir}")
  endif()
endforeach()
string(REPLACE ";" ":" KVO_PATH_WITHOUT_CUDA "${_kvo_kept}")
function(run)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=CUDACXX --unset=CUDA_PATH
                          --unset=CUDAToolkit_ROOT "PATH=${KVO_PATH_WITHOUT_CUDA}" ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " command "${ARGN}")
    message(FATAL_ERROR "failed (${rc}): ${command}\n${out}")
  endif()
  set(run_output "${out}" PARENT_SCOPE)
endfunction()

set(prefix ${KVO_WORK_DIR}/prefix)
set(consumer_build ${KVO_WORK_DIR}/consumer-build)
file(REMOVE_RECURSE ${KVO_WORK_DIR})
file(MAKE_DIRECTORY ${KVO_WORK_DIR})

# 1. Install. Nothing of the source or build tree may be needed afterwards.
run(${CMAKE_COMMAND} --install ${KVO_BUILD_DIR} --prefix ${prefix})
foreach(installed include/kvoffload/kvoffload.h include/kvoffload/kvoffload.hpp)
  if(NOT EXISTS ${prefix}/${installed})
    message(FATAL_ERROR "cmake --install did not install ${installed}")
  endif()
endforeach()
file(GLOB_RECURSE config_files ${prefix}/*/kvoffloadConfig.cmake)
file(GLOB_RECURSE pc_files ${prefix}/*/kvoffload.pc)
file(GLOB_RECURSE libraries ${prefix}/*/libkvoffload.a)
file(GLOB_RECURSE shared_libraries ${prefix}/*/libkvoffload.so.0)
if(NOT config_files OR NOT pc_files OR NOT libraries OR NOT shared_libraries)
  message(FATAL_ERROR "the install lacks a package file, a .pc file or a library: "
                      "'${config_files}' '${pc_files}' '${libraries}' '${shared_libraries}'")
endif()
list(GET shared_libraries 0 shared_library)
get_filename_component(libdir ${shared_library} DIRECTORY)

# No path of this machine but the prefix in the package files: not the build tree, not the
# CUDA toolkit.
file(GLOB_RECURSE package_files ${prefix}/*/cmake/kvoffload/*.cmake ${prefix}/*/kvoffload.pc)
foreach(file IN LISTS package_files)
  file(READ ${file} text)
  foreach(path ${KVO_BUILD_DIR} ${KVO_SOURCE_DIR} /usr/local/cuda)
    string(FIND "${text}" "${path}" at)
    if(NOT at EQUAL -1)
      message(FATAL_ERROR "${file} names ${path}, a path of the build machine")
    endif()
  endforeach()
endforeach()

# 2. A CMake project: find_package(kvoffload), a C and a C++ program, and a LibTorch program
#    through the torch component when the adapter was built.
set(programs consumer_c consumer_cxx consumer_planner)
run(${CMAKE_COMMAND} -S ${KVO_CONSUMER_DIR} -B ${consumer_build} -G ${KVO_GENERATOR}
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_C_COMPILER=${KVO_C_COMPILER}
    -DCMAKE_CXX_COMPILER=${KVO_CXX_COMPILER} -DKVO_EXPECTED_VERSION=${KVO_VERSION})
string(FIND "${run_output}" "kvoffload ${KVO_VERSION} from ${prefix}/" found_at)
if(found_at EQUAL -1)
  message(FATAL_ERROR "the consumer did not find the installed package:\n${run_output}")
endif()
string(FIND "${run_output}" "kvoffload::kvoffload is a SHARED_LIBRARY" shared_at)
if(shared_at EQUAL -1)
  message(FATAL_ERROR "kvoffload::kvoffload is not the shared library:\n${run_output}")
endif()
file(READ ${consumer_build}/CMakeCache.txt consumer_cache)
if(consumer_cache MATCHES "CUDAToolkit_(BIN_DIR|INCLUDE_DIR|ROOT):")
  message(FATAL_ERROR "configuring a consumer looked for a CUDA toolkit")
endif()
run(${CMAKE_COMMAND} --build ${consumer_build})
foreach(program IN LISTS programs)
  run(${consumer_build}/${program})
  message(STATUS "${program}: ${run_output}")
endforeach()
# They load the shared library (CMake's build-tree RUNPATH points into the prefix).
run(ldd ${consumer_build}/consumer_c)
if(NOT run_output MATCHES "libkvoffload\\.so\\.0 => ${libdir}")
  message(FATAL_ERROR "consumer_c does not load the installed libkvoffload.so.0:\n${run_output}")
endif()
if(run_output MATCHES "libcudart")
  message(FATAL_ERROR "consumer_c loads a CUDA runtime of its own:\n${run_output}")
endif()

# The LibTorch adapter through its component, in a project of its own (LibTorch's package looks
# for CUDA itself).
if(KVO_TORCH_PREFIX)
  if(NOT EXISTS ${prefix}/include/kvoffload/torch.hpp)
    message(FATAL_ERROR "the adapter was built but cmake --install did not install torch.hpp")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${KVO_CONSUMER_DIR} -B ${consumer_build}-torch
                          -G ${KVO_GENERATOR} -DCMAKE_PREFIX_PATH=${prefix}
                          -DCMAKE_C_COMPILER=${KVO_C_COMPILER}
                          -DCMAKE_CXX_COMPILER=${KVO_CXX_COMPILER}
                          -DKVO_EXPECTED_VERSION=${KVO_VERSION} -DKVO_CONSUMER_TORCH=ON
                          -DTorch_DIR=${KVO_TORCH_PREFIX}/Torch
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "configuring the LibTorch consumer failed:\n${out}")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} --build ${consumer_build}-torch --target consumer_torch
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "building the LibTorch consumer failed:\n${out}")
  endif()
  execute_process(COMMAND ${consumer_build}-torch/consumer_torch
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer_torch failed:\n${out}")
  endif()
  message(STATUS "consumer_torch: ${out}")
endif()

# A C program built against the header without its newest fields, run against this library.
set(old_include ${KVO_WORK_DIR}/old-include/kvoffload)
file(MAKE_DIRECTORY ${old_include})
file(COPY ${prefix}/include/kvoffload/api.h DESTINATION ${old_include})
file(READ ${prefix}/include/kvoffload/kvoffload.h header)
# A struct's newest fields run from their "Since" comment to its closing brace.
set(new_fields "[ ]*/\\* Since [0-9][^}]*")
string(REGEX MATCHALL "${new_fields}" dropped "${header}")
list(LENGTH dropped dropped)
if(dropped LESS 3)
  message(FATAL_ERROR "expected new fields in kvo_cache_options, kvo_layer_view and "
                      "kvo_cache_stats to drop, found ${dropped}")
endif()
string(REGEX REPLACE "${new_fields}" "" old_header "${header}")
file(WRITE ${old_include}/kvoffload.h "${old_header}")
run(${KVO_C_COMPILER} -std=c99 -Wall -Wextra -pedantic -Werror -I${KVO_WORK_DIR}/old-include
    ${KVO_CONSUMER_DIR}/old_header.c -o ${KVO_WORK_DIR}/consumer_old_header -L${libdir}
    -lkvoffload -Wl,-rpath,${libdir})
run(${KVO_WORK_DIR}/consumer_old_header)
message(STATUS "consumer_old_header: ${run_output}")

# Python's ctypes, with nothing but the shared library.
if(KVO_PYTHON3)
  run(${KVO_PYTHON3} ${KVO_SOURCE_DIR}/tests/capi/ctypes_test.py ${shared_library})
  message(STATUS "ctypes: ${run_output}")
endif()

# 3. pkg-config: a C program compiled and linked with nothing but its flags.
if(NOT KVO_PKG_CONFIG)
  message(STATUS "pkg-config not found; the .pc file is installed but not exercised")
  return()
endif()
list(GET pc_files 0 pc_file)
get_filename_component(pc_dir ${pc_file} DIRECTORY)
set(ENV{PKG_CONFIG_PATH} ${pc_dir})
run(${KVO_PKG_CONFIG} --modversion kvoffload)
string(STRIP "${run_output}" modversion)
if(NOT modversion STREQUAL KVO_VERSION)
  message(FATAL_ERROR "pkg-config says version '${modversion}', expected ${KVO_VERSION}")
endif()
run(${KVO_PKG_CONFIG} --cflags --libs kvoffload)
string(STRIP "${run_output}" flags)
separate_arguments(flags UNIX_COMMAND "${flags}")
run(${KVO_C_COMPILER} -std=c99 -Wall -Wextra -pedantic -Werror
    -DKVO_EXPECTED_VERSION="${KVO_VERSION}" ${KVO_CONSUMER_DIR}/main.c -o
    ${KVO_WORK_DIR}/consumer_pkgconfig ${flags} -Wl,-rpath,${libdir})
run(ldd ${KVO_WORK_DIR}/consumer_pkgconfig)
if(NOT run_output MATCHES "libkvoffload\\.so\\.0")
  message(FATAL_ERROR "pkg-config's flags did not link the shared library:\n${run_output}")
endif()
run(${KVO_WORK_DIR}/consumer_pkgconfig)
message(STATUS "consumer_pkgconfig: ${run_output}")
