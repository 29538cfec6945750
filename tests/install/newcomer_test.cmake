# The newcomer path (script mode): install zero into a temporary prefix, configure a project that builds the
# README's two examples verbatim with only find_package(zero) and CMAKE_PREFIX_PATH, and run each as 1 process and
# as 4 under the installed zero-run; the ShardedOptimizer example then resumes its 4-rank checkpoint as 1 process.
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
execute_process(COMMAND ${CMAKE_COMMAND} --install ${ZERO_BINARY_DIR} --prefix ${prefix} RESULT_VARIABLE rc OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "install failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${PROJECT_DIR} -B ${WORK_DIR}/build -DCMAKE_PREFIX_PATH=${prefix}
                        -DCMAKE_BUILD_TYPE=Release -DEXAMPLES_DIR=${EXAMPLES_DIR}
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the newcomer's project did not configure: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/build RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the README's examples did not build against the install: ${rc}")
endif()

# Runs COMMAND; fails unless it exits 0 and its output matches every regex in EXPECT.
function(run_expect name)
  cmake_parse_arguments(R "" "" "COMMAND;EXPECT;REJECT" ${ARGN})
  execute_process(COMMAND ${R_COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out TIMEOUT 300)
  message("${name}:\n${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${name} failed: ${rc}")
  endif()
  foreach(re IN LISTS R_EXPECT)
    if(NOT out MATCHES "${re}")
      message(FATAL_ERROR "${name}: no line matches '${re}'")
    endif()
  endforeach()
  foreach(re IN LISTS R_REJECT)
    if(out MATCHES "${re}")
      message(FATAL_ERROR "${name}: a line matches '${re}', which it must not")
    endif()
  endforeach()
endfunction()

set(run ${prefix}/bin/zero-run -n 4 --timeout 240 --)
run_expect("mlp, 1 process" COMMAND ${WORK_DIR}/build/mlp EXPECT "step 160  loss [0-9.]+  grad_norm [0-9.]+  \\(world 1\\)")
run_expect("mlp, 4 processes" COMMAND ${run} ${WORK_DIR}/build/mlp
           EXPECT "\\[r0\\] step 160  loss [0-9.]+  grad_norm [0-9.]+  \\(world 4\\)")
run_expect("sharded_mlp, 1 process" COMMAND ${WORK_DIR}/build/sharded_mlp EXPECT "step 160  loss")
run_expect("sharded_mlp, 4 processes, saving" COMMAND ${run} ${WORK_DIR}/build/sharded_mlp ${WORK_DIR}/ckpt
           EXPECT "\\[r0\\] step 160  loss")
file(READ ${WORK_DIR}/ckpt/latest latest)
if(NOT latest MATCHES "^step-00000200")
  message(FATAL_ERROR "the 4-process run's latest checkpoint is '${latest}', not step-00000200")
endif()
# Resumed at step 200 of 200 from the 4-rank checkpoint, at world 1: nothing left to train, no error.
run_expect("sharded_mlp, 1 process, resuming" COMMAND ${WORK_DIR}/build/sharded_mlp ${WORK_DIR}/ckpt REJECT "step [0-9]+  loss")
