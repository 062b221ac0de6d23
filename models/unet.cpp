// unet.cpp — U-Net blocks, the U-Net and its graph stages (see unet.h).
//
// NOTE: [One computation, two drivers]
// UNetImpl::forward and the stages of UNetImpl::stages() call the same child
// modules with the same tensors in the same order (including the input
// check and every Dropout draw), so that running the stages plainly equals
// forward bitwise. A change to one must be made to the other; the
// StagesEqualForward tests of tests/unet_test.cpp hold them together.
#include <models/unet.h>

#include <functional>
#include <utility>

namespace remat::models {
namespace {

void check_dims(const char* where, int64_t dims) {
  TORCH_CHECK(
      dims == 2 || dims == 3, where, ": expected dims 2 or 3, got ", dims);
}

void check_dropout(const char* where, double dropout) {
  TORCH_CHECK(
      dropout >= 0.0 && dropout < 1.0,
      where,
      ": expected dropout in [0, 1), got ",
      dropout);
}

void check_block_options(const char* where, const UNetBlockOptions& options) {
  check_dims(where, options.dims());
  TORCH_CHECK(
      options.in_channels() > 0 && options.out_channels() > 0,
      where,
      ": expected positive channels, got ",
      options.in_channels(),
      " -> ",
      options.out_channels());
  if (options.norm() == UNetNorm::kGroup) {
    TORCH_CHECK(
        options.norm_groups() > 0 &&
            options.out_channels() % options.norm_groups() == 0,
        where,
        ": expected norm_groups dividing out_channels ",
        options.out_channels(),
        ", got ",
        options.norm_groups());
  }
  check_dropout(where, options.dropout());
}

void check_unet_options(const UNetOptions& options) {
  const char* where = "remat::models::UNet";
  check_dims(where, options.dims());
  TORCH_CHECK(
      options.levels() >= 1,
      where,
      ": expected levels >= 1, got ",
      options.levels());
  // 2^levels channels and sizes must stay far inside int64_t.
  TORCH_CHECK(
      options.levels() <= 24,
      where,
      ": expected levels <= 24, got ",
      options.levels());
  TORCH_CHECK(
      options.in_channels() >= 1,
      where,
      ": expected in_channels >= 1, got ",
      options.in_channels());
  TORCH_CHECK(
      options.classes() >= 1,
      where,
      ": expected classes >= 1, got ",
      options.classes());
  TORCH_CHECK(
      options.base_width() >= 1,
      where,
      ": expected base_width >= 1, got ",
      options.base_width());
  TORCH_CHECK(
      options.norm_groups() >= 1,
      where,
      ": expected norm_groups >= 1, got ",
      options.norm_groups());
  if (options.norm() == UNetNorm::kGroup) {
    TORCH_CHECK(
        options.base_width() % options.norm_groups() == 0,
        where,
        ": expected norm_groups dividing base_width ",
        options.base_width(),
        ", got ",
        options.norm_groups());
  }
  check_dropout(where, options.dropout());
}

/// forward()'s input contract: [N, in_channels, *spatial], each spatial
/// size a positive multiple of 2^levels.
void check_unet_input(
    const UNetOptions& options, const torch::Tensor& input, bool training) {
  const char* where = "remat::models::UNet";
  TORCH_CHECK(input.defined(), where, ": expected an input, got none");
  TORCH_CHECK(
      input.dim() == options.dims() + 2 &&
          input.size(1) == options.in_channels(),
      where,
      ": expected input [N, ",
      options.in_channels(),
      options.dims() == 2 ? ", H, W]" : ", D, H, W]",
      ", got ",
      input.sizes());
  const int64_t multiple = int64_t{1} << options.levels();
  for (int64_t dim = 2; dim < input.dim(); ++dim) {
    TORCH_CHECK(
        input.size(dim) > 0 && input.size(dim) % multiple == 0,
        where,
        ": expected every spatial size divisible by 2^levels = ",
        multiple,
        " (levels ",
        options.levels(),
        "), got size ",
        input.size(dim),
        " in dimension ",
        dim,
        " of input ",
        input.sizes());
  }
  // In training, BatchNorm needs two values per channel or more; the fewest
  // are at the bottleneck, whose spatial sizes are the input's / 2^levels.
  if (training && options.norm() == UNetNorm::kBatch) {
    int64_t values = input.size(0);
    for (int64_t dim = 2; dim < input.dim(); ++dim) {
      values *= input.size(dim) / multiple;
    }
    TORCH_CHECK(
        values > 1,
        where,
        ": BatchNorm in training needs more than one value per channel, and "
        "the bottleneck of input ",
        input.sizes(),
        " (levels ",
        options.levels(),
        ") has ",
        values,
        ": use a batch of 2 or more, a larger input, or GroupNorm");
  }
}

torch::nn::AnyModule conv(
    int64_t dims,
    int64_t in_channels,
    int64_t out_channels,
    int64_t kernel,
    bool bias) {
  if (dims == 2) {
    return torch::nn::AnyModule(torch::nn::Conv2d(
        torch::nn::Conv2dOptions(in_channels, out_channels, kernel)
            .padding(kernel / 2)
            .bias(bias)));
  }
  return torch::nn::AnyModule(torch::nn::Conv3d(
      torch::nn::Conv3dOptions(in_channels, out_channels, kernel)
          .padding(kernel / 2)
          .bias(bias)));
}

}  // namespace

UNetNorm parse_unet_norm(const std::string& text) {
  if (text == "batch") {
    return UNetNorm::kBatch;
  }
  if (text == "group") {
    return UNetNorm::kGroup;
  }
  TORCH_CHECK(
      text == "none",
      "remat::models::parse_unet_norm: expected batch, group or none, got '",
      text,
      "'");
  return UNetNorm::kNone;
}

std::string to_string(UNetNorm norm) {
  switch (norm) {
    case UNetNorm::kBatch:
      return "batch";
    case UNetNorm::kGroup:
      return "group";
    case UNetNorm::kNone:
      return "none";
  }
  TORCH_INTERNAL_ASSERT(false, "unknown UNetNorm ", static_cast<int>(norm));
}

// ---- UNetBlock
// -----------------------------------------------------------------

UNetBlockImpl::UNetBlockImpl(const UNetBlockOptions& options_)
    : options(options_) {
  reset();
}

void UNetBlockImpl::reset() {
  check_block_options("remat::models::UNetBlock", options);
  const int64_t dims = options.dims();
  const int64_t width = options.out_channels();
  const bool has_norm = options.norm() != UNetNorm::kNone;
  torch::nn::Sequential sequence;
  int64_t in_channels = options.in_channels();
  for (int round = 0; round < 2; ++round) {
    sequence->push_back(conv(dims, in_channels, width, 3, !has_norm));
    switch (options.norm()) {
      case UNetNorm::kBatch:
        if (dims == 2) {
          sequence->push_back(torch::nn::BatchNorm2d(width));
        } else {
          sequence->push_back(torch::nn::BatchNorm3d(width));
        }
        break;
      case UNetNorm::kGroup:
        sequence->push_back(torch::nn::GroupNorm(
            torch::nn::GroupNormOptions(options.norm_groups(), width)));
        break;
      case UNetNorm::kNone:
        break;
    }
    sequence->push_back(torch::nn::ReLU());
    if (options.dropout() > 0.0) {
      sequence->push_back(torch::nn::Dropout(options.dropout()));
    }
    in_channels = width;
  }
  layers = register_module("layers", sequence);
}

void UNetBlockImpl::pretty_print(std::ostream& stream) const {
  stream << "remat::models::UNetBlock(" << options.dims() << "d, "
         << options.in_channels() << " -> " << options.out_channels()
         << ", norm=" << to_string(options.norm())
         << ", dropout=" << options.dropout() << ")";
}

torch::Tensor UNetBlockImpl::forward(const torch::Tensor& input) {
  return layers->forward(input);
}

torch::nn::Sequential UNetBlockImpl::round(int64_t index) const {
  TORCH_CHECK(
      index == 0 || index == 1,
      "remat::models::UNetBlock::round: expected round 0 or 1, got ",
      index);
  // reset() builds two rounds of the same layers.
  const auto per_round = static_cast<int64_t>(layers->size()) / 2;
  torch::nn::Sequential part;
  auto layer = layers->begin() + index * per_round;
  for (int64_t k = 0; k < per_round; ++k, ++layer) {
    part->push_back(*layer);
  }
  return part;
}

// ---- UNetDecoderBlock
// ----------------------------------------------------------

UNetDecoderBlockImpl::UNetDecoderBlockImpl(const UNetBlockOptions& options_)
    : options(options_) {
  reset();
}

void UNetDecoderBlockImpl::reset() {
  check_block_options("remat::models::UNetDecoderBlock", options);
  const int64_t in_channels = options.in_channels();
  const int64_t width = options.out_channels();
  if (options.dims() == 2) {
    up = torch::nn::AnyModule(torch::nn::ConvTranspose2d(
        torch::nn::ConvTranspose2dOptions(in_channels, width, 2).stride(2)));
  } else {
    up = torch::nn::AnyModule(torch::nn::ConvTranspose3d(
        torch::nn::ConvTranspose3dOptions(in_channels, width, 2).stride(2)));
  }
  register_module("up", up.ptr());
  UNetBlockOptions block_options = options;
  block_options.in_channels(2 * width);
  block = register_module("block", UNetBlock(block_options));
}

void UNetDecoderBlockImpl::pretty_print(std::ostream& stream) const {
  stream << "remat::models::UNetDecoderBlock(" << options.dims() << "d, "
         << options.in_channels() << " -> " << options.out_channels() << ")";
}

torch::Tensor UNetDecoderBlockImpl::forward(
    const torch::Tensor& below, const torch::Tensor& skip) {
  return block->forward(join(below, skip));
}

torch::Tensor UNetDecoderBlockImpl::join(
    const torch::Tensor& below, const torch::Tensor& skip) {
  auto upsampled = up.forward<torch::Tensor>(below);
  TORCH_CHECK(
      skip.dim() == upsampled.dim() && skip.sizes() == upsampled.sizes(),
      "remat::models::UNetDecoderBlock: expected a skip of the upsampled "
      "shape ",
      upsampled.sizes(),
      ", got ",
      skip.sizes());
  return torch::cat({skip, upsampled}, 1);
}

// ---- UNet
// ----------------------------------------------------------------------

UNetImpl::UNetImpl(const UNetOptions& options_) : options(options_) {
  reset();
}

void UNetImpl::reset() {
  check_unet_options(options);
  const int64_t dims = options.dims();
  const int64_t levels = options.levels();
  auto block_options = [&](int64_t in_channels, int64_t out_channels) {
    return UNetBlockOptions(dims, in_channels, out_channels)
        .norm(options.norm())
        .norm_groups(options.norm_groups())
        .dropout(options.dropout());
  };
  auto width_at = [&](int64_t level) { return options.base_width() << level; };
  encoder.clear();
  pools.clear();
  decoder.assign(static_cast<size_t>(levels), UNetDecoderBlock(nullptr));
  int64_t in_channels = options.in_channels();
  for (int64_t level = 0; level < levels; ++level) {
    const std::string suffix = std::to_string(level);
    encoder.push_back(register_module(
        "encoder" + suffix,
        UNetBlock(block_options(in_channels, width_at(level)))));
    if (dims == 2) {
      pools.emplace_back(torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(2)));
    } else {
      pools.emplace_back(torch::nn::MaxPool3d(torch::nn::MaxPool3dOptions(2)));
    }
    register_module("pool" + suffix, pools.back().ptr());
    in_channels = width_at(level);
  }
  bottleneck = register_module(
      "bottleneck", UNetBlock(block_options(in_channels, width_at(levels))));
  for (int64_t level = levels - 1; level >= 0; --level) {
    decoder[static_cast<size_t>(level)] = register_module(
        "decoder" + std::to_string(level),
        UNetDecoderBlock(block_options(width_at(level + 1), width_at(level))));
  }
  head = conv(dims, options.base_width(), options.classes(), 1, true);
  register_module("head", head.ptr());
}

