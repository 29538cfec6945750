# zero_add_test(NAME name SOURCES a.cc b.cc [LABELS l...] [LIBS ...])
#   One gtest executable per module, discovered into CTest. Output lands in build/bin. Every test it holds is
#   also labelled with the executable's name, so `ctest -L '^engine_test$'` runs one executable's tests
#   (scripts/test.sh --sanitize thread selects its executables that way).
function(zero_add_test)
  cmake_parse_arguments(ZT "" "NAME;TIMEOUT" "SOURCES;LABELS;LIBS" ${ARGN})
  add_executable(${ZT_NAME} ${ZT_SOURCES})
  target_link_libraries(${ZT_NAME} PRIVATE zero::zero zero_test_support GTest::gtest GTest::gtest_main zero_warnings
                                            ${ZT_LIBS})
  if(NOT ZT_TIMEOUT)
    set(ZT_TIMEOUT 300)
  endif()
  # Several labels (the executable's name, `gpu`, `tolerance`) make a list, which reaches set_tests_properties
  # through three rounds of list splitting (gtest_discover_tests' argument, the discovery command's -D, the
  # discovery script), each taking one level of escapes: unescaped, only the first label stuck and the others
  # became stray arguments (`ctest -L gpu` matched nothing). Eight backslashes survive as one list (Unix Makefiles,
  # the generator scripts/build.sh uses; checked by `ctest -N -L tolerance`).
  string(REPEAT "\\" 8 _escape)
  string(REPLACE ";" "${_escape};" _labels "${ZT_NAME};${ZT_LABELS}")
  gtest_discover_tests(${ZT_NAME} DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT ${ZT_TIMEOUT} LABELS "${_labels}")
endfunction()

# Flags for translation units with hot element-wise loops: GCC vectorizes std::sqrt only without errno.
set(ZERO_VECTOR_FLAGS -fno-math-errno -fno-trapping-math)

# zero_add_layer(NAME layer [DEPS lower layers...] [SOURCES a.cc ...] [LIBS ...] [CUDA_SOURCES b.cc ...]
#                [CUDA_LIBS ...])
#   Called from src/<layer>/CMakeLists.txt: builds the layer as the OBJECT library zero_<layer> and adds its
#   objects to `zero`. The layer's private headers are included as "<layer>/...", resolved through an include
#   root of its own, build/layers/<layer>/, which holds a symlink to src/<l> for the layer itself and for every
#   layer in the transitive closure of DEPS, and nothing else: a higher layer's "<l>/..." is simply not there,
#   so including it fails to compile ("No such file or directory"). src/ itself is never an include directory
#   of the library. LIBS: third-party libraries this layer's sources use (PRIVATE, so they do not leak upward).
#   The layer's objects are added with $<TARGET_OBJECTS:...> rather than by linking, so the installed exports
#   hold `zero` and `zero::cuda` alone. Source-file properties set in the layer's folder apply to zero_<layer> as is.
#   CUDA_SOURCES (only with ZERO_HAVE_CUDA) are the layer's part of zero::cuda: they compile with the same include
#   root into zero_<layer>_cuda (into zero_<layer> itself when the layer has no SOURCES), linked with CUDA::cudart
#   and CUDA_LIBS, and their objects go to `zero_cuda_library` (libzero_cuda.a), never to `zero`, which therefore
#   references no CUDA or NCCL symbol (docs/internals/design.md, "Two libraries, one package").
function(zero_add_layer)
  cmake_parse_arguments(ZL "" "NAME" "DEPS;SOURCES;LIBS;CUDA_SOURCES;CUDA_LIBS" ${ARGN})
  set(target zero_${ZL_NAME})
  set(visible ${ZL_NAME})
  foreach(dep IN LISTS ZL_DEPS)
    if(NOT TARGET zero_${dep})
      message(FATAL_ERROR "layer ${ZL_NAME}: layer ${dep} does not exist yet (src/CMakeLists.txt adds the layers "
                          "bottom-up; a dependency on a higher layer is a cycle)")
    endif()
    get_target_property(dep_visible zero_${dep} ZERO_LAYER_VISIBLE)
    list(APPEND visible ${dep_visible})
  endforeach()
  list(REMOVE_DUPLICATES visible)
  list(SORT visible)

  # Rebuilt at every configure, so a layer that loses a dependency loses its link too. (REMOVE_RECURSE removes
  # the symlinks, not what they point to.)
  set(root ${PROJECT_BINARY_DIR}/layers/${ZL_NAME})
  file(REMOVE_RECURSE ${root})
  file(MAKE_DIRECTORY ${root})
  foreach(l IN LISTS visible)
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/src/${l} ${root}/${l} SYMBOLIC)
  endforeach()

  if(ZL_SOURCES)
    add_library(${target} OBJECT ${ZL_SOURCES})
    target_sources(zero PRIVATE $<TARGET_OBJECTS:${target}>)
    set(cuda_target ${target}_cuda)
  else()
    set(cuda_target ${target})  # a layer of zero::cuda alone (src/cuda)
  endif()
  if(ZL_CUDA_SOURCES)
    if(NOT TARGET zero_cuda_library)
      message(FATAL_ERROR "layer ${ZL_NAME}: CUDA_SOURCES without ZERO_HAVE_CUDA")
    endif()
    add_library(${cuda_target} OBJECT ${ZL_CUDA_SOURCES})
    target_include_directories(${cuda_target} PRIVATE ${root})
    target_link_libraries(${cuda_target} PRIVATE zero_layer_base CUDA::cudart ${ZL_LIBS} ${ZL_CUDA_LIBS})
    target_sources(zero_cuda_library PRIVATE $<TARGET_OBJECTS:${cuda_target}>)
  endif()
  set_target_properties(${target} PROPERTIES ZERO_LAYER_VISIBLE "${visible}" ZERO_LAYER_INCLUDE_ROOT ${root})
  target_include_directories(${target} PRIVATE ${root})
  target_link_libraries(${target} PRIVATE zero_layer_base ${ZL_LIBS})
endfunction()
