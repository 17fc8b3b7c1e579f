#include "watchdog/hang_analysis.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <tuple>

namespace keel {
namespace {

// "0-4,6,7": runs of three or more ranks shortened.
std::string RankList(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ',';
    if (j >= i + 2) {
      out += fmt::format("{}-{}", ranks[i], ranks[j]);
    } else {
      for (size_t k = i; k <= j; ++k) {
        if (k > i) out += ',';
        out += std::to_string(ranks[k]);
      }
    }
    i = j + 1;
  }
  return out;
}

// "rank 5 (host h2) is" / "ranks 5,6 (hosts h2,h3) are"; one rank with its mesh coordinates:
// "rank 5 (host h2; dp 1, pp 0, tp 1) is".
std::string Subject(const std::vector<int>& ranks, const std::vector<std::string>& hosts,
                    const std::string& mesh = "") {
  const std::string h = fmt::format("{}", fmt::join(hosts, ","));
  if (ranks.size() == 1)
    return fmt::format("rank {} (host {}{}) is", ranks[0], h, mesh.empty() ? "" : "; " + mesh);
  return fmt::format("ranks {} (host{} {}) are", RankList(ranks), hosts.size() > 1 ? "s" : "", h);
}

std::string Ranks(const std::vector<int>& ranks) {
  return fmt::format("rank{} {}", ranks.size() > 1 ? "s" : "", RankList(ranks));
}

// The function of a frame "FUNCTION+0xOFF (MODULE+0xOFF)"; "" for a frame dladdr did not name.
std::string FunctionOf(const std::string& frame) {
  if (frame.empty() || frame.back() != ')') return "";
  const size_t open = frame.rfind(" (");
  if (open == std::string::npos) return "";
  const size_t plus = frame.rfind("+0x", open);
  if (plus == std::string::npos || plus == 0) return "";
  return frame.substr(0, plus);
}

// In namespace keel: "keel::..." or, after a return type, "void keel::...".
bool IsKeelFunction(const std::string& f) {
  for (size_t at = f.find("keel::"); at != std::string::npos; at = f.find("keel::", at + 1))
    if (at == 0 || f[at - 1] == ' ') return true;
  return false;
}

HangState StateOf(const HangDump& d) {
  HangState s;
  s.phase = d.phase;
  s.iteration = d.iteration;
  // The oldest collective in flight is the one the others wait in (a later one may have begun
  // on the reducer's thread).
  const DumpedCollective* c = nullptr;
  for (const DumpedCollective& x : d.collectives)
    if (x.in_flight) {
      c = &x;
      break;
    }
  if (c == nullptr && !d.collectives.empty()) c = &d.collectives.back();
  if (c != nullptr) {
    s.seq = c->seq;
    s.kind = c->kind;
    s.in_flight = c->in_flight;
  }
  s.frames = MainThreadTopFrames(d);
  return s;
}

std::string CollectivePart(const HangState& s) {
  if (s.in_flight) return fmt::format("in {} #{}", s.kind, s.seq);
  if (s.seq > 0) return fmt::format("after collective #{}", s.seq);
  return "before any collective";
}

// "in data wait of iteration 20 after collective #1234", or "in all-gather #1235 (reduce of
// iteration 20)"; `at` >= 0 adds that frame of the main thread (when only the frames tell groups
// apart).
std::string Describe(const HangState& s, int at) {
  std::string out =
      s.in_flight
          ? fmt::format("in {} #{} ({} of iteration {})", s.kind, s.seq, s.phase, s.iteration)
          : fmt::format("in {} of iteration {} {}", s.phase, s.iteration, CollectivePart(s));
  if (at >= 0 && at < static_cast<int>(s.frames.size())) out += " at " + s.frames[at];
  return out;
}

// The largest group as the odd ones out see it: "in reduce-scatter #1235" says enough.
std::string DescribeShort(const HangState& s, int at) {
  if (!s.in_flight) return Describe(s, at);
  std::string out = CollectivePart(s);
  if (at >= 0 && at < static_cast<int>(s.frames.size())) out += " at " + s.frames[at];
  return out;
}

// The first main-thread frame where two states that differ only in their frames differ; -1
// when they differ in more.
int FirstDifferentFrame(const HangState& x, const HangState& y) {
  HangState a = x, b = y;
  a.frames.clear();
  b.frames.clear();
  if (!(a == b)) return -1;
  size_t k = 0;
  while (k < x.frames.size() && k < y.frames.size() && x.frames[k] == y.frames[k]) ++k;
  return static_cast<int>(k);
}

std::string Mismatch(const std::vector<HangDump>& dumps) {
  // seq -> (kind, bytes) -> ranks
  std::map<uint64_t, std::map<std::pair<std::string, uint64_t>, std::vector<int>>> by_seq;
  for (const HangDump& d : dumps)
    for (const DumpedCollective& c : d.collectives)
      // A plain gather (file lists, host names) sends each rank's own size: only its kind counts.
      by_seq[c.seq][{c.kind, c.kind == "all-gather-bytes" ? 0 : c.bytes}].push_back(d.rank);
  for (const auto& [seq, variants] : by_seq) {
    if (variants.size() < 2) continue;
    std::vector<std::pair<std::pair<std::string, uint64_t>, std::vector<int>>> v(variants.begin(),
                                                                                 variants.end());
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) {
      return std::make_tuple(-static_cast<int64_t>(a.second.size()), a.second[0]) <
             std::make_tuple(-static_cast<int64_t>(b.second.size()), b.second[0]);
    });
    std::string parts;
    for (const auto& [kb, ranks] : v)
      parts += fmt::format("{}{} ran {} ({} B)", parts.empty() ? "" : ", ", Ranks(ranks), kb.first,
                           kb.second);
    return fmt::format("collective #{} does not match: {}: a rank skipped or added a collective",
                       seq, parts);
  }
  bool any_in_flight = false;
  std::map<uint64_t, std::vector<int>> by_count;
  std::map<uint64_t, std::vector<int>> by_hash;
  for (const HangDump& d : dumps) {
    for (const DumpedCollective& c : d.collectives) any_in_flight |= c.in_flight;
    by_count[d.digest.count].push_back(d.rank);
    by_hash[d.digest.hash].push_back(d.rank);
  }
  auto list = [](const std::map<uint64_t, std::vector<int>>& m, bool hex) {
    std::vector<std::pair<uint64_t, std::vector<int>>> v(m.begin(), m.end());
    std::stable_sort(v.begin(), v.end(), [](const auto& a, const auto& b) {
      return a.second.size() > b.second.size();
    });
    std::string out;
    for (const auto& [value, ranks] : v)
      out += fmt::format("{}{} {}", out.empty() ? "" : ", ", Ranks(ranks),
                         hex ? fmt::format("0x{:016x}", value) : std::to_string(value));
    return out;
  };
  if (!any_in_flight && by_count.size() > 1)
    return fmt::format(
        "the ranks ran different numbers of collectives and none is in one ({}): a rank skipped "
        "or added a collective",
        list(by_count, false));
  if (by_count.size() == 1 && by_hash.size() > 1)
    return fmt::format(
        "the collective digests differ after the same {} collectives ({}): a rank ran a "
        "collective of another kind or size before the flight recorder's window",
        by_count.begin()->first, list(by_hash, true));
  return "";
}

