#include "backend/cpu/blas.h"

#include <dlfcn.h>

#include <cctype>
#include <cstdlib>
#include <mutex>
#include <string>

#include "core/status.h"

#ifndef KEEL_OPENBLAS_PATH
#error "KEEL_OPENBLAS_PATH must name the OpenBLAS (OpenMP build) shared library"
#endif

namespace keel::blas {
namespace {

// cblas enum values (cblas.h); declared here so keel needs no OpenBLAS headers or link step.
constexpr int kCblasRowMajor = 101;
constexpr int kCblasNoTrans = 111;
constexpr int kCblasTrans = 112;

using SgemmFn = void (*)(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                         const float* a, int lda, const float* b, int ldb, float beta, float* c,
                         int ldc);
using SetNumThreadsFn = void (*)(int);
using GetStringFn = char* (*)();

struct OpenBlas {
  SgemmFn sgemm = nullptr;
  SetNumThreadsFn set_num_threads = nullptr;
  GetStringFn get_config = nullptr;
  GetStringFn get_corename = nullptr;
  std::string description;
};

OpenBlas g_blas;
std::once_flag g_once;

// OpenBLAS kernel families that use AVX-512.
bool IsAvx512Family(const std::string& core) {
  std::string c;
  for (char ch : core) c.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(ch))));
  return c == "SKYLAKEX" || c == "COOPERLAKE" || c == "SAPPHIRERAPIDS";
}

void* Resolve(void* handle, const char* name) {
  void* sym = dlsym(handle, name);
  if (sym == nullptr) {
    throw KeelError(Status::Internal(std::string("OpenBLAS at ") + KEEL_OPENBLAS_PATH +
                                     " lacks the symbol " + name +
                                     "; install libopenblas0-openmp (or run scripts/setup.sh)"));
  }
  return sym;
}

void Load() {
  const char* path = KEEL_OPENBLAS_PATH;
  // OPENBLAS_CORETYPE is read once, when the library initialises, so it must be set before the
  // dlopen. If something else in the process already loaded OpenBLAS, the choice was made there.
  bool already_loaded = false;
  if (void* h = dlopen(path, RTLD_NOW | RTLD_NOLOAD); h != nullptr) {
    already_loaded = true;
    dlclose(h);  // RTLD_NOLOAD still took a reference
  }
  std::string why;
  const char* forced = std::getenv("KEEL_OPENBLAS_CORETYPE");
  const char* env_core = std::getenv("OPENBLAS_CORETYPE");
  const bool avx512 = __builtin_cpu_supports("avx512f");
  if (already_loaded) {
    why = "OpenBLAS was already loaded in this process, so keel could not choose its kernels";
  } else if (forced != nullptr && *forced != '\0') {
    setenv("OPENBLAS_CORETYPE", forced, 1);
    why = std::string("KEEL_OPENBLAS_CORETYPE=") + forced + " from the environment";
  } else if (avx512 && (env_core == nullptr || !IsAvx512Family(env_core))) {
    // OpenBLAS 0.3.21 detects AVX-512 CPUs it does not know (AMD Zen 4) as Zen/Haswell and leaves
    // AVX-512 unused: 218 vs 415 GFLOP/s on a 1024^3 sgemm with 2 threads, measured on Zen 4.
    // Machine images also pin OPENBLAS_CORETYPE=Haswell as a workaround for that detection.
    why = env_core == nullptr
              ? std::string(
                    "set OPENBLAS_CORETYPE=SKYLAKEX because this CPU has AVX-512 and "
                    "OpenBLAS 0.3.21 does not detect it")
              : std::string("replaced OPENBLAS_CORETYPE=") + env_core +
                    " from the environment by SKYLAKEX because this CPU has AVX-512 (about 2x "
                    "faster GEMMs measured on Zen 4)";
    why += "; set KEEL_OPENBLAS_CORETYPE=NAME to force a kernel family";
    setenv("OPENBLAS_CORETYPE", "SKYLAKEX", 1);
  } else if (env_core != nullptr) {
    why = std::string("OPENBLAS_CORETYPE=") + env_core + " from the environment";
  } else {
    why = "OpenBLAS's own CPU detection (no AVX-512); set KEEL_OPENBLAS_CORETYPE to override";
  }

  void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    throw KeelError(Status::IOError(std::string("cannot load OpenBLAS from ") + path + " (" +
                                    (err ? err : "unknown error") +
                                    "); run scripts/setup.sh, or install the OpenMP build: apt-get "
                                    "install libopenblas0-openmp"));
  }
  OpenBlas b;
  b.sgemm = reinterpret_cast<SgemmFn>(Resolve(handle, "cblas_sgemm"));
  b.set_num_threads =
      reinterpret_cast<SetNumThreadsFn>(Resolve(handle, "openblas_set_num_threads"));
  b.get_config = reinterpret_cast<GetStringFn>(Resolve(handle, "openblas_get_config"));
  b.get_corename = reinterpret_cast<GetStringFn>(Resolve(handle, "openblas_get_corename"));

  // get_config looks like "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY USE_OPENMP Zen MAX_THREADS=64".
  std::string config = b.get_config ? b.get_config() : "";
  std::string version = config;
  if (size_t sp = config.find(' '); sp != std::string::npos) {
    size_t end = config.find(' ', sp + 1);
    version = config.substr(0, end);
  }
  bool openmp = config.find("USE_OPENMP") != std::string::npos;
  const char* core = b.get_corename();
  b.description = version + (openmp ? " (OpenMP)" : " (pthreads, not the OpenMP build)") +
                  ", kernels " + (core ? core : "unknown") + ": " + why;
  g_blas = std::move(b);
}

}  // namespace

void Init() {
  std::call_once(g_once, Load);
}

const std::string& Description() {
  Init();
  return g_blas.description;
}

void SetNumThreads(int n) {
  Init();
  g_blas.set_num_threads(n);
}

void Sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
           const float* B, int ldb, float beta, float* C, int ldc) {
  Init();
  if (M == 0 || N == 0) return;
  g_blas.sgemm(kCblasRowMajor, trans_a ? kCblasTrans : kCblasNoTrans,
               trans_b ? kCblasTrans : kCblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace keel::blas
