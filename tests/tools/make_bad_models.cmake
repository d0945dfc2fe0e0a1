# Writes the model directories the refusal tests read: a small good model from kvo-make-model,
# and copies of it whose config or files lie. Usage:
#   cmake -DMAKE_MODEL=path/kvo-make-model -DDIR=out -P make_bad_models.cmake
file(REMOVE_RECURSE "${DIR}")
file(MAKE_DIRECTORY "${DIR}")
execute_process(COMMAND "${MAKE_MODEL}" --out "${DIR}/good" --layers 2 --hidden 64
                        --intermediate 128 --heads 4 --kv-heads 2 --head-dim 16 --vocab 300
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kvo-make-model failed (${rc})")
endif()
file(READ "${DIR}/good/config.json" config)

# name  field  value: a copy of the good model whose config.json says `field: value`.
function(variant name field value)
  string(REGEX REPLACE "\"${field}\": [0-9]+" "\"${field}\": ${value}" changed "${config}")
  if(changed STREQUAL config)
    message(FATAL_ERROR "no ${field} in config.json")
  endif()
  file(MAKE_DIRECTORY "${DIR}/${name}")
  file(WRITE "${DIR}/${name}/config.json" "${changed}")
  file(COPY "${DIR}/good/model.safetensors" DESTINATION "${DIR}/${name}")
endfunction()
variant(layers1000 num_hidden_layers 1000)
variant(layers100000 num_hidden_layers 100000)
variant(vocab1e9 vocab_size 1e9)
variant(vocab2p40 vocab_size 1099511627776)
variant(intermediate2p40 intermediate_size 1099511627776)

# Weights that are a directory, and an index that points outside the model.
file(MAKE_DIRECTORY "${DIR}/weights_dir/model.safetensors")
file(WRITE "${DIR}/weights_dir/config.json" "${config}")
file(MAKE_DIRECTORY "${DIR}/escape")
file(WRITE "${DIR}/escape/config.json" "${config}")
file(WRITE "${DIR}/escape/model.safetensors.index.json"
     "{\"weight_map\": {\"model.norm.weight\": \"../../../../other/model.safetensors\"}}")

# Token files: an empty id, and binary bytes (a PNG signature and a terminal escape).
file(WRITE "${DIR}/empty_id.txt" "1,2,,3\n")
string(ASCII 137 27 png)
file(WRITE "${DIR}/binary.txt" "${png}PNG\r\n${png}[2J 1 2\n")

# Text: the good model with a small byte-level BPE tokenizer (tests/tools/data), and a model of the
# same shape and tokenizer whose weights come from another seed (a saved context of one must not
# load into the other).
get_filename_component(_data "${CMAKE_CURRENT_LIST_DIR}/data" ABSOLUTE)
foreach(name text text_other)
  set(seed 1)
  if(name STREQUAL "text_other")
    set(seed 2)
  endif()
  execute_process(COMMAND "${MAKE_MODEL}" --out "${DIR}/${name}" --layers 2 --hidden 64
                          --intermediate 128 --heads 4 --kv-heads 2 --head-dim 16 --vocab 300
                          --seed ${seed}
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "kvo-make-model failed (${rc})")
  endif()
  file(COPY "${_data}/tokenizer.json" "${_data}/tokenizer_config.json" DESTINATION "${DIR}/${name}")
endforeach()
# The same weights with a tokenizer of more ids than the model's 300.
file(MAKE_DIRECTORY "${DIR}/text_small_vocab")
file(READ "${DIR}/text/config.json" text_config)
string(REPLACE "\"vocab_size\": 300" "\"vocab_size\": 200" small "${text_config}")
file(WRITE "${DIR}/text_small_vocab/config.json" "${small}")
execute_process(COMMAND "${MAKE_MODEL}" --out "${DIR}/text_small_vocab_weights" --layers 2
                        --hidden 64 --intermediate 128 --heads 4 --kv-heads 2 --head-dim 16
                        --vocab 200 RESULT_VARIABLE rc)
file(RENAME "${DIR}/text_small_vocab_weights/model.safetensors"
     "${DIR}/text_small_vocab/model.safetensors")
file(REMOVE_RECURSE "${DIR}/text_small_vocab_weights")
file(COPY "${_data}/tokenizer.json" "${_data}/tokenizer_config.json"
     DESTINATION "${DIR}/text_small_vocab")
# A document for --prompt-file.
file(WRITE "${DIR}/document.txt" "hello there, the small model reads this text\n")
