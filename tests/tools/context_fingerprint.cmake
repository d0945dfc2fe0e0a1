# A saved context is refused by a model of the same shape and tokenizer with other weights, and
# by one whose tokenizer differs; the model it was saved from loads it.
#   cmake -DGENERATE=kvo-generate -DDIR=bad_models -DOUT=dir -P context_fingerprint.cmake
set(context "${OUT}/fingerprint.kvo")
file(REMOVE "${context}")
function(generate expect_rc pattern)
  execute_process(COMMAND "${GENERATE}" --backend host --max-new 2 ${ARGN}
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL expect_rc OR NOT "${out}${err}" MATCHES "${pattern}")
    message(FATAL_ERROR "kvo-generate ${ARGN}: exit ${rc}, expected ${expect_rc} and /${pattern}/:\n${out}${err}")
  endif()
  if("${out}${err}" MATCHES "${NO_REPORT}")
    message(FATAL_ERROR "a sanitizer reported:\n${out}${err}")
  endif()
endfunction()
generate(0 "saved to" --model "${DIR}/text" --prompt "hello the" --save-context "${context}")
generate(1 "saved for another model: its fingerprint has 'weights_xxh3=[0-9a-f]+' where this model's has 'weights_xxh3=[0-9a-f]+'; nothing was loaded"
         --model "${DIR}/text_other" --load-context "${context}" --prompt "there")
# The tokenizer: one more merge changes its file, and the context is refused naming it.
file(COPY "${DIR}/text/config.json" "${DIR}/text/model.safetensors" "${DIR}/text/tokenizer.json"
     "${DIR}/text/tokenizer_config.json" DESTINATION "${OUT}/retokenized")
file(READ "${OUT}/retokenized/tokenizer.json" tok)
string(REPLACE "\"Ġt he\"" "\"Ġt he\",\n   \"Ġ h\"" tok "${tok}")
string(REPLACE "\"Ġthe\": 260" "\"Ġthe\": 260,\n   \"Ġh\": 262" tok "${tok}")
file(WRITE "${OUT}/retokenized/tokenizer.json" "${tok}")
generate(1 "its fingerprint has 'tokenizer_xxh3=[0-9a-f]+' where this model's has 'tokenizer_xxh3=[0-9a-f]+'"
         --model "${OUT}/retokenized" --load-context "${context}" --prompt "there")
generate(0 "restored from" --model "${DIR}/text" --load-context "${context}" --prompt "there")
message(STATUS "refused by other weights and another tokenizer, loaded by its own model")
