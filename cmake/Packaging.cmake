# `cmake --install` and the Debian package (CPack DEB). Included at the end of
# the top-level CMakeLists (it reads TORCH_DIR, SHARDLINE_WITH_CUDA and the
# CUDA runtime's and NCCL's directories found there). README "Installing".
#
# LibTorch is not a Debian package: the installed programs find it (and, built
# with CUDA, the wheel's CUDA runtime and NCCL) through their RUNPATH, in order:
#   1. $ORIGIN/../lib/shardline/site-packages/torch/lib (and .../nvidia/...):
#      /usr/lib/shardline/site-packages is where the operator links the
#      site-packages holding the pinned torch wheel, wherever it lives;
#   2. SHARDLINE_LIBTORCH_DIR (default: the build's wheel, TORCH_DIR/lib) and
#      the CUDA/NCCL directories at the same place relative to it.
set(SHARDLINE_LIBTORCH_DIR "${TORCH_DIR}/lib" CACHE PATH
    "torch/lib directory the installed programs look in (RUNPATH) after lib/shardline/site-packages")
set(SHARDLINE_INSTALL_SYSCONFDIR "/etc/shardline" CACHE PATH
    "where the units' environment files (coordinator.env, worker.env) are installed")

set(_shardline_private "lib/shardline")
set(_shardline_link "site-packages")
set(_install_rpath "$ORIGIN/../${_shardline_private}/${_shardline_link}/torch/lib")
set(_libtorch_dirs "${SHARDLINE_LIBTORCH_DIR}")
if(SHARDLINE_WITH_CUDA)
  get_filename_component(_site "${TORCH_DIR}/.." ABSOLUTE)
  foreach(_dir "${_cudart_dir}" "${_nccl_dir}")
    file(RELATIVE_PATH _from_site "${_site}" "${_dir}")
    file(RELATIVE_PATH _from_lib "${TORCH_DIR}/lib" "${_dir}")
    if(_from_site MATCHES "^\\.\\.")   # not the wheel's: keep where it was found
      list(APPEND _libtorch_dirs "${_dir}")
    else()
      list(APPEND _install_rpath "$ORIGIN/../${_shardline_private}/${_shardline_link}/${_from_site}")
      get_filename_component(_abs "${SHARDLINE_LIBTORCH_DIR}/${_from_lib}" ABSOLUTE)
      list(APPEND _libtorch_dirs "${_abs}")
    endif()
  endforeach()
endif()
list(APPEND _install_rpath ${_libtorch_dirs})
list(REMOVE_DUPLICATES _install_rpath)
set(SHARDLINE_INSTALL_RPATH "${_install_rpath}")  # read by tests/deploy/package_test.py

set(_shardline_programs shardline-coordinator shardline-worker shardline-train shardctl)
set_target_properties(${_shardline_programs} PROPERTIES INSTALL_RPATH "${SHARDLINE_INSTALL_RPATH}")
install(TARGETS ${_shardline_programs} RUNTIME DESTINATION bin)
# Empty: the operator's link to the torch wheel's site-packages goes here.
install(DIRECTORY DESTINATION "${_shardline_private}")

# systemd (deploy/systemd/README.md): units, the user, /etc/shardline; the env
# files the units read are conffiles, their pristine copies examples.
set(_sd "${CMAKE_SOURCE_DIR}/deploy/systemd")
install(FILES "${_sd}/shardline-coordinator.service" "${_sd}/shardline-worker@.service"
        DESTINATION lib/systemd/system)
install(FILES "${_sd}/shardline.sysusers" DESTINATION lib/sysusers.d RENAME shardline.conf)
install(FILES "${_sd}/shardline.tmpfiles" DESTINATION lib/tmpfiles.d RENAME shardline.conf)
install(FILES "${_sd}/coordinator.env" "${_sd}/worker.env" DESTINATION "${SHARDLINE_INSTALL_SYSCONFDIR}")
install(FILES "${_sd}/coordinator.env" "${_sd}/worker.env" DESTINATION share/doc/shardline/examples)
install(FILES "${_sd}/README.md" DESTINATION share/doc/shardline RENAME README.systemd.md)
install(FILES "${CMAKE_SOURCE_DIR}/README.md" DESTINATION share/doc/shardline)
# Prometheus and Grafana (README "Watching a job").
install(DIRECTORY "${CMAKE_SOURCE_DIR}/deploy/prometheus" "${CMAKE_SOURCE_DIR}/deploy/grafana"
        DESTINATION share/shardline)

# The package: cpack -G DEB in the build directory.
set(CPACK_GENERATOR "DEB")
set(CPACK_PACKAGE_NAME "shardline")
set(CPACK_PACKAGE_VERSION "${PROJECT_VERSION}")
set(CPACK_PACKAGE_VENDOR "Shardline")
set(CPACK_PACKAGE_CONTACT "Shardline maintainers <shardline@example.org>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "sharded data-parallel training service")
# The extended description (CPack puts the summary above it and indents it).
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION "Shardline trains models with sharded data parallelism over a cluster of
workers: shardline-coordinator schedules jobs and keeps their state,
shardline-worker runs ranks on a CUDA device or the CPU, shardctl submits and
follows jobs. Ships systemd units, a sysusers/tmpfiles pair and Prometheus and
Grafana files.

LibTorch is not packaged: link the site-packages holding the pinned torch
wheel as /usr/lib/shardline/site-packages (README, Installing).")
set(CPACK_PACKAGING_INSTALL_PREFIX "/usr")
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION "science")
set(CPACK_DEBIAN_PACKAGE_PRIORITY "optional")
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "https://example.org/shardline")
set(CPACK_DEBIAN_COMPRESSION_TYPE "gzip")
# Depends from dpkg-shlibdeps (dpkg-dev). LibTorch, the CUDA runtime and NCCL
# belong to no Debian package: CPack runs dpkg-shlibdeps with
# --ignore-missing-info, so they add no Depends (and fail nothing) once found,
# which the absolute RUNPATH entries and the private dirs below make sure of.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${_libtorch_dirs})
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "systemd")
configure_file("${CMAKE_SOURCE_DIR}/cmake/deb/postinst" "${CMAKE_BINARY_DIR}/deb/postinst" COPYONLY)
file(WRITE "${CMAKE_BINARY_DIR}/deb/conffiles"
     "${SHARDLINE_INSTALL_SYSCONFDIR}/coordinator.env\n${SHARDLINE_INSTALL_SYSCONFDIR}/worker.env\n")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA "${CMAKE_BINARY_DIR}/deb/postinst;${CMAKE_BINARY_DIR}/deb/conffiles")
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)