// "dp 1, pp 0, tp 1" -> coordinates; false for anything else (no mesh: not model parallel).
bool ParseMesh(const std::string& mesh, int* dp, int* pp, int* tp) {
  char rest = 0;
  return std::sscanf(mesh.c_str(), "dp %d, pp %d, tp %d%c", dp, pp, tp, &rest) == 3;
}

// A rank's transfer in flight in its pipeline-p2p section: "send-to-P" or "recv-from-P".
struct Transfer {
  bool send = false;
  int peer_stage = -1;  // the peer's rank in the pipeline group: its stage
  std::string kind;
  uint64_t began_us_ago = 0;
};

bool TransferInFlight(const HangDump& d, Transfer* t) {
  for (const GroupCollectives& g : d.groups) {
    if (g.name != "pipeline-p2p") continue;
    for (const DumpedCollective& c : g.collectives) {
      if (!c.in_flight) continue;
      int peer = -1;
      char rest = 0;
      if (std::sscanf(c.kind.c_str(), "send-to-%d%c", &peer, &rest) == 1) {
        t->send = true;
      } else if (std::sscanf(c.kind.c_str(), "recv-from-%d%c", &peer, &rest) == 1) {
        t->send = false;
      } else {
        continue;
      }
      t->peer_stage = peer;
      t->kind = c.kind;
      t->began_us_ago = c.began_us_ago;
      return true;
    }
  }
  return false;
}

