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
