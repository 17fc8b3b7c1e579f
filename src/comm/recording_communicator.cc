#include "comm/recording_communicator.h"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <map>

#include "core/log.h"

namespace keel {

// What each rank says about the collective it is in: equal on every rank of a job in step.
struct RecordingCommunicator::Header {
  uint64_t seq = 0;
  uint64_t digest_before = 0;  // CollectiveDigest::hash of every collective before this one
  uint64_t bytes = 0;
  std::string kind;

  static constexpr size_t kSize = 3 * sizeof(uint64_t) + 24;
  std::string Encode() const {
    std::string out(kSize, '\0');
    std::memcpy(out.data(), &seq, 8);
    std::memcpy(out.data() + 8, &digest_before, 8);
    std::memcpy(out.data() + 16, &bytes, 8);
    std::memcpy(out.data() + 24, kind.data(), std::min<size_t>(kind.size(), 24));
    return out;
  }
  static Header Decode(const std::string& s) {
    Header h;
    if (s.size() < kSize) return h;
    std::memcpy(&h.seq, s.data(), 8);
    std::memcpy(&h.digest_before, s.data() + 8, 8);
    std::memcpy(&h.bytes, s.data() + 16, 8);
    h.kind.assign(s.data() + 24, strnlen(s.data() + 24, 24));
    return h;
  }
  bool operator<(const Header& o) const {
    return std::tie(seq, digest_before, bytes, kind) <
           std::tie(o.seq, o.digest_before, o.bytes, o.kind);
  }
  std::string Describe() const { return fmt::format("#{} {} ({} B)", seq, kind, bytes); }
};

namespace {

// RAII: a collective in the flight recorder from construction to destruction.
class Recorded {
 public:
  Recorded(CollectiveRecorder* r, const std::string& kind, size_t bytes, bool same_size = true)
      : r_(r), seq_(r->Begin(kind, bytes, same_size)) {}
  ~Recorded() { r_->End(seq_); }

 private:
  CollectiveRecorder* r_;
  uint64_t seq_;
};

}  // namespace

RecordingCommunicator::RecordingCommunicator(Communicator* inner, Env* env)
    : inner_(inner), env_(env), recorder_(env), p2p_recorder_(env) {}

RecordingCommunicator::RecordingCommunicator(std::unique_ptr<Communicator> inner, Env* env)
    : owned_(std::move(inner)),
      inner_(owned_.get()),
      env_(env),
      recorder_(env),
      p2p_recorder_(env) {}

bool RecordingCommunicator::Skip(const std::string& kind) {
  return skip_ && skip_(kind);
}

std::string RecordingCommunicator::MakeHeader(const std::string& kind, size_t bytes) const {
  const CollectiveDigest d = recorder_.digest();
  Header h;
  h.seq = d.count + 1;
  h.digest_before = d.hash;
  h.bytes = bytes;
  h.kind = kind;
  return h.Encode();
}

void RecordingCommunicator::CheckHeaders(const std::vector<std::string>& headers) {
  std::map<Header, std::vector<int>> groups;
  for (size_t r = 0; r < headers.size(); ++r)
    groups[Header::Decode(headers[r])].push_back(static_cast<int>(r));
  if (groups.size() <= 1) return;
  // Largest group first: the majority is the reference the others are named against.
  std::vector<std::pair<Header, std::vector<int>>> sorted(groups.begin(), groups.end());
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const auto& a, const auto& b) { return a.second.size() > b.second.size(); });
  std::string report = "collectives out of step: ";
  for (size_t g = 0; g < sorted.size(); ++g) {
    const auto& [h, ranks] = sorted[g];
    report += fmt::format("{}{} {} at {}", g ? "; " : "", DescribeRanks(ranks),
                          ranks.size() == 1 ? "is" : "are", h.Describe());
    if (g > 0 && h.seq == sorted[0].first.seq && h.digest_before != sorted[0].first.digest_before)
      report += " after a different sequence of earlier collectives";
  }
  const Header& ref = sorted[0].first;
  const Header& odd = sorted[1].first;
  report += odd.seq < ref.seq   ? fmt::format(" ({} ran fewer collectives: it skipped one)",
                                              DescribeRanks(sorted[1].second))
            : odd.seq > ref.seq ? fmt::format(" ({} ran more collectives: it added one)",
                                              DescribeRanks(sorted[1].second))
                                : " (a rank skipped, added or resized a collective)";
  report +=
      ". The job cannot continue: every rank ends with exit 4. --debug-collectives checks every "
      "collective, naming the first that differs";
  OutOfStep(report);
}

void RecordingCommunicator::OutOfStep(const std::string& report) {
  // A group's ranks are numbered within the group.
  const std::string full =
      group_name_.empty()
          ? report
          : fmt::format("in the {} group (its own rank numbers): {}", group_name_, report);
  LogError("error: " + full);
  if (on_out_of_step_) on_out_of_step_(full);
  RecordingCommunicator::Abort(ToInt(ExitCode::kRanksCannotGoOn));
}

void RecordingCommunicator::Abort(int exit_code) {
  inner_->Abort(exit_code);
  std::_Exit(exit_code);  // not reached: the inner Abort does not return either
}