// Whether the main thread is inside an MPI call (PMPI_Send, MPI_Recv, ...).
bool InMpi(const HangDump& d) {
  const ThreadStack* t = MainThread(d);
  if (t == nullptr) return false;
  for (const std::string& f : t->frames) {
    const std::string fn = FunctionOf(f);
    if (fn.rfind("PMPI_", 0) == 0 || fn.rfind("MPI_", 0) == 0) return true;
  }
  return false;
}

// Who waits for whom in the pipeline's point-to-point transfers. A send (receive) in flight whose
// peer is in the matching receive (send) would have gone through: that rank is stuck inside it
// (named first). A transfer whose peer is elsewhere waits for that peer.
void AnalyzeTransfers(const std::vector<HangDump>& dumps, HangAnalysis* a) {
  std::map<std::tuple<int, int, int>, const HangDump*> by_coords;  // (dp, pp, tp)
  int stages = 0;
  for (const HangDump& d : dumps) {
    int dp, pp, tp;
    if (!ParseMesh(d.mesh, &dp, &pp, &tp)) return;  // not every rank names its place
    by_coords[{dp, pp, tp}] = &d;
    stages = std::max(stages, pp + 1);
  }
  std::vector<std::string> stuck, waiting;
  for (const HangDump& d : dumps) {
    Transfer t;
    if (!TransferInFlight(d, &t)) continue;
    int dp, pp, tp;
    ParseMesh(d.mesh, &dp, &pp, &tp);
    const std::string who = fmt::format("rank {} (host {}; {}: pipeline stage {} of {})", d.rank,
                                        d.host, d.mesh, pp, std::max(stages, t.peer_stage + 1));
    const std::string what =
        fmt::format("the pipeline group's {} of iteration {} (for {:.1f} s)", t.kind, d.iteration,
                    static_cast<double>(t.began_us_ago) / 1e6);
    const auto it = by_coords.find({dp, t.peer_stage, tp});
    if (it == by_coords.end()) {
      waiting.push_back(
          fmt::format("{} is in {}: its peer, stage {} at dp {}, tp {}, left no "
                      "dump (stopped, or its host is gone)",
                      who, what, t.peer_stage, dp, tp));
      continue;
    }
    const HangDump& peer = *it->second;
    Transfer pt;
    const bool matched = TransferInFlight(peer, &pt) && pt.send != t.send && pt.peer_stage == pp;
    if (matched) {
      // Both ends in the same transfer, which a healthy transport completes. The end whose main
      // thread is inside MPI waits; the other is stuck in keel's side of the transfer. Named
      // once, from the stuck end's side; both, from the sender's, when the stacks do not tell.
      const bool mine_in_mpi = InMpi(d), peer_in_mpi = InMpi(peer);
      if (mine_in_mpi && !peer_in_mpi) continue;  // the peer is the stuck one
      if (mine_in_mpi == peer_in_mpi) {
        if (!t.send) continue;
        a->stuck.push_back(d.rank);
        a->stuck.push_back(peer.rank);
        stuck.push_back(fmt::format(
            "{} is inside {} and rank {} (stage {}) inside the matching {}, and the transfer "
            "does not complete: the link between hosts {} and {}, or the MPI library (their "
            "stacks: {}, {})",
            who, what, peer.rank, t.peer_stage, pt.kind, d.host, peer.host,
            HangDumpFileName(d.rank), HangDumpFileName(peer.rank)));
        continue;
      }
      a->stuck.push_back(d.rank);
      stuck.push_back(fmt::format(
          "{} is stuck inside {}: rank {} (stage {}) waits in the matching {}, so the data "
          "never {} rank {}; it holds up the job (its stacks: {})",
          who, what, peer.rank, t.peer_stage, pt.kind, t.send ? "left" : "reached", d.rank,
          HangDumpFileName(d.rank)));
    } else {
      waiting.push_back(
          fmt::format("{} waits in {} for rank {} (stage {}), which is not {} it: "
                      "{}",
                      who, what, peer.rank, t.peer_stage, t.send ? "receiving from" : "sending to",
                      Describe(StateOf(peer), -1)));
    }
  }
  a->transfers = stuck;
  a->transfers.insert(a->transfers.end(), waiting.begin(), waiting.end());
}

}  // namespace

