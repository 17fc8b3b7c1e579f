#include "backend/cpu/dnnl_gemm.h"

#include <fmt/format.h>

#include <dnnl.hpp>
#include <map>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/status.h"

namespace keel::dnnl_gemm {
namespace {

using Tag = dnnl::memory::format_tag;
using Dt = dnnl::memory::data_type;

struct Key {
  bool trans_a, trans_b, accumulate, bias;
  int M, N, K;
  bool operator<(const Key& o) const {
    return std::tie(trans_a, trans_b, accumulate, bias, M, N, K) <
           std::tie(o.trans_a, o.trans_b, o.accumulate, o.bias, o.M, o.N, o.K);
  }
};

struct Gemm {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
};

// Primitives are built once per shape (about a millisecond each) and reused: a model has a few
// dozen distinct shapes.
class Library {
 public:
  Library() : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {}

  const Gemm& Get(const Key& k) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(k);
    if (it != cache_.end()) return it->second;
    // A stored (M,K) with trans_a is the (K,M) matrix A read transposed: format tag ba.
    dnnl::memory::desc a({k.M, k.K}, Dt::bf16, k.trans_a ? Tag::ba : Tag::ab);
    dnnl::memory::desc b({k.K, k.N}, Dt::bf16, k.trans_b ? Tag::ba : Tag::ab);
    dnnl::memory::desc c({k.M, k.N}, Dt::f32, Tag::ab);
    dnnl::primitive_attr attr;
    // Our scratchpad, kept between calls: oneDNN's own is allocated and freed at every product
    // (mmap, munmap and fresh page faults: ~9% of a bf16 GPT-2 step measured).
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (k.accumulate) {
      dnnl::post_ops po;
      po.append_sum(1.0f);
      attr.set_post_ops(po);
    }
    try {
      Gemm g;
      if (k.bias) {
        const dnnl::memory::desc bias({1, k.N}, Dt::f32, Tag::ab);
        g.pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, bias, c), attr, engine_);
      } else {
        g.pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, engine_);
      }
      g.prim = dnnl::matmul(g.pd);
      return cache_.emplace(k, std::move(g)).first->second;
    } catch (const dnnl::error& e) {
      throw KeelError(Status::Internal(
          fmt::format("oneDNN has no bf16 matmul for {}x{}x{} on this CPU ({}); train in fp32 "
                      "(drop --bf16) or use a CPU with AVX-512",
                      k.M, k.N, k.K, e.what())));
    }
  }

  // One product at a time: the scratchpad and the stream are shared by the process, and ranks run
  // as threads of one process in the tensor-parallel tests (uncontended in a training process).
  void Run(const Gemm& g, const uint16_t* A, const uint16_t* B, float* C, const float* bias) {
    std::lock_guard<std::mutex> lock(run_mu_);
    dnnl::memory am(g.pd.src_desc(), engine_, const_cast<uint16_t*>(A));
    dnnl::memory bm(g.pd.weights_desc(), engine_, const_cast<uint16_t*>(B));
    dnnl::memory cm(g.pd.dst_desc(), engine_, C);
    const dnnl::memory::desc sd = g.pd.scratchpad_desc();
    if (scratch_.size() < sd.get_size()) scratch_.resize(sd.get_size());
    dnnl::memory sm(sd, engine_, scratch_.data());
    std::unordered_map<int, dnnl::memory> args = {
        {DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}, {DNNL_ARG_SCRATCHPAD, sm}};
    if (bias != nullptr) {
      args[DNNL_ARG_BIAS] = dnnl::memory(g.pd.bias_desc(), engine_, const_cast<float*>(bias));
    }
    g.prim.execute(stream_, args);
    stream_.wait();
  }

 private:
  dnnl::engine engine_;
  dnnl::stream stream_;
  std::mutex mu_, run_mu_;
  std::map<Key, Gemm> cache_;
  std::vector<uint8_t> scratch_;  // grown to the largest scratchpad asked for, reused
};

Library& Lib() {
  static Library lib;
  return lib;
}

struct Probe {
  bool available = false;
  std::string description;
};

// A small product tells which implementation oneDNN picks on this CPU.
const Probe& GetProbe() {
  static const Probe probe = [] {
    Probe p;
    const dnnl_version_t* v = dnnl_version();
    const std::string version = fmt::format("oneDNN {}.{}.{}", v->major, v->minor, v->patch);
    try {
      const Gemm& g = Lib().Get(Key{false, true, false, false, 64, 64, 64});
      const std::string impl = g.pd.impl_info_str();
      p.available = impl.find("bf16") != std::string::npos;
      p.description = version + " matmul " + impl;
    } catch (const KeelError& e) {
      p.description = version + ": " + e.what();
    }
    return p;
  }();
  return probe;
}

}  // namespace

void GemmBf16(bool trans_a, bool trans_b, int M, int N, int K, const uint16_t* A, const uint16_t* B,
              float* C, bool accumulate, const float* bias) {
  if (M == 0 || N == 0) return;
  Library& lib = Lib();
  lib.Run(lib.Get(Key{trans_a, trans_b, accumulate, bias != nullptr, M, N, K}), A, B, C, bias);
}

bool Available() {
  return GetProbe().available;
}

const std::string& Description() {
  return GetProbe().description;
}

}  // namespace keel::dnnl_gemm
