# Installs the built tree into a fresh prefix, then builds and runs a consumer project against
# it: once through find_package(kvoffload), once through pkg-config. Run by ctest as a script:
#   cmake -DKVO_BUILD_DIR=... -DKVO_WORK_DIR=... -DKVO_CONSUMER_DIR=... -DKVO_VERSION=...
#         -DKVO_C_COMPILER=... -DKVO_CXX_COMPILER=... [-DKVO_PKG_CONFIG=...] -P this-file
cmake_minimum_required(VERSION 3.24)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
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
if(NOT config_files OR NOT pc_files OR NOT libraries)
  message(FATAL_ERROR "the install lacks a package file, a .pc file or the library: "
                      "'${config_files}' '${pc_files}' '${libraries}'")
endif()

# 2. A CMake project: find_package(kvoffload), a C and a C++ program, and a LibTorch program
#    through the torch component when the adapter was built.
set(programs consumer_c consumer_cxx)
set(torch_args "")
if(KVO_TORCH_PREFIX)
  if(NOT EXISTS ${prefix}/include/kvoffload/torch.hpp)
    message(FATAL_ERROR "the adapter was built but cmake --install did not install torch.hpp")
  endif()
  set(torch_args -DKVO_CONSUMER_TORCH=ON -DTorch_DIR=${KVO_TORCH_PREFIX}/Torch)
  list(APPEND programs consumer_torch)
endif()
run(${CMAKE_COMMAND} -S ${KVO_CONSUMER_DIR} -B ${consumer_build} -G ${KVO_GENERATOR}
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_C_COMPILER=${KVO_C_COMPILER}
    -DCMAKE_CXX_COMPILER=${KVO_CXX_COMPILER} -DKVO_EXPECTED_VERSION=${KVO_VERSION} ${torch_args})
string(FIND "${run_output}" "kvoffload ${KVO_VERSION} from ${prefix}/" found_at)
if(found_at EQUAL -1)
  message(FATAL_ERROR "the consumer did not find the installed package:\n${run_output}")
endif()
run(${CMAKE_COMMAND} --build ${consumer_build})
foreach(program IN LISTS programs)
  run(${consumer_build}/${program})
  message(STATUS "${program}: ${run_output}")
endforeach()

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
    ${KVO_WORK_DIR}/consumer_pkgconfig ${flags})
run(${KVO_WORK_DIR}/consumer_pkgconfig)
message(STATUS "consumer_pkgconfig: ${run_output}")
