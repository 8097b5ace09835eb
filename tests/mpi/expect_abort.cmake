# Runs an MPI job that must fail: cmake -DMPIEXEC=... -DNP=... -DEXE=... -DMODE=sleep|kill -DMAX_S=...
#   [-DEXPECT="substring;substring"] -P expect_abort.cmake
# Passes when the job exits non-zero within MAX_S seconds and its stderr contains every EXPECT substring.
foreach(v MPIEXEC NP EXE MODE MAX_S)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "expect_abort.cmake: ${v} is not set")
  endif()
endforeach()
string(TIMESTAMP t0 "%s" UTC)
execute_process(
  COMMAND ${MPIEXEC} --oversubscribe --allow-run-as-root -np ${NP} ${EXE} ${MODE}
  TIMEOUT ${MAX_S}
  RESULT_VARIABLE rv
  OUTPUT_VARIABLE out
  ERROR_VARIABLE err)
string(TIMESTAMP t1 "%s" UTC)
math(EXPR elapsed "${t1} - ${t0}")
message(STATUS "job ended after ${elapsed} s with '${rv}'\n--- stderr ---\n${err}\n--- stdout ---\n${out}")
if(rv MATCHES "timeout" OR elapsed GREATER_EQUAL MAX_S)
  message(FATAL_ERROR "the job did not end within ${MAX_S} s: the hang was not detected")
endif()
if(rv STREQUAL "0")
  message(FATAL_ERROR "the job exited 0 although rank 1 never joined the collective")
endif()
foreach(s IN LISTS EXPECT)
  string(FIND "${err}" "${s}" pos)
  if(pos EQUAL -1)
    message(FATAL_ERROR "stderr does not contain '${s}'")
  endif()
endforeach()
