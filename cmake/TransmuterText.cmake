# The Rust static library of the text component (rust/: Hugging Face tokenizers behind a C ABI)
# as the imported target transmuter_text_rust, with the system libraries it needs: libonig
# (Debian's libonig-dev, found with pkg-config: the crate is built with RUSTONIG_SYSTEM_LIBONIG=1),
# threads, dl, m. Set TRANSMUTER_TEXT_LIBRARY to the archive first. Used by the build and by
# TransmuterConfig.cmake, whose static library links it.
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(TRANSMUTER_ONIG QUIET IMPORTED_TARGET oniguruma)
if(NOT TRANSMUTER_ONIG_FOUND)
  message(FATAL_ERROR "pkg-config found no oniguruma (the tokenizers' regex engine): install the Debian "
                      "package libonig-dev, e.g. with scripts/setup, or configure with -DTRANSMUTER_TEXT=OFF")
endif()
if(NOT TARGET transmuter_text_rust)
  add_library(transmuter_text_rust STATIC IMPORTED)
  set_target_properties(transmuter_text_rust PROPERTIES
    IMPORTED_LOCATION "${TRANSMUTER_TEXT_LIBRARY}"
    INTERFACE_LINK_LIBRARIES "PkgConfig::TRANSMUTER_ONIG;Threads::Threads;${CMAKE_DL_LIBS};m")
endif()
