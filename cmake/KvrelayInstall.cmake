# What `cmake --install` puts where (docs/operating.md: Installing), and the Debian
# package CPack makes of it (`cpack -G DEB` in the build directory):
#   bin/      kvrelay-coordinator, kvrelay-worker, kvrelay-dump, kvrelay-sim
#   lib/      libkvrelay.so.0 (the C ABI and the C++ client), its namelink
#   include/  kvrelay.h and kvrelay/*.h (client/include and the vocabulary in include/, nothing else)
#   lib/cmake/kvrelay/  find_package(kvrelay CONFIG): kvrelay::client, kvrelay::c
#   lib/pkgconfig/kvrelay.pc
#   lib/python3/dist-packages/ (under /usr; lib/python3.X/dist-packages elsewhere)
#             the Python module and its stubs
#   lib/systemd/system/  kvrelay.service, kvrelay@.service
#   share/doc/kvrelay/   README.md, docs/, examples/kvrelay.env (the units' flags),
#                        examples/containers/ (docs/containers.md)
include(CMakePackageConfigHelpers)

# Components, one Debian package each (the end of this file):
#   service  kvrelay           the programs, units, docs and examples
#   lib      libkvrelay0       libkvrelay.so.0
#   dev      libkvrelay-dev    headers, the .so namelink, CMake and pkg-config files
#   python   python3-kvrelay   the Python module and its stubs
# `cmake --install` without --component installs them all.
install(TARGETS kvrelay-coordinator kvrelay-worker kvrelay-dump kvrelay-sim
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT service)

# Manual pages, made from each program's --help by help2man (Debian's
# help2man; tools/setup.sh installs it). Without help2man there are none.
find_program(KVRELAY_HELP2MAN help2man)
if(KVRELAY_HELP2MAN)
  set(_man_pages)
  foreach(entry
      "kvrelay-coordinator=run one kvrelay instance: its shared memory and its rank workers"
      "kvrelay-worker=one tensor-parallel rank of a kvrelay instance (the coordinator starts it)"
      "kvrelay-dump=show a kvrelay instance's state from its shared memory"
      "kvrelay-sim=drive kvrelay instances with simulated engines")
    string(REPLACE "=" ";" entry "${entry}")
    list(GET entry 0 program)
    list(GET entry 1 name)
    set(page ${CMAKE_CURRENT_BINARY_DIR}/man/${program}.1.gz)
    add_custom_command(
      OUTPUT ${page}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_CURRENT_BINARY_DIR}/man
      COMMAND ${KVRELAY_HELP2MAN} --no-info --no-discard-stderr --name "${name}"
              --output ${CMAKE_CURRENT_BINARY_DIR}/man/${program}.1 $<TARGET_FILE:${program}>
      COMMAND gzip -9nf ${CMAKE_CURRENT_BINARY_DIR}/man/${program}.1
      DEPENDS ${program}
      COMMENT "Manual page of ${program}"
      VERBATIM)
    list(APPEND _man_pages ${page})
  endforeach()
  add_custom_target(kvrelay_man_pages ALL DEPENDS ${_man_pages})
  install(FILES ${_man_pages} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT service)
endif()

set(KVRELAY_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/kvrelay)
install(EXPORT kvrelayTargets NAMESPACE kvrelay:: FILE kvrelayTargets.cmake
        DESTINATION ${KVRELAY_CMAKE_DIR} COMPONENT dev)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/kvrelayConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/kvrelayConfig.cmake
                              INSTALL_DESTINATION ${KVRELAY_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/kvrelayConfigVersion.cmake
                                 COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/kvrelayConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/kvrelayConfigVersion.cmake
        DESTINATION ${KVRELAY_CMAKE_DIR} COMPONENT dev)

