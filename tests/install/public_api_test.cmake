# Script-mode check of the trainer's API (docs/design.md, "Which headers are stable"): the headers directly in
# HEADER_DIR (include/zero, or an installed prefix's; zero/advanced/ is not looked into) are the stable API, so
#   - none declares a building block that moved to zero/advanced/ or inside the library: the communicator's
#     strided collectives, staging sizes and op hash, the engine's gather counters, the CUDA kernels and the device
#     pool (those two headers must not be there at all);
#   - none declares `class Impl;` (or any nested class) where a user could name it: in a public section;
#   - none includes a zero/advanced/ header (the stable API must not depend on what may change);
#   - zero/zero.h includes every one of them and nothing else of zero's;
#   - GradStatsResult is defined once in the whole tree, advanced/ included.
# FEATURES_H: the generated features.h when HEADER_DIR is the source tree (it is generated into the build tree).
# Every violation is listed, then the script fails.
cmake_minimum_required(VERSION 3.25)
if(NOT IS_DIRECTORY "${HEADER_DIR}")
  message(FATAL_ERROR "HEADER_DIR '${HEADER_DIR}' is not a directory")
endif()

set(errors "")
file(GLOB headers RELATIVE ${HEADER_DIR} ${HEADER_DIR}/*.h)
if(FEATURES_H AND NOT EXISTS ${HEADER_DIR}/features.h)
  list(APPEND headers features.h)
endif()
list(SORT headers)
if(NOT "zero.h" IN_LIST headers OR NOT "engine.h" IN_LIST headers)
  message(FATAL_ERROR "HEADER_DIR '${HEADER_DIR}' holds no zero.h and engine.h: not zero's headers")
endif()

foreach(moved cuda_kernels.h device_memory.h)
  if(EXISTS ${HEADER_DIR}/${moved})
    string(APPEND errors "  zero/${moved} is in the stable API; it belongs in zero/advanced/\n")
  endif()
endforeach()

# Names that a trainer does not need, and where they live now.
set(moved_names
    "IssuedOpsHash|SupportsAllGatherStrided|AllGatherStrided|SupportsReduceScatterStrided|ReduceScatterStrided|ReduceScatterStagingBytes|AllReduceStagingBytes|cache_bytes\\(\\)|prefetch_gathers|demand_gathers|peak_live_elements|DevicePool|namespace zero::cuda")

foreach(h IN LISTS headers)
  if(h STREQUAL "features.h" AND FEATURES_H AND NOT EXISTS ${HEADER_DIR}/features.h)
    set(path ${FEATURES_H})
  else()
    set(path ${HEADER_DIR}/${h})
  endif()
  # One list element per line: the semicolons and square brackets of C++ would otherwise split or join elements.
  file(READ ${path} text)
  string(REPLACE ";" "<semicolon>" text "${text}")
  string(REPLACE "[" "<lbracket>" text "${text}")
  string(REPLACE "]" "<rbracket>" text "${text}")
  string(REPLACE "\n" ";" lines "${text}")
  set(n 0)
  set(access "")  # the access of the innermost class-like scope at column 0 or 2, as far as lines tell
  foreach(line IN LISTS lines)
    math(EXPR n "${n} + 1")
    # Comments may mention moved names (to say where they went); declarations may not.
    string(REGEX REPLACE "//.*$" "" code "${line}")
    if(code MATCHES "(^|[^A-Za-z_])(${moved_names})([^A-Za-z_]|$)")
      string(APPEND errors "  zero/${h}:${n}: declares '${CMAKE_MATCH_2}', a building block (zero/advanced/): ${line}\n")
    endif()
    if(code MATCHES "^#include \"zero/advanced/")
      string(APPEND errors "  zero/${h}:${n}: the stable API includes an advanced header: ${line}\n")
    endif()
    if(code MATCHES "^(class|struct) [A-Za-z_]+( final)?( : [^{]*)? {")
      if(CMAKE_MATCH_1 STREQUAL "class")
        set(access private)
      else()
        set(access public)
      endif()
    elseif(code MATCHES "^ (public|private|protected):")
      set(access ${CMAKE_MATCH_1})
    elseif(code MATCHES "^  class [A-Za-z_]+<semicolon>" AND access STREQUAL "public")
      string(APPEND errors "  zero/${h}:${n}: a nested class declared public (users could name it): ${line}\n")
    endif()
  endforeach()
endforeach()

# zero.h: exactly the stable headers.
file(STRINGS ${HEADER_DIR}/zero.h umbrella REGEX "^#include \"zero/")
set(included "")
foreach(line IN LISTS umbrella)
  string(REGEX REPLACE "^#include \"zero/([^\"]+)\".*" "\\1" inc "${line}")
  list(APPEND included ${inc})
endforeach()
# A component's header (torch.h: zero::torch, find_package(zero COMPONENTS torch)) is stable API but needs its
# component's dependency (libtorch), so zero.h, which every trainer includes, leaves it out.
set(component_headers torch.h)
foreach(h IN LISTS headers)
  if(NOT h STREQUAL "zero.h" AND NOT h IN_LIST included AND NOT h IN_LIST component_headers)
    string(APPEND errors "  zero/zero.h does not include zero/${h}, a header of the stable API\n")
  endif()
endforeach()
foreach(inc IN LISTS included)
  if(NOT inc IN_LIST headers)
    string(APPEND errors "  zero/zero.h includes zero/${inc}, which is not a header of the stable API\n")
  endif()
endforeach()

# One GradStatsResult.
file(GLOB_RECURSE all_headers ${HEADER_DIR}/*.h)
set(definitions 0)
foreach(path IN LISTS all_headers)
  file(STRINGS ${path} defs REGEX "^ *struct GradStatsResult *{")
  list(LENGTH defs k)
  math(EXPR definitions "${definitions} + ${k}")
endforeach()
if(NOT definitions EQUAL 1)
  string(APPEND errors "  struct GradStatsResult is defined ${definitions} times under zero/; one type serves host and device\n")
endif()

if(errors)
  message(FATAL_ERROR "the stable API (${HEADER_DIR}) holds what it must not:\n${errors}")
endif()
list(LENGTH headers count)
message(STATUS "public API: ${count} stable headers, none declares a building block")
