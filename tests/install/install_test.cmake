# Script-mode test: cmake --install into a temp prefix, check what was installed, then configure, build and run
# the consumer (under the installed zero-run, on two ranks, when the tools were built).
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
execute_process(COMMAND ${CMAKE_COMMAND} --install ${ZERO_BINARY_DIR} --prefix ${prefix}
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "install failed: ${rc}")
endif()

# The generated features.h sits beside the other headers; its template does not.
if(NOT EXISTS ${prefix}/include/zero/features.h)
  message(FATAL_ERROR "include/zero/features.h was not installed")
endif()
if(EXISTS ${prefix}/include/zero/features.h.in)
  message(FATAL_ERROR "include/zero/features.h.in was installed")
endif()
file(STRINGS ${prefix}/include/zero/features.h have_cuda REGEX "^#define ZERO_HAVE_CUDA ")
if(ZERO_HAVE_CUDA)
  set(want "#define ZERO_HAVE_CUDA 1")
else()
  set(want "#define ZERO_HAVE_CUDA 0")
endif()
if(NOT have_cuda STREQUAL want)
  message(FATAL_ERROR "installed features.h says '${have_cuda}', the build has ZERO_HAVE_CUDA=${ZERO_HAVE_CUDA}")
endif()
if(EXPECT_TOOLS)
  foreach(tool zero-run zero-config)
    if(NOT EXISTS ${prefix}/bin/${tool})
      message(FATAL_ERROR "bin/${tool} was not installed")
    endif()
  endforeach()
endif()

# The consumer enables C++ only: a CUDA-enabled install must find CUDA and NCCL by itself (zeroConfig.cmake's
# find_dependency; FindCUDAToolkit looks in /usr/local/cuda), with no hint from here.
execute_process(COMMAND ${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${WORK_DIR}/build
                        -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "consumer configure failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/build RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "consumer build failed: ${rc}")
endif()

# The CUDA part of the package is a component: asking for it succeeds exactly when the install has it.
execute_process(COMMAND ${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${WORK_DIR}/build-cuda
                        -DCMAKE_PREFIX_PATH=${prefix} -DZERO_CONSUMER_COMPONENTS=cuda
                RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
if(ZERO_HAVE_CUDA AND NOT rc EQUAL 0)
  message(FATAL_ERROR "find_package(zero COMPONENTS cuda) failed on a CUDA-enabled install")
elseif(NOT ZERO_HAVE_CUDA AND rc EQUAL 0)
  message(FATAL_ERROR "find_package(zero COMPONENTS cuda) succeeded on an install built without CUDA")
endif()

if(EXPECT_TOOLS)
  set(run ${prefix}/bin/zero-run -n 2 --timeout 120 -- ${WORK_DIR}/build/app)
else()
  set(run ${WORK_DIR}/build/app)
endif()
execute_process(COMMAND ${run} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
message("${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "consumer run failed: ${rc}")
endif()
if(EXPECT_TOOLS AND NOT out MATCHES "\\[r0\\] zero consumer: rank 0 of 2, all-reduced sum = 3"
                OR EXPECT_TOOLS AND NOT out MATCHES "\\[r1\\] zero consumer: rank 1 of 2, all-reduced sum = 3")
  message(FATAL_ERROR "the consumer did not run as two ranks under zero-run")
endif()
