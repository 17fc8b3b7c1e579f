#include "comm/collective_recorder.h"

#include <xxhash.h>

namespace keel {

CollectiveRecorder::CollectiveRecorder(Env* env) : env_(env), ring_(kCapacity) {}

uint64_t CollectiveRecorder::Begin(const std::string& kind, size_t bytes, bool same_size) {
  const uint64_t now = env_->NowMicros();
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t seq = ++digest_.count;
  // The digest chains (previous hash, kind, size): order matters, timing does not.
  const uint64_t size64 = same_size ? bytes : 0;
  digest_.hash = XXH3_64bits_withSeed(kind.data(), kind.size(), digest_.hash);
  digest_.hash = XXH3_64bits_withSeed(&size64, sizeof(size64), digest_.hash);
  CollectiveRecord& r = ring_[seq % kCapacity];
  r.seq = seq;
  r.kind = kind;
  r.bytes = bytes;
  r.start_us = now;
  r.end_us = 0;
  return seq;
}

void CollectiveRecorder::End(uint64_t seq) {
  const uint64_t now = env_->NowMicros();
  std::lock_guard<std::mutex> lock(mu_);
  CollectiveRecord& r = ring_[seq % kCapacity];
  if (r.seq == seq) r.end_us = std::max<uint64_t>(now, r.start_us + 1);
}

std::vector<CollectiveRecord> CollectiveRecorder::Recent() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<CollectiveRecord> out;
  const uint64_t n = digest_.count;
  const uint64_t first = n > kCapacity ? n - kCapacity + 1 : 1;
  for (uint64_t s = first; s <= n; ++s) out.push_back(ring_[s % kCapacity]);
  return out;
}

CollectiveDigest CollectiveRecorder::digest() const {
  std::lock_guard<std::mutex> lock(mu_);
  return digest_;
}

}  // namespace keel
