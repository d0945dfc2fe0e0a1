# Runs kvo-replay at one shape with --dtype bf16 and with --dtype ${DTYPE}, each verified under
# random delays, and checks that the quantized run's last decode step moved at most ${RATIO} of
# bf16's bytes (PER_MILLE / 1000) and exactly its formula: 2 x layers x context x row bytes.
#   cmake -DREPLAY=... -DDTYPE=fp8 -DPER_MILLE=530 "-DARGS=--max-seq;2048" -P replay_ratio.cmake
foreach(dtype bf16 ${DTYPE})
  execute_process(COMMAND ${REPLAY} --backend host --delays --json --dtype ${dtype} ${ARGS}
                  OUTPUT_VARIABLE out RESULT_VARIABLE status)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "kvo-replay --dtype ${dtype} failed (${status}):\n${out}")
  endif()
  string(REGEX MATCH "{[^\n]*}[ \n]*$" json "${out}")
  string(JSON verified GET "${json}" verified)
  string(JSON h2d_${dtype} GET "${json}" h2d_bytes_last_step)
  string(JSON formula GET "${json}" model_h2d_bytes_per_step)
  if(NOT verified)
    message(FATAL_ERROR "kvo-replay --dtype ${dtype} did not verify:\n${json}")
  endif()
  if(NOT h2d_${dtype} EQUAL formula)
    message(FATAL_ERROR "--dtype ${dtype}: ${h2d_${dtype}} bytes moved, the formula says ${formula}")
  endif()
endforeach()
math(EXPR scaled "${h2d_${DTYPE}} * 1000")
math(EXPR limit "${PER_MILLE} * ${h2d_bf16}")
math(EXPR per_mille "${scaled} / ${h2d_bf16}")
message(STATUS "--dtype ${DTYPE} moved ${h2d_${DTYPE}} bytes in the last step, bf16 ${h2d_bf16}: "
               "${per_mille}/1000")
if(scaled GREATER limit)
  message(FATAL_ERROR "--dtype ${DTYPE} moved ${per_mille}/1000 of bf16's bytes, more than "
                      "${PER_MILLE}/1000")
endif()
