# Floors: what each part of the tree may include (the table in README.md's "Layout"). A target
# sees include/ (the public API, through the kvoffload targets) and the folders its floor allows,
# through a view of the source tree that holds those folders alone: symbolic links in the build
# tree, made when configuring. An include of anything else fails to compile, naming the header;
# tools/check_floors.py checks the same rules file by file (within one target too).
#   kvo_floor(<target> <folder>...)       e.g. kvo_floor(kvo_model model offload/util)
include_guard(GLOBAL)

function(kvo_floor target)
  set(view ${PROJECT_BINARY_DIR}/floors/${target})
  file(REMOVE_RECURSE ${view})
  file(MAKE_DIRECTORY ${view})
  foreach(folder IN LISTS ARGN)
    if(NOT IS_DIRECTORY ${PROJECT_SOURCE_DIR}/${folder})
      message(FATAL_ERROR "kvo_floor(${target}): no folder ${folder}")
    endif()
    get_filename_component(parent ${view}/${folder} DIRECTORY)
    file(MAKE_DIRECTORY ${parent})
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/${folder} ${view}/${folder} SYMBOLIC)
  endforeach()
  target_include_directories(${target} PRIVATE ${view})
endfunction()
