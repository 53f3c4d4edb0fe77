# The system image libraries behind ImageDecoder (src/ops/onnx/image/), found
# with pkg-config. Each entry: result prefix | pkg-config module | the Debian
# package that provides it (scripts/setup installs them). Defines the imported
# targets PkgConfig::TRANSMUTER_IMAGE_<prefix>; used by the build and by
# TransmuterConfig.cmake, whose static library links them.
find_package(PkgConfig REQUIRED)
set(_transmuter_image_libraries
  "JPEG|libjpeg|libjpeg62-turbo-dev"
  "PNG|libpng|libpng-dev"
  "TIFF|libtiff-4>=4.5|libtiff-dev"            # per-handle error handlers (TIFFOpenOptions)
  "WEBP|libwebp|libwebp-dev"
  "OPENJPEG|libopenjp2>=2.5|libopenjp2-7-dev")  # opj_decoder_set_strict_mode
set(TRANSMUTER_IMAGE_TARGETS "")
foreach(entry IN LISTS _transmuter_image_libraries)
  string(REPLACE "|" ";" fields "${entry}")
  list(GET fields 0 prefix)
  list(GET fields 1 module)
  list(GET fields 2 package)
  pkg_check_modules(TRANSMUTER_IMAGE_${prefix} QUIET IMPORTED_TARGET ${module})
  if(NOT TRANSMUTER_IMAGE_${prefix}_FOUND)
    message(FATAL_ERROR "pkg-config found no ${module} (ImageDecoder needs it): install the Debian package "
                        "${package}, e.g. with scripts/setup")
  endif()
  list(APPEND TRANSMUTER_IMAGE_TARGETS PkgConfig::TRANSMUTER_IMAGE_${prefix})
endforeach()
