// `keel ckpt`: tools for checkpoints (docs/checkpoints.md): list, inspect, verify, diff, edit,
// pin, unpin, export, import.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "checkpoint/checkpoint_edit.h"
#include "checkpoint/checkpoint_store.h"
#include "checkpoint/manifest.h"
#include "checkpoint/tensor_pieces.h"
#include "checkpoint/train_checkpoint.h"
#include "cli/commands.h"
#include "cli/exit_code.h"
#include "cli/usage_exit.h"
#include "config/config.h"
#include "core/json_reader.h"
#include "core/log.h"

namespace keel::cli {
namespace {

// A value of state.json to show: a string as itself, anything else as JSON, "?" when absent (the
// keys ReadSavedTrainState does not need may be missing or of any type in an edited file).
std::string StateText(const nlohmann::json& j, std::initializer_list<const char*> keys) {
  const nlohmann::json* v = &j;
  for (const char* k : keys) {
    if (!v->is_object() || !v->contains(k)) return "?";
    v = &(*v)[k];
  }
  return v->is_string() ? v->get<std::string>() : v->dump();
}

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

void Quiet(const std::string&) {}

// A checkpoint directory, or a run directory's newest valid checkpoint. The tools read a named
// checkpoint as it is: inspect and diff must show a broken one, and edit verifies by itself.
Status ResolveCheckpoint(Env* env, const std::string& path, std::string* dir) {
  return ResolveCheckpointDir(
      env, path, [](const std::string& l) { LogError(l); }, NamedCheckpoint::kAsIs, dir);
}

struct TensorSummary {
  double norm = 0, min = INFINITY, max = -INFINITY, mean = 0;
  int64_t non_finite = 0;
};
TensorSummary Summarize(const TensorRef& t) {
  TensorSummary s;
  const auto* p = reinterpret_cast<const float*>(t.data);
  const size_t n = t.bytes / sizeof(float);
  double sum = 0, sq = 0;
  for (size_t i = 0; i < n; ++i) {
    const double v = p[i];
    if (!std::isfinite(v)) {
      ++s.non_finite;
      continue;
    }
    sum += v;
    sq += v * v;
    s.min = std::min(s.min, v);
    s.max = std::max(s.max, v);
  }
  s.norm = std::sqrt(sq);
  s.mean = n ? sum / static_cast<double>(n) : 0;
  return s;
}
std::string Describe(const std::string& name, const TensorRef& t) {
  const TensorSummary s = Summarize(t);
  const auto* p = reinterpret_cast<const float*>(t.data);
  std::string first;
  for (size_t i = 0; i < std::min<size_t>(4, t.bytes / 4); ++i)
    first += fmt::format("{}{:.6g}", i ? ", " : "", p[i]);
  return fmt::format(
      "{}: {} {} numel {} | norm {:.6g} | min {:.6g} | max {:.6g} | mean {:.6g}{} | "
      "first [{}]",
      name, t.dtype, json(t.shape).dump(), t.bytes / 4, s.norm, s.min, s.max, s.mean,
      s.non_finite ? fmt::format(" | {} non-finite", s.non_finite) : "", first);
}

// Every tensor of checkpoint `dir` whole, whatever layout wrote it (checkpoint/tensor_pieces.h);
// `layout` gets the layout it was saved at. The files are read as they are: verify checks them
// first, inspect and diff must show a damaged checkpoint too.
// The views of `full` point into the files `ckpt` maps.
struct CheckpointData {
  CheckpointTensors ckpt;
  FullTensors full;
};
Status ReadTensors(Env* env, const std::string& dir, CheckpointData* out, std::string* layout) {
  CheckpointTensors& ckpt = out->ckpt;
  CheckpointTensors::Options as_is;
  as_is.checksums = false;
  KEEL_RETURN_IF_ERROR(CheckpointTensors::Open(env, dir, as_is, &ckpt));
  if (!ckpt.has_moments())
    return Status::Corruption(fmt::format(
        "{}: the optimizer's files are missing (optimizer.safetensors, or one per rank); {}", dir,
        kDamagedCheckpointFix));
  if (layout) *layout = ckpt.layout();
  return ReadAllFull(ckpt, &out->full);
}

void Flatten(const json& j, const std::string& prefix, std::map<std::string, std::string>* out) {
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it)
      Flatten(*it, prefix.empty() ? it.key() : prefix + "." + it.key(), out);
  } else {
    (*out)[prefix] = j.dump();
  }
}

