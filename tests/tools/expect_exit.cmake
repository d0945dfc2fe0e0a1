# Runs a tool and checks its exit status and what it printed (stdout and stderr together):
#   cmake -DCOMMAND="tool|arg|arg..." -DEXIT=N [-DMATCH=regex] [-DNO_MATCH=regex]
#         [-DABSENT=path] [-DEMPTY_DIR=path] [-DPRINTABLE=1] [-DFILE_SIZE_LIMIT=blocks]
#         [-DADDRESS_LIMIT=KiB] [-DFIFO=path] [-DSTDIN=path] [-DSTDOUT=path]
#         [-DNO_REPORT=regex]
#         -P expect_exit.cmake
# Arguments are separated by '|' ("<empty>" is an empty one). ABSENT names a path that must not exist afterwards, EMPTY_DIR
# a directory that must hold nothing; NO_REPORT is what a sanitizer's report looks like;
# PRINTABLE=1 requires that nothing but printable ASCII, tabs and newlines was printed;
# FILE_SIZE_LIMIT runs the tool with files limited to that many 512-byte blocks (a write past it
# raises SIGXFSZ, which the tool must ignore to report EFBIG); ADDRESS_LIMIT under ulimit -v;
# FIFO makes a FIFO with no writer at that path first, which must still be one afterwards (a
# tool that opened it for reading without O_NONBLOCK would hang: give the test a TIMEOUT).
# STDIN is read as the tool's standard input; STDOUT sends the tool's standard output there (/dev/full: a tool must report that it could not
# write it); only its standard error is then matched.
string(REPLACE "|" ";" command "${COMMAND}")
if(DEFINED FIFO)
  file(REMOVE "${FIFO}")
  execute_process(COMMAND mkfifo "${FIFO}" RESULT_VARIABLE made)
  if(NOT made EQUAL 0)
    message(FATAL_ERROR "cannot make the FIFO ${FIFO}")
  endif()
endif()
set(limits "")
if(DEFINED FILE_SIZE_LIMIT)
  string(APPEND limits "ulimit -f ${FILE_SIZE_LIMIT} && ")
endif()
if(DEFINED ADDRESS_LIMIT)
  string(APPEND limits "ulimit -v ${ADDRESS_LIMIT} && ")
endif()
# An empty argument cannot live in a CMake list: "<empty>" stands for one, and the command then
# goes through sh with every argument quoted.
string(FIND "|${COMMAND}|" "|<empty>|" empty_at)
set(redirect "")
if(DEFINED STDIN)
  string(APPEND redirect " <'${STDIN}'")
endif()
if(DEFINED STDOUT)
  string(APPEND redirect " >'${STDOUT}'")
endif()
if(limits OR redirect OR NOT empty_at EQUAL -1)
  list(JOIN command "' '" quoted)
  string(REPLACE "'<empty>'" "''" quoted "'${quoted}'")
  set(command sh -c "${limits}exec ${quoted}${redirect}")
endif()
execute_process(COMMAND ${command} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
set(all "${out}${err}")
# A sanitizer's report fails the run whatever the exit status (a leak is reported at exit).
if(DEFINED NO_REPORT AND all MATCHES "${NO_REPORT}")
  message(FATAL_ERROR "a sanitizer reported:\n${all}")
endif()
if(NOT rc STREQUAL EXIT)
  message(FATAL_ERROR "exit status ${rc}, expected ${EXIT}:\n${all}")
endif()
if(DEFINED MATCH AND NOT all MATCHES "${MATCH}")
  message(FATAL_ERROR "the output lacks /${MATCH}/:\n${all}")
endif()
if(DEFINED NO_MATCH AND all MATCHES "${NO_MATCH}")
  message(FATAL_ERROR "the output has /${NO_MATCH}/:\n${all}")
endif()
if(DEFINED ABSENT AND EXISTS "${ABSENT}")
  message(FATAL_ERROR "${ABSENT} was left behind")
endif()
if(DEFINED EMPTY_DIR)
  file(GLOB left "${EMPTY_DIR}/*")
  if(left)
    message(FATAL_ERROR "left behind in ${EMPTY_DIR}: ${left}")
  endif()
endif()
if(DEFINED FIFO)
  execute_process(COMMAND test -p "${FIFO}" RESULT_VARIABLE still)
  if(NOT still EQUAL 0)
    message(FATAL_ERROR "${FIFO} is no longer a FIFO: the tool replaced it")
  endif()
  file(REMOVE "${FIFO}")
endif()
if(PRINTABLE AND all MATCHES "[^\t\n -~]")
  message(FATAL_ERROR "unprintable bytes were printed:\n${all}")
endif()
message(STATUS "exit ${rc} as expected:\n${all}")
