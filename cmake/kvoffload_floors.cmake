# Floors: what each part of the tree may include (cmake/floors.txt, which tools/check_floors.py
# reads too). A target sees include/ (the public API, through the kvoffload targets) and the
# folders the floors of its sources allow, through a view of the source tree that holds those
# folders alone: symbolic links in the build tree, made when configuring. An include of anything
# else fails to compile, naming the header; tools/check_floors.py checks the same rules file by
# file (within one target too), and what each object file calls.
#   kvo_floor(<target> <home folder>...)     e.g. kvo_floor(kvo_model model)
# The view is every folder the rows at or below the home folders may include.
include_guard(GLOBAL)

file(STRINGS ${CMAKE_CURRENT_LIST_DIR}/floors.txt _kvo_floor_lines REGEX "^[0-9]")
set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
             ${CMAKE_CURRENT_LIST_DIR}/floors.txt)

function(kvo_floor target)
  set(view ${PROJECT_BINARY_DIR}/floors/${target})
  file(REMOVE_RECURSE ${view})
  file(MAKE_DIRECTORY ${view})
  set(folders)
  foreach(home IN LISTS ARGN)
    if(NOT IS_DIRECTORY ${PROJECT_SOURCE_DIR}/${home})
      message(FATAL_ERROR "kvo_floor(${target}): no folder ${home}")
    endif()
    set(found FALSE)
    foreach(line IN LISTS _kvo_floor_lines)
      string(REPLACE "|" ";" cells "${line}")
      list(GET cells 1 folder)
      list(GET cells 2 allowed)
      string(STRIP "${folder}" folder)
      string(STRIP "${allowed}" allowed)
      if(folder MATCHES "^${home}/")
        set(found TRUE)
        separate_arguments(allowed UNIX_COMMAND "${allowed}")
        list(APPEND folders ${allowed})
      endif()
    endforeach()
    if(NOT found)
      message(FATAL_ERROR "kvo_floor(${target}): ${home} is in no row of cmake/floors.txt")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES folders)
  # A folder inside another the view holds is in the view already.
  set(outer ${folders})
  foreach(folder IN LISTS folders)
    foreach(other IN LISTS folders)
      if(NOT other STREQUAL folder AND folder MATCHES "^${other}")
        list(REMOVE_ITEM outer ${folder})
      endif()
    endforeach()
  endforeach()
  foreach(folder IN LISTS outer)
    string(REGEX REPLACE "/$" "" folder "${folder}")
    if(folder STREQUAL "include/kvoffload")
      continue()  # the public API comes with the kvoffload targets
    endif()
    get_filename_component(parent ${view}/${folder} DIRECTORY)
    file(MAKE_DIRECTORY ${parent})
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/${folder} ${view}/${folder} SYMBOLIC)
  endforeach()
  target_include_directories(${target} PRIVATE ${view})
endfunction()
