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

install(TARGETS kvrelay-coordinator kvrelay-worker kvrelay-dump kvrelay-sim
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

set(KVRELAY_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/kvrelay)
install(EXPORT kvrelayTargets NAMESPACE kvrelay:: FILE kvrelayTargets.cmake
        DESTINATION ${KVRELAY_CMAKE_DIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/kvrelayConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/kvrelayConfig.cmake
                              INSTALL_DESTINATION ${KVRELAY_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/kvrelayConfigVersion.cmake
                                 COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/kvrelayConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/kvrelayConfigVersion.cmake
        DESTINATION ${KVRELAY_CMAKE_DIR})

# Relocatable: the prefix is found from the .pc file's own place, so that
# `cmake --install --prefix` anywhere and the package at /usr both work.
file(RELATIVE_PATH KVRELAY_PC_TO_PREFIX ${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig ${CMAKE_INSTALL_PREFIX})
configure_file(${CMAKE_CURRENT_LIST_DIR}/kvrelay.pc.in ${CMAKE_CURRENT_BINARY_DIR}/kvrelay.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/kvrelay.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

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
  ")
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
")
install(FILES ${PROJECT_SOURCE_DIR}/tools/systemd/kvrelay.env
        DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/examples/containers
        DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples)
install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs)

# The Debian package: the whole install, its library dependencies found by
# dpkg-shlibdeps.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME kvrelay)
set(CPACK_PACKAGE_VENDOR kvrelay)
set(CPACK_PACKAGE_CONTACT "kvrelay maintainers <kvrelay@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "KV-cache transfer service for LLM inference")
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION
    "A coordinator and per-rank workers that move KV-cache blocks, layer by layer,\n between prefill and decode instances (shared memory, tcp, rdma) and between\n device and host tiers, with a C/C++/Python client library.")
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "python3")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
include(CPack)