Status ReadHangDumps(Env* env, const std::string& dir, std::vector<HangDump>* dumps) {
  dumps->clear();
  if (!env->IsDirectory(dir)) {
    if (env->FileExists(dir))
      return Status::InvalidArgument(
          fmt::format("{} is a file, not a hang directory (SAVE/hangs/iter_N)", dir));
    return Status::NotFound(fmt::format("no hang directory {}", dir));
  }
  std::vector<std::string> names;
  KEEL_RETURN_IF_ERROR(env->GetChildren(dir, &names));
  std::sort(names.begin(), names.end());
  std::vector<std::string> iter_dirs;
  for (const std::string& n : names) {
    if (RankOfHangDumpFile(n) >= 0) continue;
    if (n.rfind("iter_", 0) != 0 || !env->IsDirectory(JoinPath(dir, n))) continue;
    // A hang directory holds dumps (a run directory's iter_NNNNNNN checkpoints do not).
    std::vector<std::string> inside;
    if (!env->GetChildren(JoinPath(dir, n), &inside).ok()) continue;
    if (std::any_of(inside.begin(), inside.end(),
                    [](const std::string& f) { return RankOfHangDumpFile(f) >= 0; }))
      iter_dirs.push_back(n);
  }
  for (const std::string& n : names) {
    const int rank = RankOfHangDumpFile(n);
    if (rank < 0) continue;
    const std::string path = JoinPath(dir, n);
    std::string text;
    Status st = env->ReadFileToString(path, &text, kMaxHangDumpBytes);
    if (!st.ok())  // a FIFO or an oversized file is the caller's to fix: its code is kept
      return Status::FromCode(
          st.code() == Status::Code::kInvalidArgument ? st.code() : Status::Code::kIOError,
          fmt::format("cannot read {}: {}", path, st.message()));
    HangDump d;
    st = ParseHangDump(text, &d);
    if (!st.ok()) return Status::InvalidArgument(fmt::format("{}: {}", path, st.message()));
    if (d.rank != rank)
      return Status::InvalidArgument(
          fmt::format("{}: the dump is rank {}'s, not rank {}'s", path, d.rank, rank));
    if (!dumps->empty() && d.world_size != dumps->front().world_size)
      return Status::InvalidArgument(fmt::format(
          "{}: a world of {} ranks, but {} says {}: the dumps come from different jobs", path,
          d.world_size, HangDumpFileName(dumps->front().rank), dumps->front().world_size));
    dumps->push_back(std::move(d));
  }
  if (dumps->empty()) {
    if (!iter_dirs.empty())
      return Status::InvalidArgument(fmt::format(
          "{} holds no rank-RRR.txt dumps but the hang directories {}: analyze one of them "
          "(`keel hangs analyze {}`)",
          dir, fmt::join(iter_dirs, ", "), JoinPath(dir, iter_dirs.back())));
    return Status::InvalidArgument(fmt::format(
        "{} holds no hang dumps (rank-RRR.txt): it is not a hang directory (SAVE/hangs/iter_N)",
        dir));
  }
  std::sort(dumps->begin(), dumps->end(),
            [](const HangDump& a, const HangDump& b) { return a.rank < b.rank; });
  return Status::OK();
}

