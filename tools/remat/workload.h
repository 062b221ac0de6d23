// workload.h: a built-in model, its data and its loss, chosen by flags.
//
// The model factory behind --model gpt|mlp|resnet|unet2d|unet3d and the size
// flags shared by train, profile, explain, bench and fit. gpt, mlp and resnet
// are a torch::nn::Sequential of one-tensor stages (remat_models), so they are
// chains for the planner:
//   gpt     character-level transformer on the built-in text or --data FILE;
//           next-character cross-entropy.
//   mlp     --layers Linear+ReLU stages of width --hidden, then a 10-way
//           Linear+ReLU head, on a synthetic task: classify random vectors by
//           a fixed random linear teacher.
//   resnet  ResNet-style chain (stage channels hidden, 2 hidden, 4 hidden,
//           8 hidden; --layers blocks per stage) on synthetic --image-sized
//           images: a fixed random template per class plus noise.
// unet2d and unet3d are graphs (models::UNet's stages: skip connections), for
// the graph planner (remat/graph.h): --levels resolution levels, base width
// --hidden, on synthetic ellipse (2D, --image x --image) or ellipsoid (3D,
// --image^3) phantoms (models::phantom_batch); cross-entropy plus soft Dice.
// Only train and fit take them (training_graph()); model() and
// training_model() refuse them with a UsageError.
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
// A graph model's training graph ends the same way: a LossHead stage reading
// the model's last stage.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <ATen/core/Generator.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>

#include <models/unet.h>
#include <remat/graph.h>
#include <remat/precision.h>
#include <remat/profile.h>

namespace remat::cli {

/// Model flags. The defaults are those of every command (the `remat train`
/// demo: 250 steps of this GPT take about a minute on 2 shared cores, and the
/// loss falls from about 3.9 to about 1.6). A U-Net has its own defaults of
/// --hidden, --image, --batch and --dropout (unet_defaults) where they are
/// not given.
struct ModelFlags {
  /// gpt, mlp, resnet, unet2d or unet3d.
  std::string model = "gpt";
  /// gpt: transformer blocks; mlp: hidden stages; resnet: blocks per stage.
  int64_t layers = 4;
  /// gpt: model width; mlp: stage width; resnet: channels of the first stage.
  int64_t hidden = 96;
  /// gpt: attention heads (must divide --hidden).
  int64_t heads = 4;
  /// gpt: context length in characters.
  int64_t seq = 64;
  /// gpt: with a value in [1, seq), batches vary in length: the first is
  /// --seq long (what plans and profiles are made on), every later one
  /// uniformly between --min-seq and --seq. 0: every batch is --seq long.
  int64_t min_seq = 0;
  /// unet2d, unet3d: resolution levels (poolings).
  int64_t levels = 3;
  /// resnet: image height and width; unet2d, unet3d: image (volume) edge.
  int64_t image = 32;
  /// Dropout probability (gpt and mlp).
  double dropout = 0.1;
  /// Examples (sequences, vectors, images) per batch.
  int64_t batch = 16;
  /// gpt: a text file to train on instead of the built-in text.
  std::string data;
};

/// Registers --model, --layers, --hidden, --heads, --seq, --min-seq, --levels,
/// --image, --dropout, --batch and --data on `command`, with `flags` holding
/// the defaults (shown in --help) and receiving the values; for a U-Net, the
/// flags not given take unet_defaults() after parsing.
void add_model_flags(CLI::App& command, ModelFlags& flags);

/// Whether `model` names a graph model (unet2d, unet3d).
bool is_graph_model(const std::string& model);

/// The sizes a U-Net of `model` (unet2d or unet3d) trains at by default:
/// --hidden 8 and no dropout; --image 32 and --batch 8 in 2D, --image 16
/// and --batch 4 in 3D (about 0.1 s per step on 2 shared cores).
ModelFlags unet_defaults(const std::string& model);

/// A U-Net's (models::UNet's) spatial size at --image `edge`: {edge, edge}
/// or {edge, edge, edge}.
std::vector<int64_t> unet_spatial_size(const std::string& model, int64_t edge);

/// One batch of inputs and targets.
struct Batch {
  torch::Tensor inputs;
  torch::Tensor targets;
};

/// The training loss of a built-in model as a stage: the loss of the
/// model's output against the targets set for the current batch.
class LossHeadImpl : public torch::nn::Cloneable<LossHeadImpl> {
 public:
  /// `model`: "gpt" (next-token cross-entropy over [B, S, vocab] logits),
  /// "unet2d" or "unet3d" (models::segmentation_loss of [B, 2, *spatial]
  /// logits against [B, *spatial] labels) or another built-in model
  /// (cross-entropy over [B, classes]).
  explicit LossHeadImpl(std::string model = "mlp");
  void reset() override {}
  /// The loss of `output`. Throws c10::Error if no targets were set.
  torch::Tensor forward(const torch::Tensor& output);
  /// Targets for the following forwards (the current batch's).
  void set_targets(torch::Tensor targets);
  /// The model named at construction.
  const std::string& model() const {
    return model_;
  }
  void pretty_print(std::ostream& stream) const override;

