# Fails unless README (a markdown file) holds EXAMPLE's whole text verbatim in a ```LANG block (LANG: cpp unless
# given).
if(NOT DEFINED LANG)
  set(LANG cpp)
endif()
file(READ ${README} readme)
file(READ ${EXAMPLE} example)
string(FIND "${readme}" "```${LANG}\n${example}```" pos)
if(pos EQUAL -1)
  message(FATAL_ERROR "${README} does not quote ${EXAMPLE} verbatim in a ```${LANG} block; paste the current file")
endif()