void UNetImpl::pretty_print(std::ostream& stream) const {
  stream << "remat::models::UNet(dims=" << options.dims()
         << ", in_channels=" << options.in_channels()
         << ", classes=" << options.classes() << ", levels=" << options.levels()
         << ", base_width=" << options.base_width()
         << ", norm=" << to_string(options.norm())
         << ", dropout=" << options.dropout() << ")";
}

// See NOTE: [One computation, two drivers].
torch::Tensor UNetImpl::forward(const torch::Tensor& input) {
  check_unet_input(options, input, is_training());
  std::vector<torch::Tensor> skips;
  torch::Tensor activation = input;
  for (size_t level = 0; level < encoder.size(); ++level) {
    activation = encoder[level]->forward(activation);
    skips.push_back(activation);
    activation = pools[level].forward<torch::Tensor>(activation);
  }
  activation = bottleneck->forward(activation);
  for (size_t level = decoder.size(); level-- > 0;) {
    activation = decoder[level]->forward(activation, skips[level]);
  }
  return head.forward<torch::Tensor>(activation);
}

// See NOTE: [One computation, two drivers].
namespace {

using StageInputs = std::vector<torch::Tensor>;
using OneInput = std::function<torch::Tensor(const torch::Tensor&)>;

/// How one module runs on one tensor.
OneInput run_of(torch::nn::AnyModule module) {
  return [module](const torch::Tensor& x) mutable {
    return module.forward<torch::Tensor>(x);
  };
}
OneInput run_of(torch::nn::Sequential module) {
  return
      [module](const torch::Tensor& x) mutable { return module->forward(x); };
}

/// The stage of `module` (run by `run`) reading `reads` (the stage before
/// it when empty; the graph input when `graph` is empty).
remat::GraphStage one_input_stage(
    const std::vector<remat::GraphStage>& graph,
    OneInput run,
    std::shared_ptr<torch::nn::Module> module) {
  return {
      [run = std::move(run)](const StageInputs& in) { return run(in.at(0)); },
      std::move(module),
      {graph.empty() ? remat::kGraphInput
                     : static_cast<int>(graph.size()) - 1}};
}

/// Appends `block` to `graph`, reading the stage before it (or the graph
/// input): one stage, or its two rounds (UNetStageSplit::kConvolution).
/// `check` runs first on the block's input.
void push_block(
    std::vector<remat::GraphStage>& graph,
    const UNetBlock& block,
    UNetStageSplit split,
    const OneInput& check = {}) {
  std::vector<std::pair<OneInput, std::shared_ptr<torch::nn::Module>>> parts;
  if (split == UNetStageSplit::kBlock) {
    parts.emplace_back(run_of(torch::nn::AnyModule(block)), block.ptr());
  } else {
    for (int64_t round = 0; round < 2; ++round) {
      torch::nn::Sequential part = block->round(round);
      parts.emplace_back(run_of(part), part.ptr());
    }
  }
  if (check) {
    parts.front().first = [check,
                           run = parts.front().first](const torch::Tensor& x) {
      check(x);
      return run(x);
    };
  }
  for (auto& [run, module] : parts) {
    graph.push_back(one_input_stage(graph, std::move(run), std::move(module)));
  }
}

}  // namespace

