#include "watchdog/hang_dump.h"

#include <fmt/format.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string_view>

namespace keel {
namespace {

constexpr std::string_view kMagic = "keel hang dump 1";
constexpr std::string_view kCollectivesHeader = "collectives (oldest first):";
constexpr std::string_view kEnd = "end of hang dump";
// "group tensor: collective count 12, hash 0x..., oldest first:" then its collectives.
constexpr std::string_view kGroupPrefix = "group ";
constexpr std::string_view kCallerMark = " [dumping]";
// Far above any real job; keeps a hostile file from making the analysis allocate per rank.
constexpr int64_t kMaxWorldSize = 1 << 20;

std::string OneLine(const std::string& s) {
  std::string out = s;
  for (char& c : out)
    if (c == '\n' || c == '\r') c = ' ';
  return out;
}

std::string KindToken(const std::string& kind) {
  if (kind.empty()) return "?";
  std::string out = kind;
  for (char& c : out)
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') c = '_';
  return out;
}

// Microseconds as seconds with exactly six decimals, so they read back to the microsecond.
std::string Seconds(uint64_t us) {
  return fmt::format("{}.{:06}", us / 1000000, us % 1000000);
}

template <typename Int>
bool ParseInt(std::string_view s, Int* v, int base = 10) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *v, base);
  return ec == std::errc() && p == s.data() + s.size();
}

bool ParseSeconds(std::string_view s, uint64_t* us) {
  const size_t dot = s.find('.');
  if (dot == std::string_view::npos || s.size() - dot - 1 != 6) return false;
  uint64_t whole = 0, frac = 0;
  if (!ParseInt(s.substr(0, dot), &whole) || !ParseInt(s.substr(dot + 1), &frac)) return false;
  if (whole > UINT64_MAX / 1000000 - 1) return false;
  *us = whole * 1000000 + frac;
  return true;
}

// "tensor: collective count 12, hash 0x00000000000000ab, oldest first:"
bool ParseGroupLine(std::string_view s, GroupCollectives* g) {
  const size_t colon = s.find(": collective count ");
  if (colon == std::string_view::npos || colon == 0) return false;
  g->name = std::string(s.substr(0, colon));
  s.remove_prefix(colon + std::string_view(": collective count ").size());
  const size_t comma = s.find(", hash 0x");
  if (comma == std::string_view::npos || !ParseInt(s.substr(0, comma), &g->digest.count))
    return false;
  s.remove_prefix(comma + std::string_view(", hash 0x").size());
  constexpr std::string_view kTail = ", oldest first:";
  return s.size() == 16 + kTail.size() && s.substr(16) == kTail &&
         ParseInt(s.substr(0, 16), &g->digest.hash, 16);
}

bool ParseDouble(const std::string& s, double* v) {
  if (s.empty() || s[0] == ' ') return false;
  char* end = nullptr;
  errno = 0;
  *v = std::strtod(s.c_str(), &end);
  return errno == 0 && end == s.c_str() + s.size() && std::isfinite(*v) && *v >= 0;
}

class Reader {
 public:
  explicit Reader(const std::string& text) : text_(text) {}
  // The next line (without '\n'); false at the end of the text.
  bool Next(std::string* line) {
    if (pos_ >= text_.size()) return false;
    size_t nl = text_.find('\n', pos_);
    if (nl == std::string::npos) nl = text_.size();
    *line = text_.substr(pos_, nl - pos_);
    pos_ = nl + 1;
    ++line_no_;
    return true;
  }
  // Whether the next line starts with `prefix` (nothing consumed).
  bool NextStartsWith(std::string_view prefix) const {
    return pos_ < text_.size() && text_.compare(pos_, prefix.size(), prefix) == 0;
  }
  Status Error(const std::string& what) const {
    return Status::InvalidArgument(fmt::format("line {}: {}", line_no_, what));
  }
  Status Truncated() const {
    return Status::InvalidArgument(fmt::format(
        "line {}: the hang dump ends early (no '{}' line): truncated", line_no_ + 1, kEnd));
  }

 private:
  const std::string& text_;
  size_t pos_ = 0;
  int line_no_ = 0;
};

// "  #1234 all-gather 4096 B, began 0.500000 s ago, took 0.001000 s" (or ", in flight").
bool ParseCollective(const std::string& line, DumpedCollective* c) {
  std::string_view s = line;
  if (s.substr(0, 3) != "  #") return false;
  s.remove_prefix(3);
  size_t sp = s.find(' ');
  if (sp == std::string_view::npos || !ParseInt(s.substr(0, sp), &c->seq)) return false;
  s.remove_prefix(sp + 1);
  sp = s.find(' ');
  if (sp == 0 || sp == std::string_view::npos) return false;
  c->kind = std::string(s.substr(0, sp));
  s.remove_prefix(sp + 1);
  sp = s.find(" B, began ");
  if (sp == std::string_view::npos || !ParseInt(s.substr(0, sp), &c->bytes)) return false;
  s.remove_prefix(sp + 10);
  sp = s.find(" s ago, ");
  if (sp == std::string_view::npos || !ParseSeconds(s.substr(0, sp), &c->began_us_ago))
    return false;
  s.remove_prefix(sp + 8);
  if (s == "in flight") {
    c->in_flight = true;
    c->duration_us = 0;
    return true;
  }
  if (s.substr(0, 5) != "took " || s.size() < 7 || s.substr(s.size() - 2) != " s") return false;
  c->in_flight = false;
  return ParseSeconds(s.substr(5, s.size() - 7), &c->duration_us);
}

