#include "watchdog/hang_analysis.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <tuple>

#include "comm/process_mesh.h"

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
std::string Who(const std::vector<int>& ranks, const std::vector<std::string>& hosts,
                const std::string& mesh = "") {
  const std::string h = fmt::format("{}", fmt::join(hosts, ","));
  if (ranks.size() == 1)
    return fmt::format("rank {} (host {}{})", ranks[0], h, mesh.empty() ? "" : "; " + mesh);
  return fmt::format("ranks {} (host{} {})", RankList(ranks), hosts.size() > 1 ? "s" : "", h);
}

std::string Subject(const std::vector<int>& ranks, const std::vector<std::string>& hosts,
                    const std::string& mesh = "") {
  return Who(ranks, hosts, mesh) + (ranks.size() == 1 ? " is" : " are");
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

// A collective in flight and the flight recorder it is in ("": the world's, else a group's).
struct InFlight {
  std::string group;
  const DumpedCollective* c = nullptr;
};

// The oldest collective in flight over the world's and the groups' recorders: the one the others
// wait in (a later one may have begun on the reducer's thread). Its `c` is null when none is.
InFlight OldestInFlight(const HangDump& d) {
  InFlight w;
  auto consider = [&w](const std::string& group, const std::vector<DumpedCollective>& cs) {
    for (const DumpedCollective& c : cs) {
      if (!c.in_flight) continue;
      if (w.c == nullptr || c.began_us_ago > w.c->began_us_ago) w = {group, &c};
      break;
    }
  };
  consider("", d.collectives);
  for (const GroupCollectives& g : d.groups) consider(g.name, g.collectives);
  return w;
}

// Whether `d` is inside collective `seq` of `group`'s recorder ("": the world's).
bool InFlightIn(const HangDump& d, const std::string& group, uint64_t seq) {
  const std::vector<DumpedCollective>* cs = group.empty() ? &d.collectives : nullptr;
  for (const GroupCollectives& g : d.groups)
    if (!group.empty() && g.name == group) cs = &g.collectives;
  if (cs == nullptr) return false;
  return std::any_of(cs->begin(), cs->end(),
                     [seq](const DumpedCollective& c) { return c.in_flight && c.seq == seq; });
}

HangState StateOf(const HangDump& d) {
  HangState s;
  s.phase = d.phase;
  s.iteration = d.iteration;
  const InFlight w = OldestInFlight(d);
  const DumpedCollective* c = w.c;
  if (c == nullptr && !d.collectives.empty()) c = &d.collectives.back();
  if (c != nullptr) {
    s.seq = c->seq;
    s.kind = c->kind;
    s.in_flight = c->in_flight;
    // Beside groups' recorders, the world's collectives are named as the world's.
    s.group = w.group.empty() && !d.groups.empty() ? "world" : w.group;
  }
  s.frames = MainThreadTopFrames(d);
  return s;
}

// "the data group's " before a group's collective (its numbering is the group's own); nothing
// before the world's.
std::string GroupsPrefix(const std::string& group) {
  if (group.empty()) return "";
  if (group == "world") return "the world's ";
  // The pipeline's sends and receives (pipeline-p2p) are the pipeline group's transfers.
  return fmt::format("the {} group's ", group == "pipeline-p2p" ? "pipeline" : group);
}

std::string CollectivePart(const HangState& s) {
  if (s.in_flight) return fmt::format("in {}{} #{}", GroupsPrefix(s.group), s.kind, s.seq);
  if (s.seq > 0) return fmt::format("after collective #{}", s.seq);
  return "before any collective";
}

// "in data wait of iteration 20 after collective #1234", or "in all-gather #1235 (reduce of
// iteration 20)"; `at` >= 0 adds that frame of the main thread (when only the frames tell groups
// apart).
std::string Describe(const HangState& s, int at) {
  std::string out =
      s.in_flight
          ? fmt::format("in {}{} #{} ({} of iteration {})", GroupsPrefix(s.group), s.kind, s.seq,
                        s.phase, s.iteration)
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

// The mesh of the dumps: its shape and each dumped rank's coordinates, as every rank's "mesh:"
// line and the world size give them; false when a dump has none or they do not fit one mesh.
bool MeshOfDumps(const std::vector<HangDump>& dumps, MeshShape* shape,
                 std::map<int, MeshCoords>* coords) {
  int world = 0;
  for (const HangDump& d : dumps) world = std::max(world, d.world_size);
  MeshShape s{0, 0, 0};
  for (const HangDump& d : dumps) {
    MeshCoords c;
    if (!ParseMesh(d.mesh, &c.dp, &c.pp, &c.tp)) return false;
    // Each coordinate is below the world size (a garbled file's are not: no overflow below).
    for (int x : {c.dp, c.pp, c.tp})
      if (x < 0 || x >= world) return false;
    (*coords)[d.rank] = c;
    s.tensor = std::max(s.tensor, c.tp + 1);
    s.pipeline = std::max(s.pipeline, c.pp + 1);
  }
  if (dumps.empty() || int64_t{s.tensor} * s.pipeline > world ||
      world % (s.tensor * s.pipeline) != 0)
    return false;
  s.data = world / (s.tensor * s.pipeline);
  for (const auto& [rank, c] : *coords) {
    const MeshCoords m = CoordsOf(s, rank);
    if (m.tp != c.tp || m.pp != c.pp || m.dp != c.dp) return false;
  }
  *shape = s;
  return true;
}

// The ranks of the instance of `group` that the rank at `c` belongs to, and the coordinates that
// pick it ("pp 1, dp 0" for a tensor group); false for a group whose members keel cannot tell.
bool GroupMembers(const std::string& group, const MeshShape& s, const MeshCoords& c,
                  std::string* of, std::vector<int>* ranks) {
  ranks->clear();
  MeshCoords m = c;
  if (group.empty()) {
    of->clear();
    for (int r = 0; r < s.world(); ++r) ranks->push_back(r);
  } else if (group == "tensor") {
    *of = fmt::format("pp {}, dp {}", c.pp, c.dp);
    for (m.tp = 0; m.tp < s.tensor; ++m.tp) ranks->push_back(RankOf(s, m));
  } else if (group == "data") {
    *of = fmt::format("pp {}, tp {}", c.pp, c.tp);
    for (m.dp = 0; m.dp < s.data; ++m.dp) ranks->push_back(RankOf(s, m));
  } else if (group == "pipeline") {
    *of = fmt::format("dp {}, tp {}", c.dp, c.tp);
    for (m.pp = 0; m.pp < s.pipeline; ++m.pp) ranks->push_back(RankOf(s, m));
  } else {
    return false;  // pipeline-p2p: a transfer has one peer (AnalyzeTransfers)
  }
  std::sort(ranks->begin(), ranks->end());
  return true;
}

// "the data group of pp 0, tp 0 (ranks 0,2)", "the world (ranks 0-3)".
std::string GroupName(const std::string& group, const std::string& of,
                      const std::vector<int>& ranks) {
  if (group.empty()) return fmt::format("the world ({})", Ranks(ranks));
  return fmt::format("the {} group of {} ({})", group, of, Ranks(ranks));
}

// Under model parallelism, who waits for whom: each rank inside a collective of the world or of
// one of its groups waits for the members of that group instance that have not entered it. The
// ranks those waits lead to, directly or through another waiting rank, that are inside no
// collective are the ones holding up the job (`hung`, named first). Transfers between stages are
// AnalyzeTransfers'.
void AnalyzeWaits(const std::vector<HangDump>& dumps, HangAnalysis* a) {
  MeshShape shape;
  std::map<int, MeshCoords> coords;
  if (!MeshOfDumps(dumps, &shape, &coords)) return;
  std::map<int, const HangDump*> by_rank;
  std::map<int, InFlight> where;
  for (const HangDump& d : dumps) {
    by_rank[d.rank] = &d;
    where[d.rank] = OldestInFlight(d);
  }
  // (group, instance, seq, kind) -> the wait.
  std::map<std::tuple<std::string, std::string, uint64_t, std::string>, HangAnalysis::Wait> waits;
  for (const HangDump& d : dumps) {
    const InFlight& w = where[d.rank];
    if (w.c == nullptr) continue;
    std::string of;
    std::vector<int> members;
    if (!GroupMembers(w.group, shape, coords[d.rank], &of, &members)) continue;
    HangAnalysis::Wait& x = waits[{w.group, of, w.c->seq, w.c->kind}];
    if (x.ranks.empty()) {
      x.group = w.group.empty() ? "world" : w.group;
      x.group_of = of;
      x.group_ranks = members;
      x.seq = w.c->seq;
      x.kind = w.c->kind;
      x.iteration = d.iteration;
    }
    x.ranks.push_back(d.rank);
    if (std::find(x.hosts.begin(), x.hosts.end(), d.host) == x.hosts.end())
      x.hosts.push_back(d.host);
  }
  std::map<int, std::set<int>> waits_for;  // rank -> the members it waits for
  std::vector<HangAnalysis::Wait> list;
  for (auto& [key, x] : waits) {
    const std::string& group = std::get<0>(key);
    for (int m : x.group_ranks) {
      const auto it = by_rank.find(m);
      if (it == by_rank.end() || !InFlightIn(*it->second, group, x.seq)) x.not_entered.push_back(m);
    }
    for (int r : x.ranks) waits_for[r].insert(x.not_entered.begin(), x.not_entered.end());
    const HangDump& first = *by_rank[x.ranks[0]];
    const DumpedCollective* c = where[first.rank].c;
    x.sentence =
        fmt::format("{} wait{} in {} in its {} #{} of iteration {} (for {:.1f} s)",
                    Who(x.ranks, x.hosts, x.ranks.size() == 1 ? first.mesh : ""),
                    x.ranks.size() == 1 ? "s" : "", GroupName(group, x.group_of, x.group_ranks),
                    x.kind, x.seq, x.iteration, static_cast<double>(c->began_us_ago) / 1e6);
    if (x.not_entered.empty()) {
      x.sentence +=
          ": every rank of the group is inside it, and it does not complete: the network "
          "between its hosts, or the MPI library";
    } else {
      x.sentence += fmt::format(": {} {} not entered it", Ranks(x.not_entered),
                                x.not_entered.size() == 1 ? "has" : "have");
      // Where each one is, for a few (a world of hundreds has a line of its own per group).
      if (x.not_entered.size() <= 4) {
        std::vector<std::string> parts;
        for (int m : x.not_entered) {
          const auto it = by_rank.find(m);
          parts.push_back(fmt::format("{} is {}",
                                      x.not_entered.size() == 1 ? "it" : fmt::format("rank {}", m),
                                      it == by_rank.end() ? std::string("without a dump")
                                                          : Describe(StateOf(*it->second), -1)));
        }
        x.sentence += fmt::format(": {}", fmt::join(parts, "; "));
      }
    }
    list.push_back(x);
  }
  // The narrowest groups first: the waits nearest to the rank holding them up.
  std::stable_sort(list.begin(), list.end(), [](const auto& x, const auto& y) {
    return std::make_tuple(x.group_ranks.size(), x.ranks[0]) <
           std::make_tuple(y.group_ranks.size(), y.ranks[0]);
  });

  // The ranks that the waits lead to and that are inside no collective, with who waits for them.
  std::map<int, std::set<int>> waited_by;
  for (const auto& [start, direct] : waits_for) {
    std::set<int> seen{start};
    std::vector<int> todo(direct.begin(), direct.end());
    while (!todo.empty()) {
      const int r = todo.back();
      todo.pop_back();
      if (!seen.insert(r).second) continue;
      const auto it = by_rank.find(r);
      if (it == by_rank.end()) continue;  // no dump: the missing dumps name it
      if (where[r].c == nullptr) {
        waited_by[r].insert(start);
        continue;
      }
      const auto next = waits_for.find(r);
      if (next != waits_for.end())
        todo.insert(todo.end(), next->second.begin(), next->second.end());
    }
  }
  for (const auto& [rank, by] : waited_by) {
    const HangDump& d = *by_rank[rank];
    HangAnalysis::Hung h;
    h.rank = rank;
    h.host = d.host;
    h.mesh = d.mesh;
    h.stage = coords[rank].pp;
    h.stages = shape.pipeline;
    h.phase = d.phase;
    h.iteration = d.iteration;
    h.phase_seconds = d.phase_seconds;
    h.waited_for_by.assign(by.begin(), by.end());
    const HangState s = StateOf(d);
    const std::string stage =
        shape.pipeline > 1 ? fmt::format(": pipeline stage {} of {}", h.stage, h.stages) : "";
    h.sentence = fmt::format(
        "{} is inside no collective: {} (for {:.1f} s){}; {} {} for it, directly or through "
        "another rank's wait: it holds up the job (its stacks: {})",
        Who({rank}, {d.host}, d.mesh + stage), Describe(s, -1), d.phase_seconds,
        s.frames.empty() ? "" : ", main thread at " + s.frames[0], Ranks(h.waited_for_by),
        h.waited_for_by.size() == 1 ? "waits" : "wait", HangDumpFileName(rank));
    a->hung.push_back(rank);
    a->hung_details.push_back(std::move(h));
  }
  a->waits = std::move(list);
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
  for (int r = 0; r < a.world_size; ++r)
    if (!present.count(r)) a.missing.push_back(r);
  // One sentence per run of consecutive ranks: a lost host of 8 ranks is one line, and a garbled
  // world size of a million is not a million lines.
  for (size_t i = 0; i < a.missing.size();) {
    size_t j = i;
    while (j + 1 < a.missing.size() && a.missing[j + 1] == a.missing[j] + 1) ++j;
    a.missing_runs.push_back({a.missing[i], a.missing[j]});
    a.missing_sentences.push_back(
        i == j ? fmt::format(
                     "rank {}: no dump — its process did not answer (stopped, or its host is gone)",
                     a.missing[i])
               : fmt::format("ranks {}-{}: no dump — their processes did not answer (stopped, or "
                             "their hosts are gone)",
                             a.missing[i], a.missing[j]));
    i = j + 1;
  }
  a.mismatch = Mismatch(dumps);
  AnalyzeTransfers(dumps, &a);
  AnalyzeWaits(dumps, &a);
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
  if (!a.hung_details.empty() || !a.waits.empty()) {
    out += "who waits for whom:\n";
    for (const HangAnalysis::Hung& h : a.hung_details) out += "  " + h.sentence + "\n";
    for (const HangAnalysis::Wait& w : a.waits) out += "  " + w.sentence + "\n";
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
      c = {{"seq", g.state.seq},
           {"kind", g.state.kind},
           {"in_flight", g.state.in_flight},
           // The recorder that numbers it: null for the world's.
           {"group",
            g.state.group.empty() ? nlohmann::json(nullptr) : nlohmann::json(g.state.group)}};
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
  for (size_t i = 0; i < a.missing_runs.size(); ++i)
    j["missing"].push_back({{"first", a.missing_runs[i].first},
                            {"last", a.missing_runs[i].second},
                            {"sentence", a.missing_sentences[i]}});
  j["transfers"] = a.transfers;
  j["stuck"] = a.stuck;
  j["hung"] = a.hung;
  j["hung_ranks"] = nlohmann::json::array();
  for (const HangAnalysis::Hung& h : a.hung_details)
    j["hung_ranks"].push_back({{"rank", h.rank},
                               {"host", h.host},
                               {"mesh", h.mesh},
                               {"stage", h.stage},
                               {"stages", h.stages},
                               {"phase", h.phase},
                               {"iteration", h.iteration},
                               {"phase_seconds", h.phase_seconds},
                               {"waited_for_by", h.waited_for_by},
                               {"sentence", h.sentence}});
  j["waits"] = nlohmann::json::array();
  for (const HangAnalysis::Wait& w : a.waits)
    j["waits"].push_back({{"ranks", w.ranks},
                          {"hosts", w.hosts},
                          {"group", w.group},
                          {"group_of", w.group_of},
                          {"group_ranks", w.group_ranks},
                          {"seq", w.seq},
                          {"kind", w.kind},
                          {"iteration", w.iteration},
                          {"not_entered", w.not_entered},
                          {"sentence", w.sentence}});
  j["mismatch"] = a.mismatch.empty() ? nlohmann::json(nullptr) : nlohmann::json(a.mismatch);
  return j;
}

}  // namespace keel