const ThreadStack* MainThread(const HangDump& d) {
  for (const ThreadStack& t : d.threads)
    if (t.tid == d.pid) return &t;
  for (const ThreadStack& t : d.threads)
    for (const std::string& f : t.frames)
      if (FunctionOf(f) == "main") return &t;
  for (const ThreadStack& t : d.threads)
    if (!t.is_caller) return &t;
  return nullptr;
}

std::vector<std::string> MainThreadTopFrames(const HangDump& d, size_t n) {
  std::vector<std::string> out;
  const ThreadStack* t = MainThread(d);
  if (t == nullptr) return out;
  for (const std::string& f : t->frames) {
    if (out.size() == n) break;
    const std::string fn = FunctionOf(f);
    if (IsKeelFunction(fn)) out.push_back(fn);
  }
  if (out.empty()) out.assign(t->frames.begin(), t->frames.begin() + std::min(n, t->frames.size()));
  return out;
}

HangAnalysis AnalyzeHangs(const std::vector<HangDump>& dumps) {
  HangAnalysis a;
  a.dumps = static_cast<int>(dumps.size());
  std::set<int> present;
  for (const HangDump& d : dumps) {
    a.world_size = std::max(a.world_size, d.world_size);
    present.insert(d.rank);
    if (d.fired_here) {
      if (a.fired.empty()) a.fired_reason = d.reason;
      a.fired.push_back(d.rank);
    }
    const HangState s = StateOf(d);
    auto g = std::find_if(a.groups.begin(), a.groups.end(),
                          [&](const HangGroup& x) { return x.state == s; });
    if (g == a.groups.end()) {
      a.groups.push_back(HangGroup{s, {}, {}});
      g = a.groups.end() - 1;
    }
    g->ranks.push_back(d.rank);
    if (std::find(g->hosts.begin(), g->hosts.end(), d.host) == g->hosts.end())
      g->hosts.push_back(d.host);
  }
  for (HangGroup& g : a.groups) std::sort(g.ranks.begin(), g.ranks.end());
  std::stable_sort(a.groups.begin(), a.groups.end(), [](const HangGroup& x, const HangGroup& y) {
    if (x.ranks.size() != y.ranks.size()) return x.ranks.size() > y.ranks.size();
    return x.ranks[0] < y.ranks[0];
  });

  const int dumped = a.dumps;
  if (a.groups.size() == 1) {
    std::string who;
    if (dumped == a.world_size) {
      who = dumped == 1 ? "the only rank is" : fmt::format("all {} ranks are", dumped);
    } else {
      who = dumped == 1 ? "the one rank that dumped is"
                        : fmt::format("the {} ranks that dumped are", dumped);
    }
    a.summary = who + " " + Describe(a.groups[0].state, -1);
    if (!a.groups[0].state.frames.empty())
      a.summary += ", main thread at " + a.groups[0].state.frames[0];
  }
  for (size_t i = 1; i < a.groups.size(); ++i) {
    const HangGroup& big = a.groups[0];
    const HangGroup& g = a.groups[i];
    // Frames are named only when they are all that tells the two groups apart.
    const int at = FirstDifferentFrame(g.state, big.state);
    const int others = dumped - static_cast<int>(g.ranks.size());
    const int n_big = static_cast<int>(big.ranks.size());
    const std::string rest =
        n_big == others ? fmt::format("the other {}",
                                      others == 1 ? "rank is" : fmt::format("{} ranks are", others))
                        : fmt::format("{} of the other {} ranks are", n_big, others);
    std::string mesh;
    for (const HangDump& d : dumps)
      if (g.ranks.size() == 1 && d.rank == g.ranks[0]) mesh = d.mesh;
    a.odd_ones_out.push_back(fmt::format("{} {}; {} {}", Subject(g.ranks, g.hosts, mesh),
                                         Describe(g.state, at), rest,
                                         DescribeShort(big.state, at)));
  }
  for (int r = 0; r < a.world_size; ++r) {
    if (present.count(r)) continue;
    a.missing.push_back(r);
    a.missing_sentences.push_back(fmt::format(
        "rank {}: no dump — its process did not answer (stopped, or its host is gone)", r));
  }
  a.mismatch = Mismatch(dumps);
  AnalyzeTransfers(dumps, &a);
  return a;
}