// "thread 123 (name)" or "thread 123 (name) [dumping]".
bool ParseThreadLine(const std::string& line, ThreadStack* t) {
  std::string_view s = line;
  if (s.substr(0, 7) != "thread ") return false;
  s.remove_prefix(7);
  t->is_caller =
      s.size() >= kCallerMark.size() && s.substr(s.size() - kCallerMark.size()) == kCallerMark;
  if (t->is_caller) s.remove_suffix(kCallerMark.size());
  const size_t open = s.find(" (");
  if (open == std::string_view::npos || s.empty() || s.back() != ')') return false;
  if (!ParseInt(s.substr(0, open), &t->tid) || t->tid <= 0) return false;
  t->name = std::string(s.substr(open + 2, s.size() - open - 3));
  return true;
}

}  // namespace

std::vector<DumpedCollective> DumpCollectives(const std::vector<CollectiveRecord>& records,
                                              uint64_t now_us) {
  std::vector<DumpedCollective> out;
  for (const CollectiveRecord& r : records) {
    DumpedCollective c;
    c.seq = r.seq;
    c.kind = r.kind;
    c.bytes = r.bytes;
    c.began_us_ago = now_us > r.start_us ? now_us - r.start_us : 0;
    c.in_flight = r.in_flight();
    c.duration_us = c.in_flight ? 0 : r.end_us - r.start_us;
    out.push_back(std::move(c));
  }
  return out;
}

std::string HangDumpFileName(int rank) {
  return fmt::format("rank-{:03}.txt", rank);
}

int RankOfHangDumpFile(const std::string& name) {
  constexpr std::string_view kPrefix = "rank-", kSuffix = ".txt";
  std::string_view s = name;
  if (s.size() < kPrefix.size() + 3 + kSuffix.size() || s.substr(0, kPrefix.size()) != kPrefix ||
      s.substr(s.size() - kSuffix.size()) != kSuffix)
    return -1;
  s = s.substr(kPrefix.size(), s.size() - kPrefix.size() - kSuffix.size());
  int rank = -1;
  if (!ParseInt(s, &rank) || rank < 0 || HangDumpFileName(rank) != name) return -1;
  return rank;
}

std::string FormatHangDump(const HangDump& d) {
  std::string out;
  auto line = [&](std::string_view s) {
    out.append(s);
    out.push_back('\n');
  };
  line(kMagic);
  line(fmt::format("rank: {}", d.rank));
  line(fmt::format("world size: {}", d.world_size));
  line("host: " + OneLine(d.host));
  if (!d.mesh.empty()) line("mesh: " + OneLine(d.mesh));  // tensor parallel runs only
  line(fmt::format("pid: {}", d.pid));
  line(fmt::format("fired here: {}", d.fired_here ? "yes" : "no"));
  line("reason: " + OneLine(d.reason));
  line("phase: " + OneLine(d.phase));
  line(fmt::format("iteration: {}", d.iteration));
  line(fmt::format("phase seconds: {}", d.phase_seconds));  // shortest text that reads back
  line(fmt::format("unix time: {}", d.unix_time));
  line(fmt::format("collective count: {}", d.digest.count));
  line(fmt::format("collective hash: 0x{:016x}", d.digest.hash));
  line(kCollectivesHeader);
  auto collective = [&](const DumpedCollective& c) {
    line(fmt::format(
        "  #{} {} {} B, began {} s ago, {}", c.seq, KindToken(c.kind), c.bytes,
        Seconds(c.began_us_ago),
        c.in_flight ? std::string("in flight") : "took " + Seconds(c.duration_us) + " s"));
  };
  for (const DumpedCollective& c : d.collectives) collective(c);
  for (const GroupCollectives& g : d.groups) {
    line(fmt::format("{}{}: collective count {}, hash 0x{:016x}, oldest first:", kGroupPrefix,
                     KindToken(g.name), g.digest.count, g.digest.hash));
    for (const DumpedCollective& c : g.collectives) collective(c);
  }
  for (const ThreadStack& t : d.threads) {
    line(fmt::format("thread {} ({}){}", t.tid, OneLine(t.name), t.is_caller ? kCallerMark : ""));
    for (size_t i = 0; i < t.frames.size(); ++i)
      line(fmt::format("  #{} {}", i, OneLine(t.frames[i])));
  }
  line(kEnd);
  return out;
}

