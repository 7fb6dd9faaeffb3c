# Install layout (`cmake --install build --prefix P`):
#   P/include/nccl.h, P/include/loom/*.h       public headers
#   P/lib/libloom.so*, P/lib/libnccl.so*       the two shared libraries (libnccl.so.2 is the
#                                              NCCL drop-in, SONAME libnccl.so.2)
#   P/lib/cmake/loom/                          find_package(loom): loom::loom, loom::nccl
#   P/lib/pkgconfig/loom.pc                    pkg-config --cflags --libs loom
#   P/bin/                                     perf binaries and tools (installed by their folders)
#
# Only the two shared libraries are exported. The static folder libraries (loom_common,
# loom_comm, ...) are linked into them whole and PRIVATE, so they are not part of the
# installed interface and are not installed.
include(CMakePackageConfigHelpers)

set(LOOM_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/loom)

install(FILES ${PROJECT_SOURCE_DIR}/include/nccl.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/loom/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/loom
        FILES_MATCHING PATTERN "*.h" PATTERN "*.hpp")

# Imported names: loom::loom (libloom.so) and loom::nccl (libnccl.so.2), the same names the
# build tree uses through its ALIAS targets.
set_target_properties(loom_shared PROPERTIES EXPORT_NAME loom)
set_target_properties(nccl_shared PROPERTIES EXPORT_NAME nccl)

install(TARGETS loom_shared nccl_shared
  EXPORT loomTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} NAMELINK_COMPONENT Development
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

install(EXPORT loomTargets
  NAMESPACE loom::
  FILE loomTargets.cmake
  DESTINATION ${LOOM_INSTALL_CMAKEDIR})

configure_package_config_file(
  ${CMAKE_CURRENT_LIST_DIR}/loomConfig.cmake.in
  ${PROJECT_BINARY_DIR}/cmake/loomConfig.cmake
  INSTALL_DESTINATION ${LOOM_INSTALL_CMAKEDIR}
  PATH_VARS CMAKE_INSTALL_INCLUDEDIR)
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/cmake/loomConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)
install(FILES
  ${PROJECT_BINARY_DIR}/cmake/loomConfig.cmake
  ${PROJECT_BINARY_DIR}/cmake/loomConfigVersion.cmake
  DESTINATION ${LOOM_INSTALL_CMAKEDIR})

# pkg-config. Paths are computed at install time relative to the prefix given to
# `cmake --install --prefix`, so the file is right whatever prefix is chosen then.
# First pass (configure time) fills in everything but the prefix, which stays a placeholder.
set(LOOM_PC_PREFIX "@LOOM_PC_PREFIX@")
configure_file(${CMAKE_CURRENT_LIST_DIR}/loom.pc.in ${PROJECT_BINARY_DIR}/cmake/loom.pc.in @ONLY)
install(CODE "
  set(LOOM_PC_PREFIX \"\${CMAKE_INSTALL_PREFIX}\")
  configure_file(\"${PROJECT_BINARY_DIR}/cmake/loom.pc.in\"
                 \"${PROJECT_BINARY_DIR}/cmake/loom.pc\" @ONLY)
")
install(FILES ${PROJECT_BINARY_DIR}/cmake/loom.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# Installed executables (perf binaries, tools) find P/lib/libnccl.so.2 through a relative
# RUNPATH, so P/bin/all_reduce_perf runs without LD_LIBRARY_PATH; LD_LIBRARY_PATH still takes
# precedence over RUNPATH, so another libnccl.so.2 can be swapped in.
foreach(dir perf_tests tools)
  if(IS_DIRECTORY ${PROJECT_SOURCE_DIR}/${dir})
    get_property(targets DIRECTORY ${PROJECT_SOURCE_DIR}/${dir} PROPERTY BUILDSYSTEM_TARGETS)
    foreach(t ${targets})
      get_target_property(type ${t} TYPE)
      get_target_property(rpath ${t} INSTALL_RPATH)
      if(type STREQUAL "EXECUTABLE" AND NOT rpath)
        set_target_properties(${t} PROPERTIES INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
      endif()
    endforeach()
  endif()
endforeach()
