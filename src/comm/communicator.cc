#include "comm/communicator.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "core/status.h"

namespace keel {

namespace {

// Every rank's n doubles, in rank order.
std::vector<std::vector<double>> GatherDoubles(Communicator* comm, const double* data, size_t n) {
  std::vector<std::string> all;
  comm->AllGatherBytes(std::string(reinterpret_cast<const char*>(data), n * sizeof(double)), &all);
  std::vector<std::vector<double>> out(all.size(), std::vector<double>(n));
  for (size_t r = 0; r < all.size(); ++r) std::memcpy(out[r].data(), all[r].data(), n * 8);
  return out;
}

}  // namespace

std::string DescribeRanks(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += fmt::format("{}{}", i ? "," : "", ranks[i]);
  return s;
}

void Communicator::AllReduceSumHost(double* data, size_t n) {
  if (world_size() == 1) return;
  const auto all = GatherDoubles(this, data, n);
  for (size_t i = 0; i < n; ++i) {
    double s = 0;
    for (const auto& v : all) s += v[i];
    data[i] = s;
  }
}

void Communicator::AllReduceMaxHost(double* data, size_t n) {
  if (world_size() == 1) return;
  const auto all = GatherDoubles(this, data, n);
  for (size_t i = 0; i < n; ++i) {
    double m = all[0][i];
    for (const auto& v : all) m = (v[i] > m || v[i] != v[i]) ? v[i] : m;  // NaN wins
    data[i] = m;
  }
}

void Communicator::AllReduceSum(float* data, size_t n) {
  if (world_size() == 1 || n == 0) return;
  ReduceScatterSum(data, n, 0, n);
  AllGather(data, n);
}

void Communicator::AllReduceMax(float* data, size_t n) {
  if (world_size() == 1 || n == 0) return;
  std::vector<std::string> all;
  AllGatherBytes(std::string(reinterpret_cast<const char*>(data), n * sizeof(float)), &all);
  for (size_t i = 0; i < n; ++i) {
    float m;
    std::memcpy(&m, all[0].data() + i * sizeof(float), sizeof(float));
    for (size_t r = 1; r < all.size(); ++r) {
      float v;
      std::memcpy(&v, all[r].data() + i * sizeof(float), sizeof(float));
      m = (v > m || v != v) ? v : m;  // NaN wins
    }
    data[i] = m;
  }
}

void Communicator::AllGatherChunks(const float* mine, float* all, size_t chunk) {
  if (world_size() == 1) {
    std::memmove(all, mine, chunk * sizeof(float));
    return;
  }
  std::vector<std::string> parts;
  AllGatherBytes(std::string(reinterpret_cast<const char*>(mine), chunk * sizeof(float)), &parts);
  for (size_t r = 0; r < parts.size(); ++r)
    std::memcpy(all + r * chunk, parts[r].data(), chunk * sizeof(float));
}

void Communicator::ReduceScatterChunks(const float* all, float* mine, size_t chunk) {
  const int world = world_size();
  if (world == 1) {
    std::memmove(mine, all, chunk * sizeof(float));
    return;
  }
  // Each rank sends every rank's chunk and keeps the sums of its own (every rank receives the
  // whole buffers: the simple exchange AllGatherBytes offers).
  std::vector<std::string> parts;
  AllGatherBytes(std::string(reinterpret_cast<const char*>(all), world * chunk * sizeof(float)),
                 &parts);
  const size_t at = static_cast<size_t>(rank()) * chunk;
  for (size_t i = 0; i < chunk; ++i) {
    float s;
    std::memcpy(&s, parts[0].data() + (at + i) * sizeof(float), sizeof(float));
    for (size_t r = 1; r < parts.size(); ++r) {
      float v;
      std::memcpy(&v, parts[r].data() + (at + i) * sizeof(float), sizeof(float));
      s += v;
    }
    mine[i] = s;
  }
}

void Communicator::Send(const float*, size_t, int peer) {
  KEEL_CHECK(false, fmt::format("{}: point-to-point send to rank {} is not implemented by this "
                                "communicator",
                                Describe(), peer));
}

void Communicator::Recv(float*, size_t, int peer) {
  KEEL_CHECK(false, fmt::format("{}: point-to-point receive from rank {} is not implemented by "
                                "this communicator",
                                Describe(), peer));
}

std::unique_ptr<Communicator> Communicator::Split(int, int) {
  KEEL_CHECK(
      world_size() == 1,
      fmt::format("{}: splitting into groups is not implemented by this communicator", Describe()));
  return MakeSingleProcessCommunicator();
}

Status Communicator::AgreeOnStatus(const Status& st) {
  if (world_size() == 1) return st;
  std::vector<std::string> all;
  // Code byte, then the message; empty for OK.
  AllGatherBytes(st.ok() ? std::string() : static_cast<char>(st.code()) + st.message(), &all);
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].empty()) continue;
    if (static_cast<int>(r) == rank()) return st;
    return Status::FromCode(static_cast<Status::Code>(all[r][0]),
                            fmt::format("rank {}: {}", r, all[r].substr(1)));
  }
  return Status::OK();
}

}  // namespace keel
