# zero_add_test(NAME name SOURCES a.cc b.cc [LABELS l...] [LIBS ...])
#   One gtest executable per module, discovered into CTest. Output lands in build/bin.
function(zero_add_test)
  cmake_parse_arguments(ZT "" "NAME;TIMEOUT" "SOURCES;LABELS;LIBS" ${ARGN})
  add_executable(${ZT_NAME} ${ZT_SOURCES})
  target_link_libraries(${ZT_NAME} PRIVATE zero::zero zero_test_support GTest::gtest GTest::gtest_main zero_warnings
                                            ${ZT_LIBS})
  if(NOT ZT_TIMEOUT)
    set(ZT_TIMEOUT 300)
  endif()
  set(_props TIMEOUT ${ZT_TIMEOUT})
  if(ZT_LABELS)
    list(APPEND _props LABELS "${ZT_LABELS}")
  endif()
  gtest_discover_tests(${ZT_NAME} DISCOVERY_TIMEOUT 60 PROPERTIES ${_props})
endfunction()

# Flags for translation units with hot element-wise loops: GCC vectorizes std::sqrt only without errno.
set(ZERO_VECTOR_FLAGS -fno-math-errno -fno-trapping-math)