Status ParseHangDump(const std::string& text, HangDump* out) {
  *out = HangDump();
  Reader r(text);
  std::string line;
  if (!r.Next(&line) || line != kMagic)
    return r.Error(fmt::format("not a keel hang dump (the first line is not '{}')", kMagic));

  // The header: each key once, in the order FormatHangDump writes them.
  const char* const keys[] = {
      "rank",  "world size", "host",          "pid",       "fired here",       "reason",
      "phase", "iteration",  "phase seconds", "unix time", "collective count", "collective hash"};
  for (const char* key : keys) {
    if (!r.Next(&line)) return r.Truncated();
    const std::string prefix = std::string(key) + ": ";
    if (line.compare(0, prefix.size(), prefix) != 0)
      return r.Error(fmt::format("expected '{}: ...'", key));
    const std::string v = line.substr(prefix.size());
    const std::string_view k = key;
    bool ok = true;
    if (k == "rank") {
      ok = ParseInt(v, &out->rank) && out->rank >= 0;
    } else if (k == "world size") {
      ok =
          ParseInt(v, &out->world_size) && out->world_size >= 1 && out->world_size <= kMaxWorldSize;
      if (ok && out->rank >= out->world_size)
        return r.Error(
            fmt::format("rank {} is not below the world size {}", out->rank, out->world_size));
    } else if (k == "host") {
      out->host = v;
      // Optional (tensor-parallel runs): the rank's mesh coordinates.
      if (r.NextStartsWith("mesh: ")) {
        std::string mesh;
        r.Next(&mesh);
        out->mesh = mesh.substr(6);
      }
    } else if (k == "pid") {
      ok = ParseInt(v, &out->pid) && out->pid >= 0;
    } else if (k == "fired here") {
      ok = v == "yes" || v == "no";
      out->fired_here = v == "yes";
    } else if (k == "reason") {
      out->reason = v;
    } else if (k == "phase") {
      out->phase = v;
    } else if (k == "iteration") {
      ok = ParseInt(v, &out->iteration) && out->iteration >= 0;
    } else if (k == "phase seconds") {
      ok = ParseDouble(v, &out->phase_seconds);
    } else if (k == "unix time") {
      ok = ParseInt(v, &out->unix_time);
    } else if (k == "collective count") {
      ok = ParseInt(v, &out->digest.count);
    } else if (k == "collective hash") {
      ok = v.size() == 18 && v.compare(0, 2, "0x") == 0 &&
           ParseInt(std::string_view(v).substr(2), &out->digest.hash, 16);
    }
    if (!ok) return r.Error(fmt::format("bad {}: '{}'", key, v));
  }
  if (!r.Next(&line)) return r.Truncated();
  if (line != kCollectivesHeader) return r.Error(fmt::format("expected '{}'", kCollectivesHeader));

  for (;;) {
    if (!r.Next(&line)) return r.Truncated();
    if (line == kEnd) break;
    if (line.compare(0, 3, "  #") == 0 && out->threads.empty()) {
      DumpedCollective c;
      if (!ParseCollective(line, &c))
        return r.Error(
            "bad collective (expected '  #SEQ KIND BYTES B, began S s ago, took S s' "
            "or '..., in flight')");
      std::vector<DumpedCollective>& list =
          out->groups.empty() ? out->collectives : out->groups.back().collectives;
      if (!list.empty() && c.seq <= list.back().seq)
        return r.Error(fmt::format("collective #{} is not after #{}", c.seq, list.back().seq));
      list.push_back(std::move(c));
    } else if (line.compare(0, kGroupPrefix.size(), kGroupPrefix) == 0 && out->threads.empty()) {
      GroupCollectives g;
      if (!ParseGroupLine(line.substr(kGroupPrefix.size()), &g))
        return r.Error(
            "bad group line (expected 'group NAME: collective count N, hash 0x..., oldest "
            "first:')");
      out->groups.push_back(std::move(g));
    } else if (line.compare(0, 7, "thread ") == 0) {
      ThreadStack t;
      if (!ParseThreadLine(line, &t))
        return r.Error("bad thread line (expected 'thread TID (NAME)')");
      out->threads.push_back(std::move(t));
    } else if (line.compare(0, 3, "  #") == 0) {
      std::vector<std::string>& frames = out->threads.back().frames;
      const std::string prefix = fmt::format("  #{} ", frames.size());
      if (line.compare(0, prefix.size(), prefix) != 0)
        return r.Error(fmt::format("expected frame #{}", frames.size()));
      frames.push_back(line.substr(prefix.size()));
    } else {
      return r.Error("expected a collective, a 'thread TID (NAME)' line, a frame or '" +
                     std::string(kEnd) + "'");
    }
  }
  while (r.Next(&line))
    if (!line.empty()) return r.Error("text after '" + std::string(kEnd) + "'");
  return Status::OK();
}

}  // namespace keel