// ---- list ----
int List(const std::string& root, bool verify) {
  Env* env = Env::Default();
  CheckpointStore store(env, root, Quiet);
  std::vector<CheckpointInfo> all;
  Status st = store.List(&all);
  if (!st.ok()) return Fail(st);
  int64_t marker = -1;
  Status ms = store.ReadMarker(&marker);
  LogLine(fmt::format("{}: {} checkpoints; {}: {}", root, all.size(), kMarkerFile,
                      ms.ok() ? std::to_string(marker) : ms.message()));
  bool bad = false;
  for (const CheckpointInfo& c : all) {
    uint64_t bytes = 0;
    std::vector<std::string> files;
    if (env->GetChildren(c.path, &files).ok())
      for (const std::string& f : files) {
        uint64_t sz = 0;
        if (env->GetFileSize(JoinPath(c.path, f), &sz).ok()) bytes += sz;
      }
    SavedTrainState s;
    const bool readable = ReadSavedTrainState(env, c.path, &s).ok();
    std::string status;
    if (verify) {
      Status v = VerifyCheckpointDir(env, c.path, true, nullptr);
      status = v.ok() ? " | ok" : " | FAILED: " + v.message();
      bad = bad || !v.ok();
    }
    LogLine(fmt::format("{} | {} | {:.1f} MB | consumed samples {} | saved {}{}{}", c.name,
                        c.committed ? "committed" : "uncommitted", static_cast<double>(bytes) / 1e6,
                        readable ? std::to_string(s.train.counters.consumed_samples) : "?",
                        readable ? StateText(s.state, {"saved_at"}) : "?",
                        c.pinned ? " | pinned: " + c.pin_reason : "", status));
  }
  std::vector<std::string> children;
  if (env->GetChildren(root, &children).ok())
    for (const std::string& n : children)
      if (n.rfind("iter_", 0) == 0 && n.find('.') != std::string::npos)
        LogLine(fmt::format("{} | set aside (not loaded)", n));
  return bad ? 1 : 0;
}

// ---- verify ----
Status DeepVerify(Env* env, const std::string& dir, std::string* summary) {
  Manifest manifest;
  KEEL_RETURN_IF_ERROR(VerifyCheckpointDir(env, dir, true, &manifest));
  SavedTrainState s;
  KEEL_RETURN_IF_ERROR(ReadSavedTrainState(env, dir, &s));
  JsonReader r(JoinPath(dir, "state.json"), s.state, kDamagedCheckpointFix);
  const int64_t top = r.root().Optional("iteration").Get<int64_t>(s.train.counters.iteration);
  KEEL_RETURN_IF_ERROR(r.status());
  for (int64_t said : {top, s.train.counters.iteration})
    if (said != manifest.iteration)
      return Status::Corruption(fmt::format(
          "{}/state.json says iteration {} but the manifest says {}: the checkpoint's files do "
          "not belong together",
          dir, said, manifest.iteration));
  // Every file was hashed above; the pieces must tile each tensor of the model exactly.
  CheckpointTensors ckpt;
  CheckpointTensors::Options hashed;
  hashed.checksums = false;
  KEEL_RETURN_IF_ERROR(CheckpointTensors::Open(env, dir, hashed, &ckpt));
  KEEL_RETURN_IF_ERROR(ckpt.CheckModel(s.spec, /*moments=*/true));
  FullTensors full;
  KEEL_RETURN_IF_ERROR(ReadAllFull(ckpt, &full));
  int64_t non_finite = 0;
  for (const auto* tensors : {&full.weights, &full.moments})
    for (const auto& [name, ref] : *tensors) non_finite += Summarize(ref).non_finite;
  if (non_finite > 0)
    return Status::Corruption(
        fmt::format("{}: {} weight or moment values are NaN or Inf", dir, non_finite));
  *summary = fmt::format("iteration {}, {} parameters, optimizer step {}, saved at {}",
                         s.train.counters.iteration, GptModel::ParamCount(s.spec),
                         s.train.optimizer_step, ckpt.layout());
  return Status::OK();
}

