#include "logs/megatron_log.h"

#include <fmt/format.h>

#include <cctype>
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

size_t SkipSpaces(std::string_view s, size_t i) {
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return i;
}

size_t SkipDigits(std::string_view s, size_t i) {
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  return i;
}

// The digits at *pos as a number; *pos moves past them. False when there are none or the number
// is above kMaxLogCount (a saturated or corrupted counter, never a real one).
bool ReadCount(std::string_view s, size_t* pos, int64_t* v) {
  const size_t end = SkipDigits(s, *pos);
  const std::string_view digits = s.substr(*pos, end - *pos);
  *pos = end;
  *v = 0;
  for (char c : digits) {
    *v = *v * 10 + (c - '0');  // cannot overflow: *v <= kMaxLogCount before this step
    if (*v > kMaxLogCount) return false;
  }
  return !digits.empty();
}

// A count printed as a number ("consumed samples: 123"): whole part, within [0, kMaxLogCount].
bool ToCount(double v, int64_t* out) {
  if (!(v >= 0 && v <= static_cast<double>(kMaxLogCount))) return false;
  *out = static_cast<int64_t>(v);
  return true;
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

bool EndsRecord(std::string_view text) {
  return Trim(text).ends_with('|');
}

// A line that cannot continue a wrapped record: it starts one of its own, or is empty.
bool BreaksRecord(std::string_view line) {
  return FindRecordStart(line) != std::string_view::npos ||
         FindValidationStart(line) != std::string_view::npos || Trim(line).empty();
}

struct Field {
  std::string key;  // squeezed: "numberofnaniterations"
  std::string_view name, value;
};

// "key: value" fields between '|' separators; the first field is the record's head.
std::vector<Field> Fields(std::string_view text, std::string_view* head) {
  std::vector<Field> out;
  size_t bar = text.find('|');
  *head = text.substr(0, bar);
  while (bar != std::string_view::npos) {
    size_t next = text.find('|', bar + 1);
    std::string_view f =
        text.substr(bar + 1, next == std::string_view::npos ? next : next - bar - 1);
    size_t colon = f.find(':');
    if (colon != std::string_view::npos)
      out.push_back({Squeeze(f.substr(0, colon)), Trim(f.substr(0, colon)), f.substr(colon + 1)});
    bar = next;
  }
  return out;
}

// Fills `r` from a record's text; returns why the record cannot be true ("" if it can).
std::string ParseRecord(std::string_view text, LogRecord* r) {
  std::string_view head;
  const auto fields = Fields(text, &head);
  size_t digits = SkipSpaces(head, head.find("iteration") + 9), j = digits;
  if (!ReadCount(head, &j, &r->iteration))
    return fmt::format("iteration {} is beyond {}", head.substr(digits, j - digits), kMaxLogCount);
  j = SkipSpaces(head, j);
  if (j < head.size() && head[j] == '/') {
    digits = j = SkipSpaces(head, j + 1);
    if (!ReadCount(head, &j, &r->train_iters) && j > digits)
      return fmt::format("the total of {} iterations is beyond {}", head.substr(digits, j - digits),
                         kMaxLogCount);
  }
  bool loss_nonfinite = false, grad_nonfinite = false;
  for (const Field& f : fields) {
    const std::string& key = f.key;
    double v = NAN;
    if (!ParseNumber(f.value, &v)) continue;
    auto count = [&](int64_t* out) {
      return ToCount(v, out) ? std::string()
                             : fmt::format("{}: {} is not a count (0 to {})", f.name, Trim(f.value),
                                           kMaxLogCount);
    };
    auto rate = [&](double* out) {
      *out = v;
      return v < 0 ? fmt::format("{}: {} is negative", f.name, Trim(f.value)) : std::string();
    };
    std::string bad;
    if (key == "consumedsamples") {
      bad = count(&r->consumed_samples);
    } else if (key == "consumedtokens") {
      bad = count(&r->consumed_tokens);
    } else if (key == "elapsedtimeperiteration(ms)") {
      bad = rate(&r->iteration_seconds);
      r->iteration_seconds /= 1000.0;
    } else if (key == "elapsedtimeperiteration(s)") {
      bad = rate(&r->iteration_seconds);
    } else if (key == "learningrate") {
      r->learning_rate = v;
    } else if (key == "globalbatchsize") {
      int64_t gb = 0;
      bad = count(&gb);
      r->global_batch = v;
    } else if (key == "lmloss") {
      r->lm_loss = v;
      r->has_loss = true;
      loss_nonfinite = !std::isfinite(v);
    } else if (key == "lossscale") {
      r->loss_scale = v;
    } else if (key == "gradnorm") {
      r->grad_norm = v;
      grad_nonfinite = !std::isfinite(v);
    } else if (key == "numzeros") {
      r->num_zeros = v;
    } else if (key == "numberofskippediterations") {
      bad = count(&r->skipped);
    } else if (key == "numberofnaniterations") {
      bad = count(&r->nan);
      r->has_nan_count = true;
    } else if (key == "samplespersecond") {
      bad = rate(&r->samples_per_second);
    } else if (key == "tflops" || key == "throughputpergpu(tflop/s/gpu)") {
      bad = rate(&r->tflops);
    }
    if (!bad.empty()) return bad;
  }
  // The log's own NaN counter decides where it is printed: a skipped iteration (a skipped data
  // window, an fp16 overflow's inf grad norm) is not a NaN. A NaN loss in an interval that
  // skipped nothing is one all the same.
  r->nonfinite = r->has_nan_count ? r->nan > 0 || (loss_nonfinite && r->skipped == 0)
                                  : loss_nonfinite || grad_nonfinite;
  return "";
}

}  // namespace

