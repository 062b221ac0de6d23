# RematSubsystems.cmake — the subsystems of src/ and the direction of their
# dependencies, which the configuration enforces.
#
# remat_subsystem_rules(<name> [OWNS <header>...] [USES <subsystem>...])
#   Declares the subsystem in src/<name>/. OWNS lists the public headers that
#   belong to it, as written in an #include ("remat/checkpoint.h"); an entry
#   ending in "/" owns every header under that folder. USES lists the
#   subsystems it may use, which must be declared before it; what they use may
#   be used too.
#
# remat_check_subsystems()
#   Once all are declared: every source and header in src/<name>/, and every
#   public header a subsystem owns, is read: each #include "..." must name
#     - a file of its own folder ("stores.h"),
#     - a file of a subsystem it may use ("checkpoint/recompute_context.h"), or
#     - a public header owned by itself or by a subsystem it may use.
#   Anything else stops the configuration, naming the file, the include and
#   what the subsystem may use. (Angle-bracket includes are other projects'.)
#
# remat_subsystem(<name> [SOURCES <file>...] [OWNS ...] [USES ...])
#   remat_subsystem_rules(), then the LibTorch target remat_<name>: a static
#   library of SOURCES (an interface library without them) that links the
#   subsystems of USES and LibTorch, includes include/ (public) and src/
#   (private, for "<subsystem>/<file>.h"), and is exported as remat::<name>.
#   The caller adds what is particular to one subsystem.

# The subsystems declared so far, what each may use (itself and, transitively,
# its USES) and who owns which public header ("<entry>=<subsystem>").
set_property(GLOBAL PROPERTY REMAT_SUBSYSTEMS "")
set_property(GLOBAL PROPERTY REMAT_HEADER_OWNERS "")

# The subsystem that owns public header <include> ("remat/..."), or "" if none.
function(_remat_header_owner include out_var)
  get_property(owners GLOBAL PROPERTY REMAT_HEADER_OWNERS)
  foreach(entry IN LISTS owners)
    string(REPLACE "=" ";" pair "${entry}")
    list(GET pair 0 header)
    list(GET pair 1 owner)
    if(header MATCHES "/$")
      string(LENGTH "${header}" length)
      string(SUBSTRING "${include}" 0 ${length} prefix)
      if(prefix STREQUAL header)
        set(${out_var} ${owner} PARENT_SCOPE)
        return()
      endif()
    elseif(include STREQUAL header)
      set(${out_var} ${owner} PARENT_SCOPE)
      return()
    endif()
  endforeach()
  set(${out_var} "" PARENT_SCOPE)
endfunction()

# Stops the configuration if <file> includes what <name> may not use.
function(_remat_check_includes name file)
  get_property(allowed GLOBAL PROPERTY REMAT_ALLOWED_${name})
  get_property(subsystems GLOBAL PROPERTY REMAT_SUBSYSTEMS)
  file(STRINGS "${file}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
  file(RELATIVE_PATH shown "${PROJECT_SOURCE_DIR}" "${file}")
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\".*" "\\1" include "${line}")
    if(include MATCHES "^remat/")
      _remat_header_owner("${include}" owner)
      if(owner STREQUAL "")
        set(why "a public header no subsystem owns (an umbrella header is for users)")
      endif()
    elseif(include MATCHES "/")
      string(REGEX REPLACE "/.*" "" owner "${include}")
      if(NOT owner IN_LIST subsystems)
        set(why "a folder that is no subsystem")
        set(owner "")
      endif()
    else()
      continue()  # a file of the including file's own folder
    endif()
    if(NOT owner STREQUAL "" AND owner IN_LIST allowed)
      continue()
    endif()
    if(NOT owner STREQUAL "")
      set(why "part of subsystem '${owner}'")
    endif()
    list(REMOVE_ITEM allowed ${name})
    string(REPLACE ";" ", " allowed_text "${allowed}")
    if(allowed_text STREQUAL "")
      set(allowed_text "nothing")
    endif()
    message(FATAL_ERROR "remat: ${shown} includes \"${include}\", ${why}; "
      "subsystem '${name}' may use only: ${allowed_text} (cmake/RematSubsystems.cmake)")
  endforeach()
endfunction()

function(remat_subsystem_rules name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "OWNS;USES;SOURCES")
  set(allowed ${name})
  get_property(subsystems GLOBAL PROPERTY REMAT_SUBSYSTEMS)
  foreach(used IN LISTS arg_USES)
    if(NOT used IN_LIST subsystems)
      message(FATAL_ERROR "remat: subsystem '${name}' uses '${used}', which is not "
        "declared before it")
    endif()
    get_property(used_allowed GLOBAL PROPERTY REMAT_ALLOWED_${used})
    list(APPEND allowed ${used_allowed})
  endforeach()
  list(REMOVE_DUPLICATES allowed)
  set_property(GLOBAL PROPERTY REMAT_ALLOWED_${name} ${allowed})
  set_property(GLOBAL APPEND PROPERTY REMAT_SUBSYSTEMS ${name})
  set(owned_files "")
  foreach(header IN LISTS arg_OWNS)
    set_property(GLOBAL APPEND PROPERTY REMAT_HEADER_OWNERS "${header}=${name}")
    if(header MATCHES "/$")
      file(GLOB_RECURSE under CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/include/${header}*.h")
      list(APPEND owned_files ${under})
    elseif(EXISTS "${PROJECT_SOURCE_DIR}/include/${header}")
      list(APPEND owned_files "${PROJECT_SOURCE_DIR}/include/${header}")
    endif()
  endforeach()
  set_property(GLOBAL PROPERTY REMAT_OWNED_FILES_${name} ${owned_files})
endfunction()

function(remat_check_subsystems)
  get_property(subsystems GLOBAL PROPERTY REMAT_SUBSYSTEMS)
  foreach(name IN LISTS subsystems)
    get_property(owned_files GLOBAL PROPERTY REMAT_OWNED_FILES_${name})
    file(GLOB own_files CONFIGURE_DEPENDS
      "${PROJECT_SOURCE_DIR}/src/${name}/*.cpp" "${PROJECT_SOURCE_DIR}/src/${name}/*.h")
    foreach(file IN LISTS own_files owned_files)
      _remat_check_includes(${name} "${file}")
    endforeach()
  endforeach()
endfunction()

function(remat_subsystem name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "OWNS;USES;SOURCES")
  remat_subsystem_rules(${name} OWNS ${arg_OWNS} USES ${arg_USES})
  set(target remat_${name})
  if(arg_SOURCES)
    add_library(${target} STATIC ${arg_SOURCES})
    set(scope PUBLIC)
    target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/src)
    target_link_libraries(${target} PRIVATE $<BUILD_INTERFACE:remat_warnings>)
    set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  else()
    add_library(${target} INTERFACE)
    set(scope INTERFACE)
  endif()
  add_library(remat::${name} ALIAS ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${name})
  target_include_directories(${target} ${scope}
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
    $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  set(used_targets "")
  foreach(used IN LISTS arg_USES)
    if(used STREQUAL "planner")
      list(APPEND used_targets remat_planner)
    else()
      list(APPEND used_targets remat_${used})
    endif()
  endforeach()
  target_link_libraries(${target} ${scope} ${used_targets} ${TORCH_LIBRARIES})
  # Users compile with at least the standard the LibTorch needs.
  target_compile_features(${target} ${scope} cxx_std_${REMAT_CXX_STANDARD})
  set_property(GLOBAL APPEND PROPERTY REMAT_EXPORTED_TARGETS ${target})
endfunction()
