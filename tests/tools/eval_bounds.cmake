# kvo-eval on a short real text (SmolLM2-135M, the first 512 tokens of the GPL): bf16, int8 and
# fp8 K/V stay close to the f32 reference. Bounds that catch a broken quantizer (a wrong scale, a
# wrong rounding, rows read as the wrong dtype all cost tens of percent), looser than the accuracy
# targets, which kvo-eval --targets checks on 4K tokens (bench/results/): quantized K/V moves
# top-1 agreement by about 1 % from one chunk size to another on 1K tokens.
#   cmake -DEVAL=kvo-eval -DMODEL=dir -DOUT=dir -P eval_bounds.cmake
set(json ${OUT}/eval-bounds.json)
execute_process(COMMAND ${EVAL} --model ${MODEL} --text /usr/share/common-licenses/GPL-3
                        --tokens 512 --generate 16 --kv-dtypes f32,bf16,int8,fp8 --json ${json}
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "kvo-eval failed (${status}):\n${out}\n${err}")
endif()
message("${out}")
file(READ ${json} report)
# dtype -> most perplexity change against f32 (percent), least top-1 agreement with f32
set(bounds_bf16 0.2 0.99)
set(bounds_int8 1.0 0.96)
set(bounds_fp8 2.0 0.90)
string(JSON readings LENGTH ${report} readings)
math(EXPR last "${readings} - 1")
set(checked "")
foreach(i RANGE ${last})
  string(JSON dtype GET ${report} readings ${i} kv_dtype)
  if(NOT DEFINED bounds_${dtype})
    continue()
  endif()
  list(GET bounds_${dtype} 0 most_change)
  list(GET bounds_${dtype} 1 least_top1)
  string(JSON change GET ${report} readings ${i} perplexity_change_percent_vs_reference)
  string(JSON top1 GET ${report} readings ${i} top1_agreement_vs_reference)
  # if(LESS/GREATER) compares the decimals as numbers.
  if(change LESS -${most_change} OR change GREATER ${most_change} OR top1 LESS ${least_top1})
    message(FATAL_ERROR "K/V ${dtype}: perplexity change ${change} % (at most ${most_change}), "
                        "top-1 agreement ${top1} (at least ${least_top1}) against f32")
  endif()
  list(APPEND checked ${dtype})
endforeach()
list(LENGTH checked count)
if(NOT count EQUAL 3)
  message(FATAL_ERROR "expected readings of bf16, int8 and fp8, got: ${checked}")
endif()
message("eval bounds: ${checked} within")