void RecordingCommunicator::AgreeBeforeData(const std::string& kind, size_t bytes) {
  if (!check_every_ || world_size() == 1) return;
  std::vector<std::string> headers;
  inner_->AllGatherBytes(MakeHeader(kind, bytes), &headers);
  CheckHeaders(headers);
}

void RecordingCommunicator::ReduceScatterSum(float* data, size_t n, size_t begin, size_t end) {
  if (Skip("reduce-scatter")) return;
  const size_t bytes = (end - begin) * sizeof(float);
  AgreeBeforeData("reduce-scatter", bytes);
  Recorded rec(&recorder_, "reduce-scatter", bytes);
  inner_->ReduceScatterSum(data, n, begin, end);
}

void RecordingCommunicator::AllGather(float* data, size_t n) {
  if (Skip("all-gather")) return;
  AgreeBeforeData("all-gather", n * sizeof(float));
  Recorded rec(&recorder_, "all-gather", n * sizeof(float));
  inner_->AllGather(data, n);
}

// Point to point goes to a recorder of its own: the collective recorder's digest chains every
// record and must be equal on every rank, which a stage's sends (that its peer receives) are not.
void RecordingCommunicator::Send(const float* data, size_t n, int peer) {
  const std::string kind = fmt::format("send-to-{}", peer);
  Recorded rec(&p2p_recorder_, kind, n * sizeof(float));
  if (p2p_fault_) p2p_fault_(kind);
  inner_->Send(data, n, peer);
}

void RecordingCommunicator::Recv(float* data, size_t n, int peer) {
  const std::string kind = fmt::format("recv-from-{}", peer);
  Recorded rec(&p2p_recorder_, kind, n * sizeof(float));
  if (p2p_fault_) p2p_fault_(kind);
  inner_->Recv(data, n, peer);
}

std::unique_ptr<Communicator> RecordingCommunicator::Split(int color, int key) {
  return std::make_unique<RecordingCommunicator>(inner_->Split(color, key), env_);
}

void RecordingCommunicator::AllReduceSum(float* data, size_t n) {
  Recorded rec(&recorder_, "all-reduce-sum-floats", n * sizeof(float));
  inner_->AllReduceSum(data, n);
}

void RecordingCommunicator::AllReduceMax(float* data, size_t n) {
  Recorded rec(&recorder_, "all-reduce-max-floats", n * sizeof(float));
  inner_->AllReduceMax(data, n);
}

void RecordingCommunicator::AllGatherChunks(const float* mine, float* all, size_t chunk) {
  Recorded rec(&recorder_, "all-gather-chunks", chunk * sizeof(float));
  inner_->AllGatherChunks(mine, all, chunk);
}

void RecordingCommunicator::ReduceScatterChunks(const float* all, float* mine, size_t chunk) {
  Recorded rec(&recorder_, "reduce-scatter-chunks", chunk * sizeof(float));
  inner_->ReduceScatterChunks(all, mine, chunk);
}

void RecordingCommunicator::AllGatherBytes(const std::string& mine, std::vector<std::string>* all) {
  const std::string kind = host_kind_ ? host_kind_ : "all-gather-bytes";
  if (Skip(kind)) {  // as if every rank had sent this rank's value
    all->assign(world_size(), mine);
    return;
  }
  // The header travels with the payload: the check costs no extra collective. A host reduction
  // sends the same size from every rank; a plain gather (file lists, host names) need not.
  const bool same_size = host_kind_ != nullptr && host_same_size_;
  const std::string header = MakeHeader(kind, same_size ? mine.size() : 0);
  Recorded rec(&recorder_, kind, mine.size(), same_size);
  std::vector<std::string> raw;
  inner_->AllGatherBytes(header + mine, &raw);
  std::vector<std::string> headers(raw.size());
  all->resize(raw.size());
  for (size_t r = 0; r < raw.size(); ++r) {
    headers[r] = raw[r].substr(0, Header::kSize);
    (*all)[r] = raw[r].size() > Header::kSize ? raw[r].substr(Header::kSize) : std::string();
  }
  CheckHeaders(headers);
}

void RecordingCommunicator::AllReduceSumHost(double* data, size_t n) {
  host_kind_ = "all-reduce-sum";
  Communicator::AllReduceSumHost(data, n);
  host_kind_ = nullptr;
}

void RecordingCommunicator::AllReduceMaxHost(double* data, size_t n) {
  host_kind_ = "all-reduce-max";
  Communicator::AllReduceMaxHost(data, n);
  host_kind_ = nullptr;
}

Status RecordingCommunicator::AgreeOnStatus(const Status& st) {
  // An error's message travels with the status, so the ranks send different sizes: only the
  // kind enters the check, or a rank's error would be reported as the ranks being out of step.
  host_kind_ = "agree-on-status";
  host_same_size_ = false;
  Status out = Communicator::AgreeOnStatus(st);
  host_kind_ = nullptr;
  host_same_size_ = true;
  return out;
}

void RecordingCommunicator::Barrier() {
  if (Skip("barrier")) return;
  AgreeBeforeData("barrier", 0);
  Recorded rec(&recorder_, "barrier", 0);
  inner_->Barrier();
}

}  // namespace keel
