#include "hf/hf_export.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <string>

#include "checkpoint/manifest.h"
#include "checkpoint/tensor_pieces.h"
#include "checkpoint/train_checkpoint.h"
#include "core/json_reader.h"
#include "data/tokenizer.h"
#include "hf/hf_config.h"
#include "hf/hf_tokenizer_files.h"

namespace keel {
namespace {

std::string StripTrailingSlashes(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

std::string ParentDir(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash ? slash : 1);
}

}  // namespace

Status CheckNewOutputDir(Env* env, const std::string& out, const std::string& command) {
  if (env->FileExists(out)) {
    std::vector<std::string> children;
    if (!env->IsDirectory(out))
      return Status::InvalidArgument(fmt::format(
          "{} already exists and is not a directory; choose a new output path ({} never "
          "overwrites)",
          out, command));
    KEEL_RETURN_IF_ERROR(env->GetChildren(out, &children));
    if (!children.empty())
      return Status::InvalidArgument(
          fmt::format("{} already exists and is not empty ({} entries); choose a new output path "
                      "or remove it ({} never overwrites)",
                      out, children.size(), command));
  }
  if (env->FileExists(out + ".tmp"))
    return Status::InvalidArgument(out +
                                   ".tmp exists (an interrupted run?); remove it and run again");
  return Status::OK();
}

Status ConvertToHf(HfArch arch, const GptSpec& spec, const std::map<std::string, TensorView>& keel,
                   std::vector<std::vector<float>>* storage, std::vector<TensorView>* out) {
  storage->clear();
  out->clear();
  const std::vector<HfTensorMapping> table = HfTensorMappings(arch, spec);
  size_t copies = 0;
  for (const HfTensorMapping& m : table) copies += m.InPlace() ? 0 : 1;
  storage->reserve(copies);  // views point into it: no reallocation
  for (const HfTensorMapping& m : table) {
    auto it = keel.find(m.keel_name);
    if (it == keel.end()) return Status::Corruption("tensor '" + m.keel_name + "' is missing");
    if (it->second.shape != m.keel_shape)
      return Status::Corruption(fmt::format("tensor '{}' has shape [{}], expected [{}]",
                                            m.keel_name, fmt::join(it->second.shape, ", "),
                                            fmt::join(m.keel_shape, ", ")));
    if (m.InPlace()) {
      out->push_back({m.hf_name, m.hf_shape, HfViewOf(m, it->second.data)});
    } else {
      storage->emplace_back(static_cast<size_t>(NumElements(m.hf_shape)));
      KeelToHf(m, it->second.data, storage->back().data());
      out->push_back({m.hf_name, m.hf_shape, storage->back().data()});
    }
  }
  return Status::OK();
}

Status ExportHf(Env* env, const std::string& checkpoint_path, const std::string& out_dir,
                const HfExportOptions& options, const CheckpointStore::Logger& log,
                HfExportReport* report) {
  *report = HfExportReport();
  const std::string out = StripTrailingSlashes(out_dir);
  const std::string tmp = out + ".tmp";
  report->out_dir = out;
  KEEL_RETURN_IF_ERROR(CheckNewOutputDir(env, out, "keel ckpt export"));

  std::string dir;
  KEEL_RETURN_IF_ERROR(
      ResolveCheckpointDir(env, checkpoint_path, log, NamedCheckpoint::kVerify, &dir));
  report->checkpoint_dir = dir;
  SavedTrainState saved;
  KEEL_RETURN_IF_ERROR(ReadSavedTrainState(env, dir, &saved));
  const GptSpec& spec = saved.spec;
  KEEL_RETURN_IF_ERROR(HfArchForSpec(spec, &report->arch));
  const HfArch arch = report->arch;
  JsonReader reader(JoinPath(saved.dir, "state.json"), saved.state, kDamagedCheckpointFix);
  const JsonValue tj = reader.root().Optional("tokenizer");
  CheckpointTokenizer tok;
  tok.kind = tj.Optional("kind").Get<std::string>();
  tok.eod_id = tj.Optional("eod_id").Get<int32_t>(-1);
  tok.vocab_size = tj.Optional("vocab_size").Get<int>(0);
  const std::string model_file = tj.Optional("model").Get<std::string>("tokenizer.model");
  KEEL_RETURN_IF_ERROR(reader.status());
  tok.model_path = JoinPath(dir, model_file);
  report->tokenizer_kind = tok.kind;
  if (tok.vocab_size != spec.vocab)
    return Status::Corruption(
        fmt::format("{}/state.json: tokenizer vocab_size {} differs from the model's vocab {}", dir,
                    tok.vocab_size, spec.vocab));
  if (tok.eod_id < 0 || tok.eod_id >= spec.vocab)
    return Status::Corruption(fmt::format("{}/state.json: tokenizer eod_id {} is outside [0, {})",
                                          dir, tok.eod_id, spec.vocab));
  report->vocab = spec.vocab;
  report->padded_vocab = spec.padded_vocab;

  // Weights, whole, whatever layout saved them: in place from the mapped file when one piece
  // holds a tensor, joined from the tensor-parallel pieces otherwise.
  CheckpointTensors pieces;
  CheckpointTensors::Options verified;  // ResolveCheckpointDir checked every checksum
  verified.checksums = false;
  KEEL_RETURN_IF_ERROR(CheckpointTensors::Open(env, dir, verified, &pieces));
  const std::string wpath = pieces.tensor_size() == 1 && pieces.pipeline_size() == 1
                                ? JoinPath(dir, "model.safetensors")
                                : dir + " (weights saved at " + pieces.layout() + ")";
  FullTensors full;
  KEEL_RETURN_IF_ERROR(ReadAllFull(pieces, &full));
  std::map<std::string, TensorView> keel;
  for (const auto& [name, r] : full.weights)
    keel[name] = {name, r.shape, reinterpret_cast<const float*>(r.data)};
  std::vector<std::vector<float>> storage;
  std::vector<TensorView> hf;
  Status st = ConvertToHf(arch, spec, keel, &storage, &hf);
  if (!st.ok()) return Status::Corruption(wpath + ": " + st.message());
  report->num_tensors = hf.size();
  // A diverged checkpoint's NaN/Inf weights would load in transformers without a word.
  NonFiniteParams nf;
  for (const ParamInfo& p : GptModel::ParamLayout(spec)) {
    auto it = keel.find(p.name);
    if (it == keel.end()) continue;
    size_t n = 0;
    for (size_t i = 0; i < p.numel; ++i) n += !std::isfinite(it->second.data[i]);
    if (n > 0 && nf.count == 0) {
      nf.first_tensor = p.name;
      nf.in_first_tensor = n;
    }
    nf.count += n;
  }
  if (nf.count > 0)
    return NonFiniteWeightsError(dir, nf, "export",
                                 "`keel ckpt export RUN/iter_N --hf " + out + "` exports one");

  // Everything but the weights, as bytes.
  std::vector<std::pair<std::string, std::string>> files;
  files.emplace_back("config.json", HfConfigJson(arch, spec, tok.eod_id).dump(2) + "\n");
  HfTokenizerFiles tfiles;
  KEEL_RETURN_IF_ERROR(ExportHfTokenizer(
      env, arch, tok,
      options.gpt2_assets_dir.empty() ? DefaultGpt2AssetsDir() : options.gpt2_assets_dir,
      spec.max_positions, &tfiles));
  report->wrote_tokenizer = !tfiles.files.empty();
  report->tokenizer_note = tfiles.note;
  for (auto& f : tfiles.files) files.push_back(std::move(f));

  // Write OUT.tmp, then rename it to OUT.
  KEEL_RETURN_IF_ERROR(env->CreateDirs(tmp));
  auto write_all = [&]() -> Status {
    KEEL_RETURN_IF_ERROR(
        WriteSafetensors(env, JoinPath(tmp, "model.safetensors"), hf, {{"format", "pt"}}));
    for (const auto& [name, bytes] : files)
      KEEL_RETURN_IF_ERROR(WriteFileAtomic(env, JoinPath(tmp, name), bytes));
    std::vector<std::string> names = {"model.safetensors"};
    for (const auto& f : files) names.push_back(f.first);
    for (const std::string& name : names) {
      uint64_t size = 0;
      KEEL_RETURN_IF_ERROR(env->GetFileSize(JoinPath(tmp, name), &size));
      report->files.emplace_back(name, size);
    }
    KEEL_RETURN_IF_ERROR(env->SyncDir(tmp));
    return env->RenameFile(tmp, out);  // fails (ENOTEMPTY) if OUT was filled meanwhile
  };
  st = write_all();
  if (!st.ok()) {
    env->RemoveDirRecursive(tmp);  // best effort; OUT itself was never touched
    report->files.clear();
    return st;
  }
  return env->SyncDir(ParentDir(out));
}

}  // namespace keel
