// workload.h: a built-in model, its data and its loss, chosen by flags.
//
// The model factory behind --model gpt|mlp|resnet and the size flags shared by
// train, profile, explain and bench. Every model is a torch::nn::Sequential of
// one-tensor stages (remat_models), so it is a chain for the planner:
//   gpt     character-level transformer on the built-in text or --data FILE;
//           next-character cross-entropy.
//   mlp     --layers Linear+ReLU stages of width --hidden, then a 10-way
//           Linear+ReLU head, on a synthetic task: classify random vectors by
//           a fixed random linear teacher.
//   resnet  ResNet-style chain (stage channels hidden, 2 hidden, 4 hidden,
//           8 hidden; --layers blocks per stage) on synthetic --image-sized
//           images: a fixed random template per class plus noise.
// Batches come from the workload's own generator (seeded), so two workloads
// made with the same flags and seed give the same batches.
//
// The commands that plan and run training steps (train, profile, explain,
// bench) run the training model: the model's stages followed by a LossHead,
// whose forward returns the loss against the current batch's targets. The
// loss is then one more stage of the chain, profiled and planned like the
// others, so the memory it takes (its saved tensors, the loss itself and the
// gradient that seeds backward) is in every prediction, and a measured step
// keeps the promise "peak <= budget" to the byte. (A loss computed outside a
// planned chain adds memory no plan accounts for: docs/planned_execution.md.)
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <ATen/core/Generator.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>

namespace remat::cli {

/// Model flags. The defaults are those of every command (the `remat train`
/// demo: 250 steps of this GPT take about a minute on 2 shared cores, and the
/// loss falls from about 3.9 to about 1.6).
struct ModelFlags {
  /// gpt, mlp or resnet.
  std::string model = "gpt";
  /// gpt: transformer blocks; mlp: hidden stages; resnet: blocks per stage.
  int64_t layers = 4;
  /// gpt: model width; mlp: stage width; resnet: channels of the first stage.
  int64_t hidden = 96;
  /// gpt: attention heads (must divide --hidden).
  int64_t heads = 4;
  /// gpt: context length in characters.
  int64_t seq = 64;
  /// resnet: image height and width.
  int64_t image = 32;
  /// Dropout probability (gpt and mlp).
  double dropout = 0.1;
  /// Examples (sequences, vectors, images) per batch.
  int64_t batch = 16;
  /// gpt: a text file to train on instead of the built-in text.
  std::string data;
};

/// Registers --model, --layers, --hidden, --heads, --seq, --image,
/// --dropout, --batch and --data on `command`, with `flags` holding the
/// defaults (shown in --help) and receiving the values.
void add_model_flags(CLI::App& command, ModelFlags& flags);

/// One batch of inputs and targets.
struct Batch {
  torch::Tensor inputs;
  torch::Tensor targets;
};

/// The training loss of a built-in model as a stage: the loss of the
/// model's output against the targets set for the current batch.
class LossHeadImpl : public torch::nn::Cloneable<LossHeadImpl> {
 public:
  /// `model`: "gpt" (next-token cross-entropy over [B, S, vocab] logits) or
  /// another built-in model (cross-entropy over [B, classes]).
  explicit LossHeadImpl(std::string model = "mlp");
  void reset() override {}
  /// The loss of `output`. Throws c10::Error if no targets were set.
  torch::Tensor forward(const torch::Tensor& output);
  /// Targets for the following forwards (the current batch's).
  void set_targets(torch::Tensor targets);
  void pretty_print(std::ostream& stream) const override;

 private:
  std::string model_;
  torch::Tensor targets_;
};
TORCH_MODULE(LossHead);

/// Sets `batch`'s targets on the LossHead that ends `training_model` (a
/// Workload::training_model() or a clone of one). Throws c10::Error if its
/// last child is not a LossHead.
void set_targets(const torch::nn::Sequential& training_model, const Batch& batch);

/// A model with its data and loss.
class Workload {
 public:
  /// Builds the model (initialised from `seed`) and its data.
  /// Throws UsageError naming the flag and value for bad sizes, an unreadable
  /// or empty --data file, or a text shorter than --seq + 1 characters.
  Workload(const ModelFlags& flags, uint64_t seed);

  /// The model. Its children are the stages of the chain.
  torch::nn::Sequential model() const {
    return model_;
  }
  /// The model's stages (the same modules) followed by a LossHead: what
  /// training plans and runs (see the top of this header).
  torch::nn::Sequential training_model() const {
    return training_model_;
  }
  /// The next batch from the workload's generator.
  Batch next_batch();
  /// "gpt (4 layers, hidden 128, 4 heads, seq 64, batch 16; vocab 60, built-in
  /// text 12.3 KiB), 803k parameters".
  std::string description() const;
  /// Number of trainable parameters.
  int64_t parameter_count() const;
  /// The flags the workload was built from.
  const ModelFlags& flags() const {
    return flags_;
  }

 private:
  ModelFlags flags_;
  torch::nn::Sequential model_{nullptr};
  torch::nn::Sequential training_model_{nullptr};
  at::Generator generator_;
  std::string detail_;
  // gpt: the token stream; mlp: the teacher matrix; resnet: class templates.
  torch::Tensor data_;
};

}  // namespace remat::cli
