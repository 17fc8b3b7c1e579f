#include "metrics/megatron_log.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <string_view>

namespace keel {
namespace {

constexpr int kMaxContinuationLines = 12;

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// Lowercase without whitespace: field names compare equal however a terminal wrapped them.
std::string Squeeze(std::string_view s) {
  std::string out;
  for (char c : s)
    if (!std::isspace(static_cast<unsigned char>(c)))
      out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool ParseNumber(std::string_view text, double* v) {
  const std::string s = Squeeze(text);
  if (s.empty()) return false;
  char* end = nullptr;
  *v = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

// A count printed as a number ("consumed samples: 1.2e6" too) as an integer; `missing` when it is
// not finite or does not fit (a corrupt line must not make the conversion undefined).
int64_t ToCount(double v, int64_t missing) {
  return std::fabs(v) < 9.2e18 ? static_cast<int64_t>(v) : missing;
}

size_t SkipSpaces(std::string_view s, size_t i) {
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return i;
}

size_t SkipDigits(std::string_view s, size_t i) {
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  return i;
}

// The digits at *pos as a number (0 if none); *pos moves past them.
int64_t ReadInteger(std::string_view s, size_t* pos) {
  const size_t end = SkipDigits(s, *pos);
  const int64_t v = std::strtoll(std::string(s.substr(*pos, end - *pos)).c_str(), nullptr, 10);
  *pos = end;
  return v;
}

// Position of "iteration N/ TOTAL" in `line`, or npos.
size_t FindRecordStart(std::string_view line) {
  for (size_t p = line.find("iteration"); p != std::string_view::npos;
       p = line.find("iteration", p + 1)) {
    size_t i = SkipSpaces(line, p + 9);
    size_t j = SkipDigits(line, i);
    if (j == i) continue;
    j = SkipSpaces(line, j);
    if (j < line.size() && line[j] == '/') return p;
  }
  return std::string_view::npos;
}

// Position of "validation loss at iteration N" / "valid loss at iteration N", or npos.
size_t FindValidationStart(std::string_view line) {
  for (const char* key : {"validation loss at iteration", "valid loss at iteration"}) {
    size_t p = line.find(key);
    if (p == std::string_view::npos) continue;
    size_t i = SkipSpaces(line, p + std::string_view(key).size());
    if (SkipDigits(line, i) > i) return p;
  }
  return std::string_view::npos;
}

bool IsProcessStart(std::string_view line) {
  return line.find("using world size:") != std::string_view::npos ||
         line.find("loaded checkpoint from") != std::string_view::npos ||
         line.find("keel train: start") != std::string_view::npos;
}

// "[default7]:" and similar launcher tags at the start of a continuation line.
std::string_view StripRankTag(std::string_view s) {
  if (s.rfind("[default", 0) == 0) {
    size_t close = s.find("]:");
    if (close != std::string_view::npos) s.remove_prefix(close + 2);
  }
  return s;
}

// "[2022-05-01 03:56:11]" (or any bracketed text starting with a 4-digit year) in `prefix`.
std::string FindTimestamp(std::string_view prefix) {
  for (size_t open = prefix.find('['); open != std::string_view::npos;
       open = prefix.find('[', open + 1)) {
    size_t close = prefix.find(']', open);
    if (close == std::string_view::npos) break;
    std::string_view in = prefix.substr(open + 1, close - open - 1);
    if (in.size() >= 10 && SkipDigits(in, 0) == 4 && in[4] == '-') return std::string(in);
  }
  return "";
}

// A record's text: this line from `start` plus continuation lines up to the one ending in "|".
std::string JoinRecord(const std::vector<std::string_view>& lines, size_t* i, size_t start,
                       bool* joined) {
  std::string text(lines[*i].substr(start));
  *joined = false;
  for (int k = 0; k < kMaxContinuationLines && !Trim(text).ends_with('|'); ++k) {
    if (*i + 1 >= lines.size()) break;
    std::string_view next = lines[*i + 1];
    if (FindRecordStart(next) != std::string_view::npos ||
        FindValidationStart(next) != std::string_view::npos || Trim(next).empty())
      break;
    text += ' ';
    text += StripRankTag(next);
    ++*i;
    *joined = true;
  }
  return text;
}

// "key: value" fields between '|' separators; the first field is the record's head.
std::vector<std::pair<std::string, std::string_view>> Fields(std::string_view text,
                                                             std::string_view* head) {
  std::vector<std::pair<std::string, std::string_view>> out;
  size_t bar = text.find('|');
  *head = text.substr(0, bar);
  while (bar != std::string_view::npos) {
    size_t next = text.find('|', bar + 1);
    std::string_view f =
        text.substr(bar + 1, next == std::string_view::npos ? next : next - bar - 1);
    size_t colon = f.find(':');
    if (colon != std::string_view::npos)
      out.emplace_back(Squeeze(f.substr(0, colon)), f.substr(colon + 1));
    bar = next;
  }
  return out;
}

void ParseRecord(std::string_view text, LogRecord* r) {
  std::string_view head;
  const auto fields = Fields(text, &head);
  size_t j = SkipSpaces(head, head.find("iteration") + 9);
  r->iteration = ReadInteger(head, &j);
  j = SkipSpaces(head, j);
  if (j < head.size() && head[j] == '/') {
    j = SkipSpaces(head, j + 1);
    r->train_iters = ReadInteger(head, &j);
  }
  for (const auto& [key, value] : fields) {
    double v = NAN;
    if (!ParseNumber(value, &v)) continue;
    if ((key == "lmloss" || key == "gradnorm") && !std::isfinite(v)) r->nonfinite = true;
    if (key == "consumedsamples")
      r->consumed_samples = ToCount(v, -1);
    else if (key == "consumedtokens")
      r->consumed_tokens = ToCount(v, -1);
    else if (key == "elapsedtimeperiteration(ms)")
      r->iteration_seconds = v / 1000.0;
    else if (key == "elapsedtimeperiteration(s)")
      r->iteration_seconds = v;
    else if (key == "learningrate")
      r->learning_rate = v;
    else if (key == "globalbatchsize")
      r->global_batch = v;
    else if (key == "lmloss")
      r->lm_loss = v;
    else if (key == "lossscale")
      r->loss_scale = v;
    else if (key == "gradnorm")
      r->grad_norm = v;
    else if (key == "numzeros")
      r->num_zeros = v;
    else if (key == "numberofskippediterations")
      r->skipped = ToCount(v, 0);
    else if (key == "numberofnaniterations")
      r->nan = ToCount(v, 0);
    else if (key == "samplespersecond")
      r->samples_per_second = v;
    else if (key == "tflops" || key == "throughputpergpu(tflop/s/gpu)")
      r->tflops = v;
  }
}

}  // namespace

Status ParseMegatronLog(const std::string& text, const std::string& file, ParsedLog* out) {
  std::vector<std::string_view> lines;
  std::string_view all(text);
  for (size_t pos = 0; pos <= all.size();) {
    size_t nl = all.find('\n', pos);
    if (nl == std::string_view::npos) nl = all.size();
    std::string_view l = all.substr(pos, nl - pos);
    if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
    if (nl < all.size() || !l.empty()) lines.push_back(l);
    pos = nl + 1;
  }
  out->files.push_back(file);
  out->lines += static_cast<int64_t>(lines.size());
  bool started = false;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string_view line = lines[i];
    const int lineno = static_cast<int>(i + 1);
    if (IsProcessStart(line)) started = true;
    if (size_t p = FindRecordStart(line); p != std::string_view::npos) {
      LogRecord r;
      r.file = file;
      r.line = lineno;
      r.timestamp = FindTimestamp(line.substr(0, p));
      bool joined = false;
      const std::string rec = JoinRecord(lines, &i, p, &joined);
      out->wrapped += joined;
      ParseRecord(rec, &r);
      r.after_start = started;
      started = false;
      out->records.push_back(std::move(r));
    } else if (size_t v = FindValidationStart(line); v != std::string_view::npos) {
      bool joined = false;
      const std::string rec = JoinRecord(lines, &i, v, &joined);
      std::string_view head;
      const auto fields = Fields(rec, &head);
      LogValidation val;
      val.file = file;
      val.line = lineno;
      val.records_before = out->records.size();
      size_t a = SkipSpaces(head, head.find("iteration") + 9);
      val.iteration = ReadInteger(head, &a);
      for (const auto& [key, value] : fields) {
        double x = NAN;
        if (!ParseNumber(value, &x)) continue;
        if (key == "lmlossvalue") val.lm_loss = x;
        if (key == "lmlossppl") val.ppl = x;
      }
      out->validations.push_back(val);
    }
  }
  return Status::OK();
}

}  // namespace keel