int Verify(const std::string& path) {
  Env* env = Env::Default();
  std::vector<std::string> dirs;
  if (env->FileExists(JoinPath(path, kManifestFile))) {
    dirs.push_back(path);
  } else {
    CheckpointStore store(env, path, Quiet);
    std::vector<CheckpointInfo> all;
    Status st = store.List(&all);
    if (!st.ok()) return Fail(st);
    if (all.empty()) return Fail(Status::InvalidArgument(path + " holds no checkpoint"));
    int64_t marker = -1;
    Status ms = store.ReadMarker(&marker);
    if (!ms.ok()) {
      LogLine("FAILED " + JoinPath(path, kMarkerFile) + ": " + ms.message());
    } else if (!env->IsDirectory(JoinPath(path, CheckpointDirName(marker)))) {
      LogLine(fmt::format("FAILED {}: names iteration {} but {} does not exist", kMarkerFile,
                          marker, CheckpointDirName(marker)));
      ms = Status::Corruption("marker");
    }
    for (const CheckpointInfo& c : all) dirs.push_back(c.path);
    if (!ms.ok()) {
      for (const std::string& d : dirs) {
        std::string summary;
        Status st2 = DeepVerify(env, d, &summary);
        LogLine(st2.ok() ? "ok " + d + ": " + summary : "FAILED " + st2.message());
      }
      return 1;
    }
  }
  int failed = 0;
  for (const std::string& d : dirs) {
    std::string summary;
    Status st = DeepVerify(env, d, &summary);
    if (st.ok()) {
      LogLine("ok " + d + ": " + summary);
    } else {
      LogLine("FAILED " + st.message());
      ++failed;
    }
  }
  LogLine(fmt::format("{} of {} checkpoints verified", dirs.size() - failed, dirs.size()));
  return failed ? 1 : 0;
}

