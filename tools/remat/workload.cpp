// workload.cpp: the model factory and synthetic data (see workload.h).
#include "workload.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include <models/models.h>

#include <remat/planner/units.h>
#include "cli_error.h"
#include "commands.h"

namespace remat::cli {
namespace {

constexpr int64_t kClasses = 10;

// The seed of a workload's held-out batch: far from its training batches'.
constexpr uint64_t kHeldOutSeedOffset = 0x5eed0000ULL;

// The message of a chain-only use of a graph model.
std::string graph_model_refused(const std::string& model) {
  return "--model " + model +
         ": a U-Net is a graph of stages (skip connections), not a chain; "
         "this use takes gpt, mlp or resnet";
}

void require_positive(const char* flag, int64_t value) {
  if (value < 1) {
    throw UsageError(
        std::string(flag) + ": expected a positive integer, got " +
        std::to_string(value));
  }
}

// Model sizes beyond these are typos (or 2^63): refused by name before any
// allocation, instead of a std::bad_alloc, a LibTorch size overflow, signed
// overflow in the size arithmetic, or hours spent building modules.
constexpr int64_t kMaxLayers = 100000;
constexpr int64_t kMaxWidth = int64_t{1} << 20;  // --hidden, --heads
constexpr int64_t kMaxBatch = int64_t{1} << 24;  // fit's --max-batch
constexpr int64_t kMaxSeq = int64_t{1} << 18;    // fit's --max-seq-len
constexpr int64_t kMaxImage = int64_t{1} << 16;  // resnet's --image

void require_at_most(const char* flag, int64_t value, int64_t limit) {
  if (value > limit) {
    throw UsageError(
        std::string(flag) + ": expected at most " + std::to_string(limit) +
        ", got " + std::to_string(value));
  }
}

std::string read_text_file(const std::string& path) {
  std::string text = read_regular_file("--data", path);
  if (text.empty()) {
    throw UsageError("--data: '" + path + "' is empty");
  }
  return text;
}

}  // namespace

void add_model_flags(CLI::App& command, ModelFlags& flags) {
  command
      .add_option(
          "--model",
          flags.model,
          "Built-in model: gpt, mlp or resnet (chains), unet2d or unet3d "
          "(U-Net graphs; train and fit)")
      ->check(CLI::IsMember({"gpt", "mlp", "resnet", "unet2d", "unet3d"}))
      ->capture_default_str();
  command
      .add_option(
          "--layers",
          flags.layers,
          "gpt: transformer blocks; mlp: hidden stages; resnet: residual "
          "blocks per stage")
      ->capture_default_str();
  CLI::Option* hidden =
      command
          .add_option(
              "--hidden",
              flags.hidden,
              "gpt: model width; mlp: stage width; resnet: channels of the "
              "first stage (doubling per stage); unet: base width (default 8)")
          ->capture_default_str();
  command.add_option("--heads", flags.heads, "gpt: attention heads")
      ->capture_default_str();
  command.add_option("--seq", flags.seq, "gpt: context length in characters")
      ->capture_default_str();
  command
      .add_option(
          "--min-seq",
          flags.min_seq,
          "gpt: batches of varying length: the first --seq long, the others "
          "uniformly between this and --seq (0: all --seq long)")
      ->capture_default_str();
  command
      .add_option(
          "--levels",
          flags.levels,
          "unet: resolution levels (--image must divide by 2^levels)")
      ->capture_default_str();
  CLI::Option* image =
      command
          .add_option(
              "--image",
              flags.image,
              "resnet: image height and width; unet: image (3D: volume) "
              "edge (defaults 32 in 2D, 16 in 3D)")
          ->capture_default_str();
  CLI::Option* dropout =
      command
          .add_option(
              "--dropout",
              flags.dropout,
              "Dropout probability (gpt, mlp; unet: default 0)")
          ->capture_default_str();
  CLI::Option* batch =
      command
          .add_option(
              "--batch",
              flags.batch,
              "Examples per batch (unet: defaults 8 in 2D, 4 in 3D)")
          ->capture_default_str();
  command.add_option(
      "--data",
      flags.data,
      "gpt: train on this text file instead of the built-in text");
  // A U-Net's own defaults for the size flags not given.
  command.parse_complete_callback([&flags, hidden, image, dropout, batch] {
    if (!is_graph_model(flags.model)) {
      return;
    }
    const ModelFlags defaults = unet_defaults(flags.model);
    if (hidden->count() == 0) {
      flags.hidden = defaults.hidden;
    }
    if (image->count() == 0) {
      flags.image = defaults.image;
    }
    if (dropout->count() == 0) {
      flags.dropout = defaults.dropout;
    }
    if (batch->count() == 0) {
      flags.batch = defaults.batch;
    }
  });
}

bool is_graph_model(const std::string& model) {
  return model == "unet2d" || model == "unet3d";
}

ModelFlags unet_defaults(const std::string& model) {
  ModelFlags flags;
  flags.model = model;
  flags.hidden = 8;
  flags.dropout = 0;
  flags.levels = 3;
  flags.image = model == "unet3d" ? 16 : 32;
  flags.batch = model == "unet3d" ? 4 : 8;
  return flags;
}

std::vector<int64_t> unet_spatial_size(const std::string& model, int64_t edge) {
  return std::vector<int64_t>(model == "unet3d" ? 3 : 2, edge);
}

namespace {

/// The stage that computes `loss` on the output of stage `last`.
GraphStage loss_stage(LossHead loss, int last) {
  return {
      [loss](const std::vector<torch::Tensor>& in) mutable {
        return loss->forward(in.at(0));
      },
      loss.ptr(),
      {last}};
}

/// The LossHead ending `graph`.
std::shared_ptr<LossHeadImpl> loss_head_of(const TrainingGraph& graph) {
  auto head =
      std::dynamic_pointer_cast<LossHeadImpl>(graph.stages.back().module);
  TORCH_CHECK(
      head != nullptr,
      "remat::cli: expected a training graph ending in a LossHead");
  return head;
}

}  // namespace

TrainingGraph training_graph_of(models::UNet unet, const std::string& model) {
  TrainingGraph graph;
  graph.stages = unet->stages();
  graph.encoder_stages = 2 * unet->options.levels();
  graph.unet = std::move(unet);
  graph.stages.push_back(
      loss_stage(LossHead(model), static_cast<int>(graph.stages.size()) - 1));
  return graph;
}

std::vector<GraphStage> stages_with_targets(
    const TrainingGraph& graph, torch::Tensor targets) {
  LossHead loss(loss_head_of(graph)->model());
  loss->set_targets(std::move(targets));
  std::vector<GraphStage> stages = graph.stages;
  stages.back() = loss_stage(loss, stages.back().inputs.at(0));
  return stages;
}

TrainingGraph clone_training_graph(const TrainingGraph& graph) {
  auto copy = std::dynamic_pointer_cast<models::UNetImpl>(graph.unet->clone());
  TORCH_INTERNAL_ASSERT(copy, "UNet::clone returned another type");
  return training_graph_of(models::UNet(copy), loss_head_of(graph)->model());
}

void set_targets(const TrainingGraph& graph, const Batch& batch) {
  loss_head_of(graph)->set_targets(batch.targets);
}

planner::Graph profile_training_graph(
    const TrainingGraph& graph,
    const Batch& batch,
    Precision precision,
    const ProfileOptions& options) {
  set_targets(graph, batch);
  AutocastGuard autocast(c10::kCPU, precision);
  return profile_graph(graph.stages, batch.inputs, options);
}

Workload::Workload(const ModelFlags& flags, uint64_t seed)
    : flags_(flags), generator_(models::make_cpu_generator(seed)), seed_(seed) {
  require_positive("--layers", flags.layers);
  require_positive("--hidden", flags.hidden);
  require_positive("--batch", flags.batch);
  require_at_most("--layers", flags.layers, kMaxLayers);
  require_at_most("--hidden", flags.hidden, kMaxWidth);
  require_at_most("--batch", flags.batch, kMaxBatch);
  require_at_most("--heads", flags.heads, kMaxWidth);
  require_at_most("--seq", flags.seq, kMaxSeq);
  if (!(flags.dropout >= 0 && flags.dropout < 1)) {
    throw UsageError(
        "--dropout: expected a probability in [0, 1), got " +
        std::to_string(flags.dropout));
  }
  if (flags.min_seq != 0 && flags.model != "gpt") {
    throw UsageError(
        "--min-seq: only --model gpt has sequences, got --model " +
        flags.model);
  }
  if (!flags.data.empty() && flags.model != "gpt") {
    throw UsageError(
        "--data: only --model gpt trains on text, got --model " + flags.model);
  }
  torch::manual_seed(seed);
  std::ostringstream detail;
  if (flags.model == "gpt") {
    require_positive("--heads", flags.heads);
    require_positive("--seq", flags.seq);
    if (flags.min_seq < 0 || flags.min_seq > flags.seq) {
      throw UsageError(
          "--min-seq: expected 0 (fixed length) or a length in [1, --seq " +
          std::to_string(flags.seq) + "], got " +
          std::to_string(flags.min_seq));
    }
    if (flags.hidden % flags.heads != 0) {
      throw UsageError(
          "--heads: must divide --hidden " + std::to_string(flags.hidden) +
          ", got " + std::to_string(flags.heads));
    }
    const std::string text = flags.data.empty() ? models::builtin_text()
                                                : read_text_file(flags.data);
    if (static_cast<int64_t>(text.size()) <= flags.seq + 1) {
      throw UsageError(
          std::string(flags.data.empty() ? "--seq" : "--data") +
          ": the text has " + std::to_string(text.size()) +
          " characters, fewer than --seq + 2 = " +
          std::to_string(flags.seq + 2));
    }
    models::CharTokenizer tokenizer(text);
    data_ = tokenizer.encode(text);
    model_ = models::gpt(models::GptOptions()
                             .vocab(tokenizer.vocab_size())
                             .seq_len(flags.seq)
                             .layers(flags.layers)
                             .hidden(flags.hidden)
                             .heads(flags.heads)
                             .dropout(flags.dropout));
    detail << flags.layers << " layers, hidden " << flags.hidden << ", "
           << flags.heads << " heads, seq "
           << (flags.min_seq > 0 ? std::to_string(flags.min_seq) + "-" : "")
           << flags.seq << ", batch " << flags.batch << "; vocab "
           << tokenizer.vocab_size() << ", "
           << (flags.data.empty() ? "built-in text" : flags.data) << " "
           << planner::format_bytes(static_cast<int64_t>(text.size()));
  } else if (flags.model == "mlp") {
    std::vector<int64_t> widths(flags.layers + 1, flags.hidden);
    widths.push_back(kClasses);
    model_ = models::mlp_chain(
        models::MlpChainOptions(widths).dropout(flags.dropout));
    data_ = torch::randn({flags.hidden, kClasses}, generator_);
    detail << flags.layers << " layers of width " << flags.hidden
           << " + 10-way head, batch " << flags.batch
           << "; synthetic teacher task";
  } else if (flags.model == "resnet") {
    require_positive("--image", flags.image);
    // (A U-Net's --image is checked below against the memory it would take.)
    require_at_most("--image", flags.image, kMaxImage);
    const int64_t stages = 4;
    if (flags.image % (int64_t{1} << (stages - 1)) != 0) {
      throw UsageError(
          "--image: must be divisible by 8, got " +
          std::to_string(flags.image));
    }
    // BatchNorm in training needs two values per channel or more; the last
    // stage's maps are --image / 8 per side.
    const int64_t last_side = flags.image >> (stages - 1);
    if (flags.batch * last_side * last_side < 2) {
      throw UsageError(
          "--batch 1 with --image " + std::to_string(flags.image) +
          ": the last stage's BatchNorm would see one value per channel "
          "(its maps are 1x1); use --batch 2 or more, or a larger --image");
    }
    std::vector<int64_t> channels;
    for (int64_t stage = 0; stage < stages; ++stage) {
      channels.push_back(flags.hidden << stage);
    }
    model_ = models::resnet_chain(models::ResNetChainOptions()
                                      .stage_channels(channels)
                                      .blocks_per_stage(flags.layers)
                                      .classes(kClasses));
    data_ = torch::randn({kClasses, 3, flags.image, flags.image}, generator_);
    detail << flags.layers << (flags.layers == 1 ? " block" : " blocks")
           << " per stage, channels " << flags.hidden << ".."
           << (flags.hidden << (stages - 1)) << ", image " << flags.image
           << ", batch " << flags.batch << "; synthetic class templates";
  } else if (is_graph_model(flags.model)) {
    require_positive("--levels", flags.levels);
    require_positive("--image", flags.image);
    if (flags.levels > 16) {
      throw UsageError(
          "--levels: expected at most 16, got " + std::to_string(flags.levels));
    }
    const int64_t multiple = int64_t{1} << flags.levels;
    if (flags.image % multiple != 0) {
      throw UsageError(
          "--image: must be divisible by 2^levels = " +
          std::to_string(multiple) + " (--levels " +
          std::to_string(flags.levels) + "), got " +
          std::to_string(flags.image));
    }
    const bool volume = flags.model == "unet3d";
    // As the ResNet's: the bottleneck's maps are --image / 2^levels per side.
    if (flags.batch == 1 && flags.image == multiple) {
      throw UsageError(
          "--batch 1 with --image " + std::to_string(flags.image) +
          " (--levels " + std::to_string(flags.levels) +
          "): the bottleneck's BatchNorm would see one value per channel (its "
          "maps are " +
          std::string(volume ? "1x1x1" : "1x1") +
          "); use --batch 2 or more, or a larger --image");
    }
    // The first block's activations (batch x width x edge^dims floats) must
    // have a byte size a tensor can hold; past it the size would wrap.
    const double first_bytes =
        static_cast<double>(flags.batch) * static_cast<double>(flags.hidden) *
        std::pow(static_cast<double>(flags.image), volume ? 3 : 2) * 4;
    if (first_bytes >= 0x1p62) {
      char bytes[32];
      std::snprintf(bytes, sizeof(bytes), "%.3g", first_bytes);
      throw UsageError(
          "--image " + std::to_string(flags.image) +
          ": the first block's activations would take " + bytes +
          " bytes, more than a tensor can hold (2^62)");
    }
    graph_ = training_graph_of(
        models::UNet(models::UNetOptions()
                         .dims(volume ? 3 : 2)
                         .levels(flags.levels)
                         .base_width(flags.hidden)
                         .dropout(flags.dropout)),
        flags.model);
    const std::string edge = std::to_string(flags.image);
    detail << flags.levels << " levels, width " << flags.hidden << ".."
           << (flags.hidden << flags.levels) << ", "
           << (volume ? "volume " + edge + "x" + edge + "x" + edge
                      : "image " + edge + "x" + edge)
           << ", batch " << flags.batch << "; synthetic "
           << (volume ? "ellipsoids" : "ellipses");
    detail_ = detail.str();
    return;
  } else {
    throw UsageError(
        "--model: expected gpt, mlp, resnet, unet2d or unet3d, got '" +
        flags.model + "'");
  }
  detail_ = detail.str();
  training_model_ = torch::nn::Sequential();
  for (const auto& stage : *model_) {
    training_model_->push_back(stage);  // shares the module
  }
  training_model_->push_back(LossHead(flags.model));
}

torch::nn::Sequential Workload::model() const {
  if (is_graph()) {
    throw UsageError(graph_model_refused(flags_.model));
  }
  return model_;
}

torch::nn::Sequential Workload::training_model() const {
  if (is_graph()) {
    throw UsageError(graph_model_refused(flags_.model));
  }
  return training_model_;
}

const TrainingGraph& Workload::training_graph() const {
  TORCH_INTERNAL_ASSERT(is_graph(), "training_graph() of a chain model");
  return graph_;
}

Batch Workload::held_out_batch() const {
  TORCH_INTERNAL_ASSERT(is_graph(), "held_out_batch() of a chain model");
  const models::SegmentationBatch data = models::phantom_batch(
      flags_.batch,
      unet_spatial_size(flags_.model, flags_.image),
      seed_ + kHeldOutSeedOffset);
  return {data.images, data.labels};
}

Batch Workload::next_batch() {
  Batch batch;
  if (is_graph()) {
    // Each batch its own phantoms: seeds seed * 2^20 + 0, 1, 2, ...
    const models::SegmentationBatch data = models::phantom_batch(
        flags_.batch,
        unet_spatial_size(flags_.model, flags_.image),
        (seed_ << 20) + static_cast<uint64_t>(batches_drawn_++));
    batch.inputs = data.images;
    batch.targets = data.labels;
  } else if (flags_.model == "gpt") {
    // --min-seq: every batch after the first draws its own length.
    const int64_t seq =
        flags_.min_seq > 0 && batches_drawn_ > 0
            ? torch::randint(
                  flags_.min_seq, flags_.seq + 1, {1}, generator_, torch::kLong)
                  .item<int64_t>()
            : flags_.seq;
    ++batches_drawn_;
    const int64_t windows = data_.size(0) - seq - 1;
    torch::Tensor starts =
        torch::randint(windows + 1, {flags_.batch}, generator_, torch::kLong);
    torch::Tensor offsets = torch::arange(seq + 1, torch::kLong);
    torch::Tensor windows_tokens =
        data_.index({starts.unsqueeze(1) + offsets.unsqueeze(0)});
    batch.inputs = windows_tokens.slice(1, 0, seq).contiguous();
    batch.targets = windows_tokens.slice(1, 1, seq + 1).contiguous();
  } else if (flags_.model == "mlp") {
    batch.inputs = torch::randn({flags_.batch, flags_.hidden}, generator_);
    batch.targets = batch.inputs.matmul(data_).argmax(1);
  } else {
    batch.targets =
        torch::randint(kClasses, {flags_.batch}, generator_, torch::kLong);
    batch.inputs =
        data_.index({batch.targets}) +
        torch::randn({flags_.batch, 3, flags_.image, flags_.image}, generator_);
  }
  return batch;
}

LossHeadImpl::LossHeadImpl(std::string model) : model_(std::move(model)) {}

torch::Tensor LossHeadImpl::forward(const torch::Tensor& output) {
  TORCH_CHECK(
      targets_.defined(),
      "remat::cli::LossHead: expected targets (set_targets) before forward");
  if (model_ == "gpt") {
    return models::gpt_loss(output, targets_);
  }
  if (is_graph_model(model_)) {
    return models::segmentation_loss(output, targets_);
  }
  return torch::nn::functional::cross_entropy(output, targets_);
}

void LossHeadImpl::set_targets(torch::Tensor targets) {
  targets_ = std::move(targets);
}

void LossHeadImpl::pretty_print(std::ostream& stream) const {
  stream << "remat::cli::LossHead(" << model_ << ")";
}

void set_targets(
    const torch::nn::Sequential& training_model, const Batch& batch) {
  auto head = std::dynamic_pointer_cast<LossHeadImpl>(
      training_model->ptr(training_model->size() - 1));
  TORCH_CHECK(
      head != nullptr,
      "remat::cli::set_targets: expected a training model ending in a "
      "LossHead");
  head->set_targets(batch.targets);
}

int64_t Workload::parameter_count() const {
  int64_t count = 0;
  const std::vector<torch::Tensor> parameters =
      is_graph() ? graph_.unet->parameters() : model_->parameters();
  for (const auto& parameter : parameters) {
    count += parameter.numel();
  }
  return count;
}

std::string Workload::description() const {
  std::ostringstream text;
  const int64_t parameters = parameter_count();
  text << flags_.model << " (" << detail_ << "), ";
  if (parameters >= 1000000) {
    text << parameters / 100000 / 10.0 << "M";
  } else if (parameters >= 1000) {
    text << parameters / 1000 << "k";
  } else {
    text << parameters;
  }
  const size_t stages = is_graph() ? graph_.stages.size() - 1 : model_->size();
  text << " parameters, " << stages << (is_graph() ? " graph" : "")
       << " stages + loss";
  return text.str();
}

}  // namespace remat::cli
