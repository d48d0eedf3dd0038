# One static library per source folder, and the arrows between them.
#
#   shardline_library(NAME FOLDER dir SOURCES a.cc ... [DEPENDS lib ...] [PRIVATE_DEPENDS lib ...])
#
# The folder's headers may include those of the folders its DEPENDS and
# PRIVATE_DEPENDS libraries sit in (transitively), and nothing else of the
# project's: shardline_write_layers() writes the arrows to
# ${CMAKE_BINARY_DIR}/layers.txt, and the `layering` test
# (tests/unit/layering_test.py) fails on any include that runs against them.
# A call to a library that is not a dependency also fails to link, so the
# CMake targets are the one place the arrows are declared.
function(shardline_library name)
  cmake_parse_arguments(L "" "FOLDER" "SOURCES;DEPENDS;PRIVATE_DEPENDS" ${ARGN})
  if(NOT L_FOLDER)
    message(FATAL_ERROR "shardline_library(${name}): FOLDER is required")
  endif()
  add_library(${name} STATIC ${L_SOURCES})
  target_include_directories(${name} PUBLIC ${CMAKE_SOURCE_DIR} "${CMAKE_BINARY_DIR}/generated")
  target_link_libraries(${name} PUBLIC ${L_DEPENDS} PRIVATE ${L_PRIVATE_DEPENDS})
  set_property(GLOBAL APPEND PROPERTY SHARDLINE_LIBRARIES ${name})
  set_property(GLOBAL PROPERTY SHARDLINE_FOLDER_${name} ${L_FOLDER})
  set_property(GLOBAL PROPERTY SHARDLINE_DEPS_${name} ${L_DEPENDS} ${L_PRIVATE_DEPENDS})
endfunction()

# Writes "folder: library dep_library ..." per library (dependencies outside
# the project are listed too; the test keeps the project's).
function(shardline_write_layers)
  get_property(libs GLOBAL PROPERTY SHARDLINE_LIBRARIES)
  set(text "")
  foreach(lib ${libs})
    get_property(folder GLOBAL PROPERTY SHARDLINE_FOLDER_${lib})
    get_property(deps GLOBAL PROPERTY SHARDLINE_DEPS_${lib})
    set(dep_folders "")
    foreach(dep ${deps})
      get_property(df GLOBAL PROPERTY SHARDLINE_FOLDER_${dep})
      if(df)
        list(APPEND dep_folders ${df})
      endif()
    endforeach()
    list(JOIN dep_folders " " dep_text)
    string(APPEND text "${folder}: ${dep_text}\n")
  endforeach()
  file(WRITE "${CMAKE_BINARY_DIR}/layers.txt" "${text}")
endfunction()