std::vector<remat::GraphStage> UNetImpl::stages(UNetStageSplit split) const {
  std::vector<remat::GraphStage> graph;
  std::vector<int> encoder_stage;  // the last stage of encoder l
  for (size_t level = 0; level < encoder.size(); ++level) {
    // Encoder 0 reads the graph input, checked as forward() checks it.
    OneInput check;
    if (level == 0) {
      check = [checked = options,
               block = encoder[level]](const torch::Tensor& x) {
        check_unet_input(checked, x, block->is_training());
        return x;
      };
    }
    push_block(graph, encoder[level], split, check);
    encoder_stage.push_back(static_cast<int>(graph.size()) - 1);
    graph.push_back(
        one_input_stage(graph, run_of(pools[level]), pools[level].ptr()));
  }
  push_block(graph, bottleneck, split);
  for (size_t level = decoder.size(); level-- > 0;) {
    std::shared_ptr<UNetDecoderBlockImpl> block = decoder[level].ptr();
    const std::vector<int> reads{
        static_cast<int>(graph.size()) - 1, encoder_stage[level]};
    if (split == UNetStageSplit::kBlock) {
      graph.push_back(
          {[block](const StageInputs& in) {
             return block->forward(in.at(0), in.at(1));
           },
           block,
           reads});
      continue;
    }
    graph.push_back(
        {[block](const StageInputs& in) {
           return block->join(in.at(0), in.at(1));
         },
         block->up.ptr(),
         reads});
    push_block(graph, block->block, split);
  }
  graph.push_back(one_input_stage(graph, run_of(head), head.ptr()));
  return graph;
}

}  // namespace remat::models