std::string FormatHangAnalysis(const HangAnalysis& a) {
  std::string out = fmt::format("hang dumps of {} of {} ranks", a.dumps, a.world_size);
  if (!a.fired.empty()) {
    out += fmt::format("; the watchdog fired on {}: {}", Ranks(a.fired), a.fired_reason);
  } else {
    out += "; no rank's own watchdog fired (all joined)";
  }
  out += "\n\ngroups, largest first:\n";
  for (const HangGroup& g : a.groups) {
    out += fmt::format("  {} {}: {}\n", g.ranks.size(), Ranks(g.ranks), Describe(g.state, -1));
    if (!g.state.frames.empty())
      out += fmt::format("      main thread: {}\n", fmt::join(g.state.frames, " <- "));
  }
  out += "\n";
  if (!a.summary.empty()) out += a.summary + "\n";
  if (!a.odd_ones_out.empty()) {
    out += "odd ones out:\n";
    for (const std::string& s : a.odd_ones_out) out += "  " + s + "\n";
  }
  if (!a.missing_sentences.empty()) {
    out += "missing dumps:\n";
    for (const std::string& s : a.missing_sentences) out += "  " + s + "\n";
  }
  if (!a.transfers.empty()) {
    out += "pipeline transfers:\n";
    for (const std::string& s : a.transfers) out += "  " + s + "\n";
  }
  out += "collectives: ";
  out += a.mismatch.empty() ? "the ranks' flight recorders agree" : a.mismatch;
  out += "\n";
  return out;
}

nlohmann::json HangAnalysisJson(const HangAnalysis& a) {
  nlohmann::json j;
  j["world_size"] = a.world_size;
  j["dumps"] = a.dumps;
  j["fired"] = a.fired;
  j["fired_reason"] = a.fired_reason;
  j["groups"] = nlohmann::json::array();
  for (const HangGroup& g : a.groups) {
    nlohmann::json c = nullptr;
    if (g.state.seq > 0)
      c = {{"seq", g.state.seq}, {"kind", g.state.kind}, {"in_flight", g.state.in_flight}};
    j["groups"].push_back({{"ranks", g.ranks},
                           {"hosts", g.hosts},
                           {"phase", g.state.phase},
                           {"iteration", g.state.iteration},
                           {"collective", c},
                           {"main_thread_frames", g.state.frames},
                           {"description", Describe(g.state, -1)}});
  }
  j["summary"] = a.summary.empty() ? nlohmann::json(nullptr) : nlohmann::json(a.summary);
  j["odd_ones_out"] = a.odd_ones_out;
  j["missing"] = nlohmann::json::array();
  for (size_t i = 0; i < a.missing.size(); ++i)
    j["missing"].push_back({{"rank", a.missing[i]}, {"sentence", a.missing_sentences[i]}});
  j["transfers"] = a.transfers;
  j["stuck"] = a.stuck;
  j["mismatch"] = a.mismatch.empty() ? nlohmann::json(nullptr) : nlohmann::json(a.mismatch);
  return j;
}

}  // namespace keel
