# A saved context belongs to the one model it was computed by: kvo-generate refuses it, naming
# the first field that differs and both values, under other weights of the same shape, another
# tokenizer, any field of config.json that shapes the keys (the same weights), and other load
# options (weights quantized at load, activations in 8 bits); the model it was saved from loads
# it; and a context whose fingerprint predates the full one is refused as such.
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
generate(1 "saved for another model: weights.xxh3 is [0-9a-f]+ in the file and [0-9a-f]+ here; nothing was loaded"
         --model "${DIR}/text_other" --load-context "${context}" --prompt "there")

# A copy of the model with one file changed.
function(variant name)
  file(REMOVE_RECURSE "${OUT}/${name}")
  file(COPY "${DIR}/text/config.json" "${DIR}/text/model.safetensors" "${DIR}/text/tokenizer.json"
       "${DIR}/text/tokenizer_config.json" DESTINATION "${OUT}/${name}")
endfunction()

# The tokenizer: one more merge changes its file, and the context is refused naming it.
variant(retokenized)
file(READ "${OUT}/retokenized/tokenizer.json" tok)
string(REPLACE "\"Ġt he\"" "\"Ġt he\",\n   \"Ġ h\"" tok "${tok}")
string(REPLACE "\"Ġthe\": 260" "\"Ġthe\": 260,\n   \"Ġh\": 262" tok "${tok}")
file(WRITE "${OUT}/retokenized/tokenizer.json" "${tok}")
generate(1 "saved for another model: tokenizer.xxh3 is [0-9a-f]+ in the file and [0-9a-f]+ here"
         --model "${OUT}/retokenized" --load-context "${context}" --prompt "there")

# Each field of config.json that shapes the keys, changed alone over the same weights.
set(changes
  "\"rope_theta\": 500000.0|\"rope_theta\": 500001.0|config.rope_parameters.rope_theta is 500000 in the file and 500001 here"
  "\"rms_norm_eps\": 1e-05|\"rms_norm_eps\": 1.0000004e-05|config.rms_norm_eps is 1e-05 in the file and 1.0000004e-05 here"
  "\"max_position_embeddings\": 131072|\"max_position_embeddings\": 65536|config.max_position_embeddings is 131072 in the file and 65536 here"
  "\"factor\": 8.0|\"factor\": 4.0|config.rope_parameters.factor is 8 in the file and 4 here"
  "\"low_freq_factor\": 1.0|\"low_freq_factor\": 2.0|config.rope_parameters.low_freq_factor is 1 in the file and 2 here"
  "\"high_freq_factor\": 4.0|\"high_freq_factor\": 5.0|config.rope_parameters.high_freq_factor is 4 in the file and 5 here"
  "\"original_max_position_embeddings\": 8192|\"original_max_position_embeddings\": 4096|config.rope_parameters.original_max_position_embeddings is 8192 in the file and 4096 here"
  "\"rope_type\": \"llama3\"|\"rope_type\": \"default\"|config.rope_parameters.factor is 8 in the file and absent here")
set(n 0)
foreach(change IN LISTS changes)
  string(REPLACE "|" ";" parts "${change}")
  list(GET parts 0 from)
  list(GET parts 1 to)
  list(GET parts 2 expected)
  math(EXPR n "${n} + 1")
  variant(field${n})
  file(READ "${OUT}/field${n}/config.json" config)
  string(FIND "${config}" "${from}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "the model's config.json holds no ${from}:\n${config}")
  endif()
  string(REPLACE "${from}" "${to}" config "${config}")
  file(WRITE "${OUT}/field${n}/config.json" "${config}")
  string(REPLACE "." "\\." expected "${expected}")
  generate(1 "saved for another model: ${expected}; nothing was loaded"
           --model "${OUT}/field${n}" --load-context "${context}" --prompt "there")
endforeach()

# The load options: matrices quantized at load, and the activations quantized with them.
generate(1 "saved for another model: load.weights is f32 in the file and f32; 15 matrices in GGUF blocks \\(15 Q8_0\\) here"
         --model "${DIR}/text" --weights q8_0 --load-context "${context}" --prompt "there")
generate(1 "load.weights is f32 in the file and f32; 15 matrices in GGUF blocks \\(15 Q8_0\\) \\(int8: one scale per row\\) here"
         --model "${DIR}/text" --weights int8 --load-context "${context}" --prompt "there")
set(q8 "${OUT}/fingerprint_q8.kvo")
generate(0 "saved to" --model "${DIR}/text" --weights q8_0 --activations q8 --prompt "hello the"
         --save-context "${q8}")
generate(1 "saved for another model: load.activations is q8 in the file and f32 here"
         --model "${DIR}/text" --weights q8_0 --load-context "${q8}" --prompt "there")
generate(0 "restored from" --model "${DIR}/text" --weights q8_0 --activations q8
         --load-context "${q8}" --prompt "there")

generate(0 "restored from" --model "${DIR}/text" --load-context "${context}" --prompt "there")
message(STATUS "refused by other weights, another tokenizer, ${n} config fields and 3 load "
               "options, each named; loaded by its own model")
