// Link check (CTest `blas_is_openblas`), not a benchmark: in a binary linked to
// `transmuter`, the global symbol cblas_sgemm must be defined by OpenBLAS.
//
// libmlx.so leaves cblas_sgemm undefined and lists the wheel's reference
// libblas as its own dependency. The dynamic linker binds it to the first
// definition in the global search order (breadth-first: the executable, its
// direct dependencies, then theirs), which is also what dlsym(RTLD_DEFAULT)
// returns. The `transmuter` target makes OpenBLAS a direct dependency with
// --no-as-needed (nothing in the binary calls it by name), so it comes before
// the reference libblas. If that regresses, MLX's fp32 matmul silently falls
// back to reference BLAS (docs/performance.md).

#include <dlfcn.h>

#include <filesystem>
#include <iostream>
#include <string>

#include "mlx/mlx.h"

namespace mx = mlx::core;

int main() {
  // An fp32 matmul through MLX, so that libmlx and the reference libblas it depends on are
  // loaded, as in any real binary: the check is then about which of the two wins.
  float total = mx::sum(mx::matmul(mx::ones({2, 3}), mx::ones({3, 2}))).item<float>();
  if (total != 12.0f) {
    std::cerr << "FAIL: sum(matmul(ones(2,3), ones(3,2))) = " << total << ", expected 12\n";
    return 1;
  }
  void* address = dlsym(RTLD_DEFAULT, "cblas_sgemm");
  if (address == nullptr) {
    std::cerr << "FAIL: cblas_sgemm is not defined in this process\n";
    return 1;
  }
  Dl_info info{};
  if (dladdr(address, &info) == 0 || info.dli_fname == nullptr) {
    std::cerr << "FAIL: dladdr cannot name the library that defines cblas_sgemm\n";
    return 1;
  }
  std::error_code ec;
  std::string library = std::filesystem::canonical(info.dli_fname, ec).string();
  if (ec) library = info.dli_fname;
  // Identify OpenBLAS by what it exports, not by file name: Debian also ships OpenBLAS
  // as openblas-pthread/libblas.so.3, and the wheel's reference BLAS is libblas-<hash>.so.
  void* handle = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  void* config = handle ? dlsym(handle, "openblas_get_config") : nullptr;
  Dl_info config_info{};
  bool same_library = config != nullptr && dladdr(config, &config_info) != 0 &&
                      std::string(config_info.dli_fname) == std::string(info.dli_fname);
  if (handle) dlclose(handle);
  if (!same_library) {
    std::cerr << "FAIL: cblas_sgemm resolves to " << library
              << ", which is not OpenBLAS (no openblas_get_config)\n";
    return 1;
  }
  std::cout << "OK: cblas_sgemm resolves to " << library << "\n";
  return 0;
}
