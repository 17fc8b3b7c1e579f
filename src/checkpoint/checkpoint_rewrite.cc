#include "checkpoint/checkpoint_rewrite.h"

#include "checkpoint/manifest.h"

namespace keel {

Status RewriteCheckpointFiles(Env* env, const std::string& dir,
                              const std::map<std::string, std::string>& replaced) {
  std::string path = dir;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const auto slash = path.rfind('/');
  const std::string parent = slash == std::string::npos ? "." : path.substr(0, slash ? slash : 1);
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  Manifest old_m;
  KEEL_RETURN_IF_ERROR(VerifyCheckpointDir(env, path, /*check_contents=*/true, &old_m));
  const std::string tmp = JoinPath(parent, ".edit." + name);
  if (env->FileExists(tmp)) KEEL_RETURN_IF_ERROR(env->RemoveDirRecursive(tmp));
  KEEL_RETURN_IF_ERROR(env->CreateDirs(tmp));
  Manifest m;
  m.iteration = old_m.iteration;
  for (const ManifestEntry& e : old_m.files) {
    if (replaced.count(e.name)) continue;
    KEEL_RETURN_IF_ERROR(env->LinkFile(JoinPath(path, e.name), JoinPath(tmp, e.name)));
    m.files.push_back(e);
  }
  auto write = [&](const std::string& file, const std::string& bytes) -> Status {
    std::unique_ptr<WritableFile> f;
    KEEL_RETURN_IF_ERROR(env->NewWritableFile(JoinPath(tmp, file), &f));
    Status st = f->Append(bytes);
    if (st.ok()) st = f->Sync();
    Status cst = f->Close();
    KEEL_RETURN_IF_ERROR(st);
    return cst;
  };
  for (const auto& [file, bytes] : replaced) {
    KEEL_RETURN_IF_ERROR(write(file, bytes));
    m.files.push_back({file, bytes.size(), Xxh3(bytes.data(), bytes.size())});
  }
  KEEL_RETURN_IF_ERROR(write(kManifestFile, m.ToJson()));
  KEEL_RETURN_IF_ERROR(env->SyncDir(tmp));
  KEEL_RETURN_IF_ERROR(env->ExchangePaths(tmp, path));
  KEEL_RETURN_IF_ERROR(env->SyncDir(parent));
  return env->RemoveDirRecursive(tmp);  // now the old version
}

}  // namespace keel