// ---- inspect ----
int Inspect(const std::string& path, const std::vector<std::string>& names, bool all_tensors) {
  Env* env = Env::Default();
  std::string dir;
  Status st = ResolveCheckpoint(env, path, &dir);
  if (!st.ok()) return Fail(st);
  SavedTrainState s;
  st = ReadSavedTrainState(env, dir, &s);
  if (!st.ok()) return Fail(st);
  CheckpointData data;
  std::string layout;
  st = ReadTensors(env, dir, &data, &layout);
  if (!st.ok()) return Fail(st);
  const std::map<std::string, TensorRef>& weights = data.full.weights;
  const std::map<std::string, TensorRef>& moments = data.full.moments;
  if (names.empty()) {
    const json& j = s.state;
    int64_t params = 0;
    for (const auto& [n, t] : weights) params += static_cast<int64_t>(t.bytes / 4);
    LogLine(fmt::format("checkpoint {} (keel {}, saved {})", dir, StateText(j, {"keel_version"}),
                        StateText(j, {"saved_at"})));
    LogLine(
        fmt::format("iteration {} | consumed samples {} | consumed tokens {} | skipped {} | "
                    "nan {}",
                    s.train.counters.iteration, s.train.counters.consumed_samples,
                    s.train.counters.consumed_tokens, s.train.counters.skipped_iterations,
                    s.train.counters.nan_iterations));
    LogLine(
        fmt::format("optimizer: {} step {} | scheduler: next lr {} (scale {}) | next global "
                    "batch {}",
                    StateText(j, {"optimizer", "type"}), s.train.optimizer_step,
                    StateText(j, {"scheduler", "next_lr"}), s.train.lr_scale,
                    StateText(j, {"batch", "next_global_batch"})));
    LogLine(fmt::format("model: {} | {} parameters", StateText(j, {"model"}), params));
    LogLine(fmt::format(
        "layout: saved at {} (tensor x pipeline x data parallel ranks); loads at any layout",
        layout));
    Manifest m;
    if (VerifyCheckpointDir(env, dir, false, &m).ok())
      for (const ManifestEntry& e : m.files)
        LogLine(fmt::format("file {} {} bytes xxh3 {}", e.name, e.size, HexDigest(e.xxh3)));
    for (const auto& h : s.history) LogLine("history: " + h.dump());
  }
  if (all_tensors) {
    for (const auto& [n, t] : weights) LogLine(Describe("model." + n, t));
    for (const auto& [n, t] : moments) LogLine(Describe("optimizer." + n, t));
  }
  std::map<std::string, std::string> flat;
  Flatten(s.state, "", &flat);
  std::map<std::string, std::string> config;
  for (const auto& [k, v] : ConfigValues(s.config)) config["config." + k] = v;
  int rc = 0;
  for (const std::string& name : names) {
    if (auto it = flat.find(name); it != flat.end()) {
      LogLine(name + " = " + it->second);
    } else if (auto c = config.find(name); c != config.end()) {
      LogLine(name + " = " + c->second);
    } else if (name.rfind("model.", 0) == 0 && weights.count(name.substr(6))) {
      LogLine(Describe(name, weights.at(name.substr(6))));
    } else if (name.rfind("optimizer.", 0) == 0 && moments.count(name.substr(10))) {
      LogLine(Describe(name, moments.at(name.substr(10))));
    } else if (s.state.contains(name)) {
      LogLine(name + " = " + s.state[name].dump(2));
    } else {
      // Suggest names under the same first component, or containing the last one.
      const std::string last = name.substr(name.rfind('.') + 1);
      const std::string first = name.substr(0, name.find('.') + 1);
      std::string near;
      auto consider = [&](const std::string& cand) {
        const bool same_group = first.size() > 1 && first != "model." && cand.rfind(first, 0) == 0;
        if ((same_group || cand.find(last) != std::string::npos) && near.size() < 600)
          near += "\n  " + cand;
      };
      for (const auto& [k, v] : flat) consider(k);
      for (const auto& [k, v] : config) consider(k);
      for (const auto& [k, v] : weights) consider("model." + k);
      LogError(fmt::format("error: no value or tensor named '{}' in {}{}", name, dir,
                           near.empty() ? " (names: counters.*, optimizer.*, scheduler.*, "
                                          "config.KEY, model.TENSOR, optimizer.exp_avg.TENSOR)"
                                        : "; did you mean:" + near));
      rc = 2;
    }
  }
  return rc;
}

// ---- diff ----
// Like diff(1): 0 identical, 1 different, 2 trouble (a checkpoint that cannot be read).
int FailDiff(const Status& st) {
  LogError("error: " + st.message());
  return 2;
}