Status ParseMegatronLog(const std::string& text, const std::string& file, ParsedLog* out) {
  MegatronLogParser parser(out);
  parser.BeginFile(file);
  std::string_view all(text);
  for (size_t pos = 0; pos <= all.size();) {
    size_t nl = all.find('\n', pos);
    if (nl == std::string_view::npos) nl = all.size();
    const std::string_view l = all.substr(pos, nl - pos);
    if (nl < all.size() || !l.empty()) parser.AddLine(l);
    pos = nl + 1;
  }
  parser.Flush();
  return Status::OK();
}

Status ReadMegatronLog(Env* env, const std::string& path, ParsedLog* out) {
  FileType type = FileType::kOther;
  KEEL_RETURN_IF_ERROR(env->GetFileType(path, &type));
  if (type == FileType::kDirectory)
    return Status::InvalidArgument(
        fmt::format("{} is a directory, not a log file: give the file the training run writes "
                    "(e.g. its main_log.txt)",
                    path));
  if (type != FileType::kRegular) return NotRegularFile(path, type);
  constexpr size_t kPiece = size_t{8} << 20;
  MegatronLogParser parser(out);
  parser.BeginFile(path);
  std::string piece, line;
  bool cut = false;  // the line passed kMaxLogLineBytes: the rest of it is skipped
  for (uint64_t offset = 0;;) {
    KEEL_RETURN_IF_ERROR(env->ReadFileRange(path, offset, kPiece, &piece));
    if (piece.empty()) break;
    offset += piece.size();
    std::string_view rest(piece);
    while (!rest.empty()) {
      const size_t nl = rest.find('\n');
      const std::string_view part = rest.substr(0, nl);
      if (!cut) {
        const size_t room = kMaxLogLineBytes - line.size();
        line.append(part.substr(0, room));
        cut = part.size() > room;
      }
      if (nl == std::string_view::npos) break;
      parser.AddLine(line);
      line.clear();
      cut = false;
      rest.remove_prefix(nl + 1);
    }
  }
  if (!line.empty()) parser.AddLine(line);
  parser.Flush();
  return Status::OK();
}

void MegatronLogParser::BeginFile(const std::string& file) {
  Flush();
  out_->files.push_back(file);
  file_ = file;
  line_ = 0;
  started_ = false;
}

void MegatronLogParser::ContinueInFile(const std::string& file) {
  Flush();
  file_ = file;
  line_ = 0;
}

void MegatronLogParser::AddLine(std::string_view line) {
  if (line.size() > kMaxLogLineBytes) line = line.substr(0, kMaxLogLineBytes);
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  ++line_;
  ++out_->lines;
  if (pending_.active) {
    // A record runs until a line ends in "|", for at most kMaxContinuationLines more lines.
    if (!BreaksRecord(line)) {
      pending_.text += ' ';
      pending_.text += StripRankTag(line);
      pending_.joined = true;
      if (++pending_.continuations >= kMaxContinuationLines || EndsRecord(pending_.text))
        Complete();
      return;
    }
    Complete();
  }
  if (IsProcessStart(line)) started_ = true;
  const size_t rec = FindRecordStart(line);
  const size_t val = rec == std::string_view::npos ? FindValidationStart(line) : rec;
  if (val == std::string_view::npos) return;
  pending_ = Pending();
  pending_.active = true;
  pending_.validation = rec == std::string_view::npos;
  pending_.line = line_;
  pending_.text = std::string(line.substr(val));
  if (!pending_.validation) pending_.timestamp = FindTimestamp(line.substr(0, val));
  if (EndsRecord(pending_.text)) Complete();
}

void MegatronLogParser::Flush() {
  if (pending_.active) Complete();
}

void MegatronLogParser::Complete() {
  Pending p = std::move(pending_);
  pending_ = Pending();
  out_->wrapped += p.joined && !p.validation;
  if (p.validation) {
    std::string_view head;
    const auto fields = Fields(p.text, &head);
    LogValidation val;
    val.file = file_;
    val.line = p.line;
    val.records_before = records_;
    size_t a = SkipSpaces(head, head.find("iteration") + 9);
    if (!ReadCount(head, &a, &val.iteration)) {
      out_->rejected.push_back(
          {file_, p.line, fmt::format("a validation iteration number beyond {}", kMaxLogCount)});
      return;
    }
    for (const Field& f : fields) {
      double x = NAN;
      if (!ParseNumber(f.value, &x)) continue;
      if (f.key == "lmlossvalue") val.lm_loss = x;
      if (f.key == "lmlossppl") val.ppl = x;
    }
    out_->validations.push_back(val);
    return;
  }
  LogRecord r;
  r.file = file_;
  r.line = p.line;
  r.timestamp = std::move(p.timestamp);
  const std::string bad = ParseRecord(p.text, &r);
  if (!bad.empty()) {
    out_->rejected.push_back({file_, p.line, bad});
    return;
  }
  r.after_start = started_;
  started_ = false;
  // The interval this line covers: back to the previous record of the same process.
  const int64_t interval = has_prev_ && !r.after_start && r.iteration > prev_iteration_
                               ? r.iteration - prev_iteration_
                               : 0;
  r.gap = r.skipped > 0 && (!r.has_loss || (interval > 0 && r.skipped >= interval));
  has_prev_ = true;
  prev_iteration_ = r.iteration;
  ++records_;
  out_->records.push_back(std::move(r));
}

}  // namespace keel
