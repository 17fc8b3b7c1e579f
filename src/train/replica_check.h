// Replica consistency: data-parallel ranks are replicas of one model; after every update their
// weights (and, without ZeRO-1, their Adam moments) and their TrainState must be bit-identical.
// A bit flip in one rank's memory or a nondeterministic op makes one drift silently — BLOOM's
// layer-norm weights drifted apart across ranks for months. Every rank hashes each tensor; the
// hashes are gathered; any tensor whose hash differs from the majority's is named with its rank.
// Tensor parallel: a split tensor's slice is compared among the ranks holding that slice (the
// data-parallel replicas), a replicated one (norms, row-parallel biases) among every rank, so a
// LayerNorm drifting apart across tensor ranks (tr11's) is caught too.
// Pipeline parallel: stages hold different tensors, so each is compared among the ranks of its
// stage (a slice among those of its (tp, pp) position); the last stage's copy of the tied word
// embeddings among the first stage's embedding holders of its tensor rank (the two copies must
// stay the same bits: a drifted one is named as "the last stage's tied copy").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/status.h"
#include "train/trainer.h"

namespace keel {

// (name, xxh3) of everything replicas must hold identically: each parameter tensor, each moment
// tensor when the optimizer is replicated, and the TrainState ("train state").
std::vector<std::pair<std::string, uint64_t>> ReplicaHashes(Trainer& trainer);

// A collective: every rank calls it at the same iteration. Corruption naming the ranks (with
// `hosts`, one per rank) and the tensors that differ from the majority; OK when all agree.
// `checked` gets how many tensors were compared.
Status CheckReplicas(Trainer& trainer, Communicator* comm, const std::vector<std::string>& hosts,
                     size_t* checked);

}  // namespace keel