 private:
  std::string model_;
  torch::Tensor targets_;
};
TORCH_MODULE(LossHead);

/// Sets `batch`'s targets on the LossHead that ends `training_model` (a
/// Workload::training_model() or a clone of one). Throws c10::Error if its
/// last child is not a LossHead.
void set_targets(
    const torch::nn::Sequential& training_model, const Batch& batch);

/// A graph model as training runs it: the model's stages followed by a
/// LossHead stage reading the last of them (see the top of this header).
struct TrainingGraph {
  /// The U-Net: the one module owning every stage's parameters and buffers.
  models::UNet unet{nullptr};
  /// unet->stages(), then the loss stage.
  std::vector<GraphStage> stages;
  /// The stages of the encoder (encoder and pool of every level): what
  /// encoder-only checkpointing checkpoints.
  int64_t encoder_stages = 0;
};

/// The training graph of `unet` with a LossHead for `model` (its stages
/// share unet's modules).
TrainingGraph training_graph_of(models::UNet unet, const std::string& model);

/// A training graph over a deep copy of `graph`'s U-Net (parameters,
/// buffers), for a baseline run.
TrainingGraph clone_training_graph(const TrainingGraph& graph);

/// Sets `batch`'s targets on the LossHead that ends `graph`.
void set_targets(const TrainingGraph& graph, const Batch& batch);

/// graph.stages with a loss stage of their own that always reads `targets`
/// (set_targets on `graph` does not change it): for stages of several input
/// sizes alive at once, as fit's problems are.
std::vector<GraphStage> stages_with_targets(
    const TrainingGraph& graph, torch::Tensor targets);

/// `graph` profiled on `batch` (whose targets it sets) under an
/// AutocastGuard for the CPU in `precision`: what train, profile and explain
/// plan a graph model on.
planner::Graph profile_training_graph(
    const TrainingGraph& graph,
    const Batch& batch,
    Precision precision,
    const ProfileOptions& options);

/// A model with its data and loss.
class Workload {
 public:
  /// Builds the model (initialised from `seed`) and its data.
  /// Throws UsageError naming the flag and value for bad sizes, an unreadable
  /// or empty --data file, or a text shorter than --seq + 1 characters.
  Workload(const ModelFlags& flags, uint64_t seed);

  /// The model. Its children are the stages of the chain. Throws
  /// UsageError for a graph model.
  torch::nn::Sequential model() const;
  /// The model's stages (the same modules) followed by a LossHead: what
  /// training plans and runs (see the top of this header). Throws
  /// UsageError for a graph model.
  torch::nn::Sequential training_model() const;
  /// Whether the model is a graph (unet2d, unet3d).
  bool is_graph() const {
    return !graph_.unet.is_empty();
  }
  /// A graph model's training graph. REQUIRES: is_graph().
  const TrainingGraph& training_graph() const;
  /// The next batch from the workload's generator.
  Batch next_batch();
  /// A batch never trained on (graph models: phantoms of another seed), for
  /// scores such as the Dice of a segmentation.
  Batch held_out_batch() const;
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
  TrainingGraph graph_;
  at::Generator generator_;
  uint64_t seed_ = 0;
  int64_t batches_drawn_ = 0;
  std::string detail_;
  // gpt: the token stream; mlp: the teacher matrix; resnet: class templates.
  torch::Tensor data_;
};

}  // namespace remat::cli
