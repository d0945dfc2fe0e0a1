# The Python package built on its own (tools/python/CMakeLists.txt), as tools/device-check.sh
# builds it on a GPU machine: the library installed into a fresh prefix, the native module
# compiled against that prefix and KVO_PYTHON's torch, and a test file run against the result.
#   cmake -DKVO_BUILD_DIR=... -DKVO_SOURCE_DIR=... -DKVO_WORK_DIR=... -DKVO_PYTHON=...
#         -DKVO_TEST=test_hf_generate -P this-file
cmake_minimum_required(VERSION 3.24)
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " command "${ARGN}")
    message(FATAL_ERROR "failed (${rc}): ${command}\n${out}")
  endif()
  set(run_output "${out}" PARENT_SCOPE)
endfunction()
file(REMOVE_RECURSE ${KVO_WORK_DIR})
run(${CMAKE_COMMAND} --install ${KVO_BUILD_DIR} --prefix ${KVO_WORK_DIR}/prefix)
run(${CMAKE_COMMAND} -S ${KVO_SOURCE_DIR}/tools/python -B ${KVO_WORK_DIR}/build
    -DCMAKE_PREFIX_PATH=${KVO_WORK_DIR}/prefix -DPython3_EXECUTABLE=${KVO_PYTHON})
run(${CMAKE_COMMAND} --build ${KVO_WORK_DIR}/build -j 2)
# The module it built, not the build tree's, is the one imported.
# (No ';' in the program: CMake would split the argument there.)
run(${CMAKE_COMMAND} -E env PYTHONPATH=${KVO_WORK_DIR}/build/python ${KVO_PYTHON} -c
    "print(__import__('kvoffload._native', fromlist=['_']).__file__, end='')")
if(NOT run_output MATCHES "${KVO_WORK_DIR}/build/python/kvoffload/_native")
  message(FATAL_ERROR "imported ${run_output}, not the module built here")
endif()
run(${CMAKE_COMMAND} -E env PYTHONPATH=${KVO_WORK_DIR}/build/python:${KVO_SOURCE_DIR}/tests/python
    PYTHONDONTWRITEBYTECODE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
    OMP_NUM_THREADS=1 ${KVO_PYTHON} -m unittest discover -s ${KVO_SOURCE_DIR}/tests/python
    -p ${KVO_TEST}.py)
message(STATUS "the standalone package passed ${KVO_TEST}:\n${run_output}")
