# Highway (portable SIMD with run-time dispatch) for the own CPU kernels of
# src/kernels/cpu/, found with pkg-config; Debian package libhwy-dev (installed
# by scripts/setup). Defines PkgConfig::TRANSMUTER_HWY; used by the build and by
# TransmuterConfig.cmake, whose static library links it.
find_package(PkgConfig REQUIRED)
pkg_check_modules(TRANSMUTER_HWY QUIET IMPORTED_TARGET libhwy>=1.0)
if(NOT TRANSMUTER_HWY_FOUND)
  message(FATAL_ERROR "pkg-config found no libhwy (the CPU kernels need Highway): install the Debian package "
                      "libhwy-dev, e.g. with scripts/setup")
endif()