int Diff(const std::string& a_path, const std::string& b_path) {
  Env* env = Env::Default();
  std::string a_dir, b_dir;
  Status st = ResolveCheckpoint(env, a_path, &a_dir);
  if (st.ok()) st = ResolveCheckpoint(env, b_path, &b_dir);
  SavedTrainState a, b;
  if (st.ok()) st = ReadSavedTrainState(env, a_dir, &a);
  if (st.ok()) st = ReadSavedTrainState(env, b_dir, &b);
  if (!st.ok()) return FailDiff(st);
  int differences = 0;
  const auto ca = ConfigValues(a.config), cb = ConfigValues(b.config);
  for (size_t i = 0; i < ca.size(); ++i)
    if (ca[i].second != cb[i].second) {
      LogLine(fmt::format("config {}: {} -> {}", ca[i].first, ca[i].second, cb[i].second));
      ++differences;
    }
  std::map<std::string, std::string> fa, fb;
  Flatten(a.state, "", &fa);
  Flatten(b.state, "", &fb);
  std::set<std::string> keys;
  for (const auto& [k, v] : fa) keys.insert(k);
  for (const auto& [k, v] : fb) keys.insert(k);
  for (const std::string& k : keys) {
    if (k == "saved_at" || k.rfind("history", 0) == 0) continue;
    const std::string va = fa.count(k) ? fa[k] : "(absent)", vb = fb.count(k) ? fb[k] : "(absent)";
    if (va != vb) {
      LogLine(fmt::format("state {}: {} -> {}", k, va, vb));
      ++differences;
    }
  }
  int tensors = 0, tensors_differ = 0;
  // The weights, then the moments as whole tensors (the checkpoints may have been written by
  // different numbers of data-parallel ranks).
  CheckpointData da, db;
  std::string layout_a, layout_b;
  st = ReadTensors(env, a_dir, &da, &layout_a);
  if (st.ok()) st = ReadTensors(env, b_dir, &db, &layout_b);
  const FullTensors &fa_t = da.full, &fb_t = db.full;
  if (!st.ok()) return FailDiff(st);
  // Saved at different layouts, they are still compared tensor by tensor, whole.
  if (layout_a != layout_b)
    LogLine(
        fmt::format("note: layout {} -> {} (the tensors are compared whole)", layout_a, layout_b));
  using Tensors = std::map<std::string, TensorRef>;
  for (const auto& [ta, tb] :
       {std::pair<const Tensors*, const Tensors*>{&fa_t.weights, &fb_t.weights},
        std::pair<const Tensors*, const Tensors*>{&fa_t.moments, &fb_t.moments}}) {
    auto find_b = [b_tensors = tb](const std::string& name) -> const TensorRef* {
      auto it = b_tensors->find(name);
      return it == b_tensors->end() ? nullptr : &it->second;
    };
    for (const auto& [name, t] : *ta) {
      ++tensors;
      const TensorRef* found = find_b(name);
      if (found == nullptr) {
        LogLine(fmt::format("tensor {} only in {}", name, a_dir));
        ++tensors_differ;
        continue;
      }
      const TensorRef& u = *found;
      if (u.shape != t.shape || u.dtype != t.dtype) {
        LogLine(fmt::format("tensor {}: {} {} -> {} {}", name, t.dtype, json(t.shape).dump(),
                            u.dtype, json(u.shape).dump()));
        ++tensors_differ;
        continue;
      }
      if (std::memcmp(t.data, u.data, t.bytes) == 0) continue;
      const auto* p = reinterpret_cast<const float*>(t.data);
      const auto* q = reinterpret_cast<const float*>(u.data);
      double max_abs = 0, d2 = 0, a2 = 0;
      for (size_t i = 0; i < t.bytes / 4; ++i) {
        const double d = static_cast<double>(q[i]) - p[i];
        max_abs = std::max(max_abs, std::fabs(d));
        d2 += d * d;
        a2 += static_cast<double>(p[i]) * p[i];
      }
      LogLine(fmt::format("tensor {}: max |a-b| {:.6g}, ||a-b||/||a|| {:.6g}", name, max_abs,
                          a2 > 0 ? std::sqrt(d2 / a2) : INFINITY));
      ++tensors_differ;
    }
    for (const auto& [name, t] : *tb)
      if (ta->count(name) == 0) {
        ++tensors;
        LogLine(fmt::format("tensor {} only in {}", name, b_dir));
        ++tensors_differ;
      }
  }
  LogLine(fmt::format("{} of {} tensors differ; {} config and state values differ", tensors_differ,
                      tensors, differences));
  return tensors_differ + differences > 0 ? 1 : 0;
}

// ---- edit ----
// Config values are TOML literals (strings); print them as they are in config.toml.
std::string Literal(const json& v) {
  return v.is_string() ? v.get<std::string>() : v.dump();
}
int Edit(const std::string& path, const CheckpointEditRequest& request) {
  Env* env = Env::Default();
  std::string dir;
  Status st = ResolveCheckpoint(env, path, &dir);
  if (!st.ok()) return Fail(st);
  std::vector<CheckpointEditChange> changes;
  st = EditCheckpoint(env, dir, request, &changes);
  if (!st.ok()) return Fail(st);
  for (const CheckpointEditChange& c : changes)
    LogLine(fmt::format("edited {}: {}: {} -> {}", dir, c.key, Literal(c.old_value),
                        Literal(c.new_value)));
  LogLine("recorded in " + dir + "/state.json history; the checkpoint was rewritten atomically");
  return 0;
}

}  // namespace

