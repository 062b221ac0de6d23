// workload.cpp: the model factory and synthetic data (see workload.h).
#include "workload.h"

#include <cerrno>
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

void require_positive(const char* flag, int64_t value) {
  if (value < 1) {
    throw UsageError(
        std::string(flag) + ": expected a positive integer, got " +
        std::to_string(value));
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
      .add_option("--model", flags.model, "Built-in model: gpt, mlp or resnet")
      ->check(CLI::IsMember({"gpt", "mlp", "resnet"}))
      ->capture_default_str();
  command
      .add_option(
          "--layers",
          flags.layers,
          "gpt: transformer blocks; mlp: hidden stages; resnet: residual "
          "blocks per stage")
      ->capture_default_str();
  command
      .add_option(
          "--hidden",
          flags.hidden,
          "gpt: model width; mlp: stage width; resnet: channels of the first "
          "stage (doubling per stage)")
      ->capture_default_str();
  command.add_option("--heads", flags.heads, "gpt: attention heads")
      ->capture_default_str();
  command.add_option("--seq", flags.seq, "gpt: context length in characters")
      ->capture_default_str();
  command.add_option("--image", flags.image, "resnet: image height and width")
      ->capture_default_str();
  command
      .add_option("--dropout", flags.dropout, "Dropout probability (gpt, mlp)")
      ->capture_default_str();
  command.add_option("--batch", flags.batch, "Examples per batch")
      ->capture_default_str();
  command.add_option(
      "--data",
      flags.data,
      "gpt: train on this text file instead of the built-in text");
}

Workload::Workload(const ModelFlags& flags, uint64_t seed)
    : flags_(flags), generator_(models::make_cpu_generator(seed)) {
  require_positive("--layers", flags.layers);
  require_positive("--hidden", flags.hidden);
  require_positive("--batch", flags.batch);
  if (!(flags.dropout >= 0 && flags.dropout < 1)) {
    throw UsageError(
        "--dropout: expected a probability in [0, 1), got " +
        std::to_string(flags.dropout));
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
           << flags.heads << " heads, seq " << flags.seq << ", batch "
           << flags.batch << "; vocab " << tokenizer.vocab_size() << ", "
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
    const int64_t stages = 4;
    if (flags.image % (int64_t{1} << (stages - 1)) != 0) {
      throw UsageError(
          "--image: must be divisible by 8, got " +
          std::to_string(flags.image));
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
  } else {
    throw UsageError(
        "--model: expected gpt, mlp or resnet, got '" + flags.model + "'");
  }
  detail_ = detail.str();
  training_model_ = torch::nn::Sequential();
  for (const auto& stage : *model_) {
    training_model_->push_back(stage);  // shares the module
  }
  training_model_->push_back(LossHead(flags.model));
}

Batch Workload::next_batch() {
  Batch batch;
  if (flags_.model == "gpt") {
    const int64_t windows = data_.size(0) - flags_.seq - 1;
    torch::Tensor starts =
        torch::randint(windows + 1, {flags_.batch}, generator_, torch::kLong);
    torch::Tensor offsets = torch::arange(flags_.seq + 1, torch::kLong);
    torch::Tensor windows_tokens =
        data_.index({starts.unsqueeze(1) + offsets.unsqueeze(0)});
    batch.inputs = windows_tokens.slice(1, 0, flags_.seq).contiguous();
    batch.targets = windows_tokens.slice(1, 1, flags_.seq + 1).contiguous();
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
  for (const auto& parameter : model_->parameters()) {
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
  text << " parameters, " << model_->size() << " stages + loss";
  return text.str();
}

}  // namespace remat::cli
