# Runs kvo-generate on the tiny preset (host backend, a 2000-token prompt, 32 new tokens) with
# every layer resident and with every layer streamed through two staging buffers (with
# -DPIECE=N, its prompt prefilled in pieces of N tokens), and fails unless both generate the
# same tokens. Usage: cmake -DGENERATE=path -P compare_generate.cmake
# With -DMAKE_MODEL=path -DARCH=NAME -DDIR=dir [-DMAKE_ARGS="a b"]: on a random checkpoint of that
# family (kvo-make-model --preset tiny --arch NAME MAKE_ARGS) instead, read from its files.
# With -DSPLIT=auto|ROWS: both runs streamed, the first with --split off and the second with
# --split SPLIT (and, for ROWS, fewer bytes over the bus per decoded token); -DMODEL=dir runs a
# checkpoint instead of the preset, -DMAX_NEW=n generates n tokens.
set(source --preset tiny)
if(DEFINED MODEL)
  set(source --model ${MODEL})
endif()
if(NOT DEFINED MAX_NEW)
  set(MAX_NEW 32)
endif()
if(DEFINED ARCH)
  file(REMOVE_RECURSE ${DIR})
  separate_arguments(make_args UNIX_COMMAND "${MAKE_ARGS}")
  execute_process(COMMAND ${MAKE_MODEL} --preset tiny --arch ${ARCH} --layers 3 ${make_args}
                          --out ${DIR}
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "kvo-make-model --arch ${ARCH} failed (${rc}):\n${out}\n${err}")
  endif()
  set(source --model ${DIR})
endif()
set(common ${source} --backend host --prompt-len 2000 --max-new ${MAX_NEW} --json --quiet)
set(tokens "")
set(bytes "")
set(streamed "--resident;0;--ring;2")
if(DEFINED PIECE)  # the streamed run prefills in pieces of PIECE tokens
  list(APPEND streamed --max-prompt ${PIECE})
endif()
set(first "--resident;all")
if(DEFINED SPLIT)
  set(first "${streamed};--split;off")
  list(APPEND streamed --split ${SPLIT})
endif()
foreach(placement "${first}" "${streamed}")
  execute_process(COMMAND ${GENERATE} ${common} ${placement} OUTPUT_VARIABLE out
                  ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "kvo-generate ${placement} failed (${rc}):\n${out}\n${err}")
  endif()
  string(REGEX MATCH "\"tokens\":\\[\\[[0-9,]*\\]\\]" found "${out}")
  string(REGEX MATCH "\"resident_layers\":[0-9]+" resident "${out}")
  string(REGEX MATCH "\"h2d_bytes_per_token\":[0-9.e+]+" per_token "${out}")
  string(REGEX REPLACE ".*:" "" per_token "${per_token}")
  list(APPEND bytes "${per_token}")
  if(found STREQUAL "")
    message(FATAL_ERROR "no tokens in the output of kvo-generate ${placement}:\n${out}")
  endif()
  message(STATUS "${placement}: ${resident} ${found}")
  list(APPEND tokens "${found}")
endforeach()
list(GET tokens 0 resident_tokens)
list(GET tokens 1 streamed_tokens)
if(NOT resident_tokens STREQUAL streamed_tokens)
  message(FATAL_ERROR "tokens differ:\n  ${first}: ${resident_tokens}\n  streamed: ${streamed_tokens}")
endif()
if(DEFINED SPLIT AND SPLIT MATCHES "^[0-9]+$")
  list(GET bytes 0 whole)
  list(GET bytes 1 tails)
  if(NOT tails LESS whole)
    message(FATAL_ERROR "--split ${SPLIT} moved ${tails} bytes per token, --split off ${whole}")
  endif()
  message(STATUS "bytes over the bus per decoded token: --split off ${whole}, --split ${SPLIT} ${tails}")
endif()
