// Megatron MMIDIDX datasets: PREFIX.idx, PREFIX.bin and keel's PREFIX.meta.json (the input's three
// parts, see fuzz_input.h). An opened dataset must then read every token and pass `keel data
// verify`'s check without touching memory outside its files.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "data/dataset_check.h"
#include "data/indexed_dataset.h"
#include "fuzz_input.h"
#include "mem_env.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = keel::fuzz::SplitInput(data, size, 3);
  keel::fuzz::MemEnv env;
  env.Put("/data/ds.idx", parts[0]);
  env.Put("/data/ds.bin", parts[1]);
  if (!parts[2].empty()) env.Put("/data/ds.meta.json", parts[2]);
  std::unique_ptr<keel::IndexedDataset> ds;
  if (!keel::IndexedDataset::Open(&env, "/data/ds", &ds).ok()) return 0;
  std::vector<int32_t> tokens(static_cast<size_t>(ds->NumTokens()));
  ds->ReadStream(0, ds->NumTokens(), tokens.data());
  for (size_t d = 0; d < ds->NumDocuments(); ++d)
    if (ds->DocumentLength(d) > 0) (void)ds->Token(d, ds->DocumentLength(d) - 1);
  (void)keel::CheckDataset(*ds, ds->meta().vocab_size, ds->meta().eod_id);
  return 0;
}