int CkptCommand(int argc, const char* const* argv) {
  if (argc >= 2 && std::strcmp(argv[1], "export") == 0)
    return CkptExportCommand(argc - 1, argv + 1);
  if (argc >= 2 && std::strcmp(argv[1], "import") == 0)
    return CkptImportCommand(argc - 1, argv + 1);
  CLI::App app("Checkpoint tools: list, inspect, verify, diff, edit, pin, unpin, export, import",
               "keel ckpt");
  app.require_subcommand(1);
  std::string path, other, reason;
  std::vector<std::string> names, sets;
  bool verify = false, tensors = false;
  double scale_lr = 0;
  int64_t iteration = -1;
  auto* list = app.add_subcommand("list", "the checkpoints of a run directory");
  list->add_option("SAVE", path, "run directory")->required();
  list->add_flag("--verify", verify, "also verify every file's checksum");
  auto* inspect = app.add_subcommand("inspect", "print values and tensor summaries by name");
  inspect->add_option("PATH", path, "run directory (newest valid checkpoint) or iter_N directory")
      ->required();
  inspect->add_option("NAME", names,
                      "dotted names: optimizer.step, scheduler.next_lr, counters.consumed_samples, "
                      "config.lr, model.TENSOR, optimizer.exp_avg.TENSOR");
  inspect->add_flag("--tensors", tensors, "summarize every tensor");
  auto* ver =
      app.add_subcommand("verify", "strictly verify checkpoints (files, checksums, shapes)");
  ver->add_option("PATH", path, "run directory (every checkpoint) or iter_N directory")->required();
  auto* diff = app.add_subcommand("diff", "compare two checkpoints (exit 1 if they differ)");
  diff->add_option("A", path, "checkpoint or run directory")->required();
  diff->add_option("B", other, "checkpoint or run directory")->required();
  auto* edit = app.add_subcommand("edit", "change scheduler values of a checkpoint atomically");
  edit->add_option("PATH", path, "run directory (newest valid checkpoint) or iter_N directory")
      ->required();
  edit->add_option("--scale-lr", scale_lr, "multiply the checkpoint's LR scale by S");
  edit->add_option("--set", sets, "KEY=VALUE for scheduler/optimizer config keys");
  edit->add_option("--reason", reason, "why (recorded in the history)");
  auto* pin = app.add_subcommand("pin", "keep a checkpoint through retention");
  pin->add_option("SAVE", path, "run directory")->required();
  pin->add_option("ITERATION", iteration, "checkpoint iteration")->required();
  pin->add_option("--reason", reason, "why it is kept");
  auto* unpin = app.add_subcommand("unpin", "let retention delete a pinned checkpoint");
  unpin->add_option("SAVE", path, "run directory")->required();
  unpin->add_option("ITERATION", iteration, "checkpoint iteration")->required();
  // Listed for --help only: `keel ckpt export` and `import` are dispatched above, to their own
  // parsers.
  app.add_subcommand("export",
                     "a Hugging Face folder (GPT-2, Llama, BLOOM) from a checkpoint (keel ckpt "
                     "export --help)");
  app.add_subcommand("import",
                     "a checkpoint from a Hugging Face folder, to continue pretraining (keel ckpt "
                     "import --help)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return UsageExit(app, e);
  }
  if (list->parsed()) return List(path, verify);
  if (inspect->parsed()) return Inspect(path, names, tensors);
  if (ver->parsed()) return Verify(path);
  if (diff->parsed()) return Diff(path, other);
  if (edit->parsed()) {
    CheckpointEditRequest request;
    if (edit->count("--scale-lr")) request.scale_lr = scale_lr;
    request.sets = sets;
    request.reason = reason;
    return Edit(path, request);
  }
  CheckpointStore store(Env::Default(), path, [](const std::string& l) { LogLine(l); });
  if (!Env::Default()->IsDirectory(JoinPath(path, CheckpointDirName(iteration))))
    return Fail(Status::InvalidArgument(
        fmt::format("{} has no checkpoint {}", path, CheckpointDirName(iteration))));
  Status st = pin->parsed() ? store.Pin(iteration, reason.empty() ? "pinned by hand" : reason)
                            : store.Unpin(iteration);
  if (!st.ok()) return Fail(st);
  LogLine(fmt::format("{} {}", pin->parsed() ? "pinned" : "unpinned",
                      JoinPath(path, CheckpointDirName(iteration))));
  return 0;
}

}  // namespace keel::cli