# Relocatable: the prefix is found from the .pc file's own place, so that
# `cmake --install --prefix` anywhere and the package at /usr both work.
file(RELATIVE_PATH KVRELAY_PC_TO_PREFIX ${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig ${CMAKE_INSTALL_PREFIX})
configure_file(${CMAKE_CURRENT_LIST_DIR}/kvrelay.pc.in ${CMAKE_CURRENT_BINARY_DIR}/kvrelay.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/kvrelay.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig
        COMPONENT dev)

# The Python module goes where Debian's python3 looks under the prefix: under
# /usr lib/python3/dist-packages, elsewhere (/usr/local) lib/python3.X/
# dist-packages. Known at install time only (CPack installs under /usr).
set(KVRELAY_PYTHON_INSTALL_DIR "" CACHE STRING
    "where the Python module installs, relative to the prefix (empty: as Debian's python3 looks)")
if(KVRELAY_HAVE_PYTHON)
  install(CODE "
    set(dir \"${KVRELAY_PYTHON_INSTALL_DIR}\")
    if(NOT dir AND CMAKE_INSTALL_PREFIX STREQUAL \"/usr\")
      set(dir lib/python3/dist-packages)
    elseif(NOT dir)
      set(dir lib/python${Python3_VERSION_MAJOR}.${Python3_VERSION_MINOR}/dist-packages)
    endif()
    file(INSTALL $<TARGET_FILE:kvrelay_python> ${PROJECT_SOURCE_DIR}/client/python/kvrelay.pyi
         DESTINATION \"\${CMAKE_INSTALL_PREFIX}/\${dir}\")
    # The same stubs as a PEP 561 stub package, where mypy looks.
    file(INSTALL ${PROJECT_SOURCE_DIR}/client/python/kvrelay.pyi
         DESTINATION \"\${CMAKE_INSTALL_PREFIX}/\${dir}/kvrelay-stubs\" RENAME __init__.pyi)
  " COMPONENT python)
endif()

# systemd: the units name the binaries under the prefix they are installed
# to (known only at install time: `cmake --install --prefix`, or CPack's /usr).
install(CODE "
  set(KVRELAY_BINDIR \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}\")
  set(KVRELAY_DOCDIR \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_DOCDIR}\")
  foreach(unit kvrelay.service kvrelay@.service)
    set(to \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/lib/systemd/system/\${unit}\")
    message(STATUS \"Installing: \${to}\")
    configure_file(${PROJECT_SOURCE_DIR}/tools/systemd/\${unit}.in \${to} @ONLY)
  endforeach()
" COMPONENT service)
install(FILES ${PROJECT_SOURCE_DIR}/tools/systemd/kvrelay.env
        DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples COMPONENT service)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/examples/containers
        DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples COMPONENT service)
install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT service)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs
        COMPONENT service)

# The Debian packages, one per component (`cpack -G DEB`), as Debian splits a
# library: each with its copyright and changelog, stripped, with the debug
# info in -dbgsym packages; libkvrelay0 with a shlibs file (so that
# dpkg-shlibdeps works for an engine packaged against it) and an ldconfig
# trigger; kvrelay with maintainer scripts for /etc/kvrelay and its units
# (tools/package/). tests/install/deb_test.sh runs lintian on them.
set(KVRELAY_DEB_NAMES service=kvrelay lib=libkvrelay0 dev=libkvrelay-dev python=python3-kvrelay)
execute_process(COMMAND gzip -9nc ${PROJECT_SOURCE_DIR}/tools/package/changelog
                OUTPUT_FILE ${CMAKE_CURRENT_BINARY_DIR}/changelog.gz)
foreach(pair IN LISTS KVRELAY_DEB_NAMES)
  string(REPLACE "=" ";" pair ${pair})
  list(GET pair 0 component)
  list(GET pair 1 package)
  install(FILES ${PROJECT_SOURCE_DIR}/tools/package/copyright ${CMAKE_CURRENT_BINARY_DIR}/changelog.gz
          DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/${package} COMPONENT ${component})
  if(EXISTS ${PROJECT_SOURCE_DIR}/tools/package/${package}.lintian-overrides)
    install(FILES ${PROJECT_SOURCE_DIR}/tools/package/${package}.lintian-overrides
            DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/lintian/overrides RENAME ${package}
            COMPONENT ${component})
  endif()
  string(TOUPPER ${component} COMPONENT)
  set(CPACK_DEBIAN_${COMPONENT}_PACKAGE_NAME ${package})
endforeach()

set(CPACK_GENERATOR DEB)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL service lib dev)
if(KVRELAY_HAVE_PYTHON)
  list(APPEND CPACK_COMPONENTS_ALL python)
endif()
set(CPACK_PACKAGE_NAME kvrelay)
set(CPACK_PACKAGE_VENDOR kvrelay)
# Each package's synopsis is the first line of its component's description;
# CPackDeb prepends the package-wide summary unless it is CPack's default.
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_NAME} built using CMake")
# example.org: a placeholder until the project has a list of its own; a
# packager sets their own address here.
set(CPACK_PACKAGE_CONTACT "kvrelay maintainers <kvrelay@example.org>" CACHE STRING
    "the Debian packages' Maintainer")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
set(CPACK_DEBIAN_DEBUGINFO_PACKAGE ON)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_DEBIAN_ENABLE_COMPONENT_DEPENDS OFF)

# A package's control files (tools/package/<package>.<file>), copied under
# the names dpkg wants (postinst, triggers, ...) for CPackDeb.
function(kvrelay_deb_control_files COMPONENT package)
  set(files)
  foreach(file IN LISTS ARGN)
    set(to ${CMAKE_CURRENT_BINARY_DIR}/deb-${package}/${file})
    configure_file(${PROJECT_SOURCE_DIR}/tools/package/${package}.${file} ${to} COPYONLY)
    list(APPEND files ${to})
  endforeach()
  set(CPACK_DEBIAN_${COMPONENT}_PACKAGE_CONTROL_EXTRA ${files} PARENT_SCOPE)
endfunction()

set(CPACK_DEBIAN_SERVICE_PACKAGE_SECTION net)
set(CPACK_COMPONENT_SERVICE_DESCRIPTION "KV-cache transfer service for LLM inference
A coordinator and per-rank workers that move KV-cache blocks, layer by
layer, between prefill and decode instances (shared memory, tcp, rdma) and
between device and host tiers, with kvrelay-dump to inspect an instance
and kvrelay-sim to exercise one. systemd units: kvrelay.service and
kvrelay@.service, configured in /etc/kvrelay.")
kvrelay_deb_control_files(SERVICE kvrelay postinst prerm postrm)

set(CPACK_DEBIAN_LIB_PACKAGE_SECTION libs)
set(CPACK_COMPONENT_LIB_DESCRIPTION "KV-cache transfer service for LLM inference - client library
libkvrelay.so.0: the C ABI and the C++ client with which an inference
engine submits KV-cache transfers and swaps to a kvrelay instance, signals
its layers and reads one completion per request.")
# The ldconfig trigger, and maintainer scripts that do nothing else: without
# them CPackDeb would write ones that call ldconfig.
kvrelay_deb_control_files(LIB libkvrelay0 triggers postinst postrm)

set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "libkvrelay0 (= ${PROJECT_VERSION})")
set(CPACK_COMPONENT_DEV_DESCRIPTION "KV-cache transfer service for LLM inference - development files
Headers (kvrelay.h, kvrelay/*.h), the libkvrelay.so link, the CMake package
(find_package(kvrelay): kvrelay::client, kvrelay::c) and kvrelay.pc, to
build an engine against libkvrelay.")

set(CPACK_DEBIAN_PYTHON_PACKAGE_SECTION python)
set(CPACK_DEBIAN_PYTHON_PACKAGE_DEPENDS "python3")
set(CPACK_COMPONENT_PYTHON_DESCRIPTION "KV-cache transfer service for LLM inference - Python module
The module kvrelay (Client, Pool, Completion) for Debian's python3, with
its type stubs (kvrelay-stubs), for engines written in Python.")
include(CPack)
