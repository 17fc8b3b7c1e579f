#include "pipeline/pipeline_step.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

namespace keel {

ModelStage ModelStageOf(const std::vector<StageLayers>& partition, int pipeline, int rank,
                        int chunk) {
  const StageLayers& s = partition.at(static_cast<size_t>(chunk) * pipeline + rank);
  ModelStage m;
  m.first_layer = s.first;
  m.last_layer = s.last;
  m.embedding = s.embedding;
  m.head = s.head;
  return m;
}

namespace {

// The model holding the embedding (first) or the tied copy (last) on this rank, or null.
GptModel* TiedHolder(const std::vector<GptModel*>& chunks, bool first) {
  for (GptModel* m : chunks) {
    if (first ? m->stage().embedding : m->stage().head) return m;
  }
  return nullptr;
}

}  // namespace

void SyncTiedEmbeddingGrads(Communicator* pipeline, const std::vector<GptModel*>& chunks) {
  const int P = pipeline->world_size(), r = pipeline->rank();
  if (P == 1 || chunks.empty() || chunks[0]->spec().untie_embeddings) return;
  if (r != 0 && r != P - 1) return;
  GptModel* m = TiedHolder(chunks, r == 0);
  KEEL_CHECK(m != nullptr, fmt::format("pipeline rank {} of {} holds no {}", r, P,
                                       r == 0 ? "embedding" : "output layer"));
  const ParamInfo* p = m->FindParam("embedding.word_embeddings.weight");
  KEEL_CHECK(p != nullptr, "a tied stage without its word embeddings");
  Backend* be = m->backend();
  float* g = m->grad_data() + p->offset;
  float* other = be->AllocFloats(p->numel);
  be->Synchronize();
  // First sends then receives, last the reverse: no deadlock under a rendezvous Send.
  if (r == 0) {
    pipeline->Send(g, p->numel, P - 1);
    pipeline->Recv(other, p->numel, P - 1);
  } else {
    pipeline->Recv(other, p->numel, 0);
    pipeline->Send(g, p->numel, 0);
  }
  // a + b is b + a in IEEE arithmetic: both copies get the same bits.
  be->Accumulate(g, other, p->numel);
  be->Synchronize();
  be->Free(other);
}

Status RunPipelineStep(const PipelineSchedule& schedule, Communicator* pipeline,
                       const std::vector<GptModel*>& chunks,
                       const std::vector<PipelineMicroBatch>& microbatches, int B, int T,
                       float dloss, PipelineStepResult* out, const PipelineStepHooks& hooks) {
  const int P = schedule.stages, V = schedule.chunks, r = pipeline->rank();
  if (static_cast<int>(chunks.size()) != V) {
    return Status::InvalidArgument(fmt::format(
        "pipeline step: the schedule has {} chunks per stage but stage {} has {} models", V, r,
        chunks.size()));
  }
  if (static_cast<int>(microbatches.size()) != schedule.microbatches) {
    return Status::InvalidArgument(
        fmt::format("pipeline step: the schedule has {} micro-batches but {} were given",
                    schedule.microbatches, microbatches.size()));
  }
  for (int c = 0; c < V; ++c) {
    const int v = schedule.VirtualStage(r, c);
    const ModelStage& st = chunks[c]->stage();
    if (st.embedding != (v == 0) || st.head != (v == P * V - 1)) {
      return Status::InvalidArgument(fmt::format(
          "pipeline step: stage {} chunk {} (virtual stage {} of {}) holds {}: the embedding "
          "belongs to virtual stage 0 and the head to the last (build it with ModelStageOf)",
          r, c, v, P * V, st.Describe(chunks[c]->spec().num_layers)));
    }
  }
  for (GptModel* m : chunks) m->StartGradAccumulation();
  // Per chunk: the slot of each micro-batch in flight, and the free slots (smallest first).
  std::vector<std::map<int, int>> slot_of(V);
  std::vector<std::set<int>> free_slots(V);
  std::vector<int> slots_made(V, 0);
  int peak = 0;
  double loss_sum = 0;
  StageFunctions fns;
  fns.activation_floats = chunks[0]->StageActivationFloats(B, T);
  fns.forward = [&](int mb, int c, const float* input, float* output) {
    int slot;
    if (free_slots[c].empty()) {
      slot = slots_made[c]++;
    } else {
      slot = *free_slots[c].begin();
      free_slots[c].erase(free_slots[c].begin());
    }
    slot_of[c][mb] = slot;
    if (hooks.on_compute) hooks.on_compute(false);
    peak = std::max(peak, static_cast<int>(slot_of[c].size()));
    const PipelineMicroBatch& batch = microbatches[mb];
    loss_sum +=
        chunks[c]->StageForward(slot, batch.tokens, input, batch.targets, B, T, dloss, output);
    if (hooks.after_forward) hooks.after_forward(mb, c);
  };
  fns.backward = [&](int mb, int c, const float* output_grad, float* input_grad) {
    auto it = slot_of[c].find(mb);
    KEEL_CHECK(it != slot_of[c].end(), "pipeline step: a backward before its forward");
    if (hooks.on_compute) hooks.on_compute(true);
    chunks[c]->StageBackward(it->second, output_grad, input_grad);
    free_slots[c].insert(it->second);
    slot_of[c].erase(it);
  };
  fns.before_transfer = hooks.on_transfer;
  PipelineStepResult res;
  Status st = RunPipelineSchedule(schedule, pipeline, fns, &res.stats);
  if (!st.ok()) return st;
  if (hooks.on_transfer) hooks.on_transfer();
  SyncTiedEmbeddingGrads(pipeline, chunks);
  // Only the last stage has the loss; the others add 0 (exact).
  pipeline->AllReduceSumHost(&loss_sum, 1);
  res.loss_sum = loss_sum;
  res.peak_slots = peak;
  if (out != nullptr) *out = res;
  return Status::OK();
}

Status RunPipelineForward(Communicator* pipeline, const std::vector<GptModel*>& chunks,
                          const std::vector<PipelineMicroBatch>& microbatches, int B, int T,
                          double* loss_sum, const PipelineStepHooks& hooks) {
  const int P = pipeline->world_size(), r = pipeline->rank();
  const int V = static_cast<int>(chunks.size());
  if (V == 0) return Status::InvalidArgument("pipeline forward: no model chunks");
  const size_t floats = chunks[0]->StageActivationFloats(B, T);
  std::vector<float> in(floats), out(floats);
  double sum = 0;
  // Virtual stage v runs on rank v % P as chunk v / P; consecutive ones are on different ranks
  // (P >= 2), and every rank meets the sends and receives in the one global order: no deadlock.
  for (int mb = 0; mb < static_cast<int>(microbatches.size()); ++mb) {
    for (int v = 0; v < P * V; ++v) {
      if (v % P != r) continue;
      const int c = v / P;
      const bool first = v == 0, last = v == P * V - 1;
      if (!first) {
        if (hooks.on_transfer) hooks.on_transfer();
        pipeline->Recv(in.data(), floats, (v - 1) % P);
      }
      const PipelineMicroBatch& batch = microbatches[mb];
      if (hooks.on_compute) hooks.on_compute(false);
      sum += chunks[c]->StageForward(0, batch.tokens, first ? nullptr : in.data(), batch.targets, B,
                                     T, 0.0f, last ? nullptr : out.data());
      if (hooks.after_forward) hooks.after_forward(mb, c);
      if (last) continue;
      if (hooks.on_transfer) hooks.on_transfer();
      pipeline->Send(out.data(), floats, (v + 1) % P);
    }
  }
  pipeline->AllReduceSumHost(&sum, 1);
  *loss_sum = sum;
  return Status::OK();
}

}  // namespace keel
