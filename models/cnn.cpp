// cnn.cpp — convolutional demo stages and factories (see cnn.h).
#include <models/cnn.h>

namespace remat::models {
namespace {

torch::nn::Conv2d conv3x3(
    int64_t in_channels, int64_t out_channels, int64_t stride) {
  return torch::nn::Conv2d(
      torch::nn::Conv2dOptions(in_channels, out_channels, 3)
          .stride(stride)
          .padding(1)
          .bias(false));
}

void check_channels(
    const char* where,
    int64_t in_channels,
    int64_t out_channels,
    int64_t stride) {
  TORCH_CHECK(
      in_channels > 0 && out_channels > 0 && stride > 0,
      where,
      ": expected positive channels and stride, got ",
      in_channels,
      " -> ",
      out_channels,
      ", stride ",
      stride);
}

}  // namespace

ConvBnReluImpl::ConvBnReluImpl(const ConvBnReluOptions& options_)
    : options(options_) {
  reset();
}

void ConvBnReluImpl::reset() {
  check_channels(
      "remat::models::ConvBnRelu",
      options.in_channels(),
      options.out_channels(),
      options.stride());
  conv = register_module(
      "conv",
      conv3x3(options.in_channels(), options.out_channels(), options.stride()));
  bn = register_module("bn", torch::nn::BatchNorm2d(options.out_channels()));
}

void ConvBnReluImpl::pretty_print(std::ostream& stream) const {
  stream << "remat::models::ConvBnRelu(" << options.in_channels() << " -> "
         << options.out_channels() << ", stride=" << options.stride() << ")";
}

torch::Tensor ConvBnReluImpl::forward(const torch::Tensor& input) {
  return torch::relu(bn->forward(conv->forward(input)));
}

ResidualConvBlockImpl::ResidualConvBlockImpl(
    const ResidualConvBlockOptions& options_)
    : options(options_) {
  reset();
}

void ResidualConvBlockImpl::reset() {
  check_channels(
      "remat::models::ResidualConvBlock",
      options.in_channels(),
      options.out_channels(),
      options.stride());
  conv1 = register_module(
      "conv1",
      conv3x3(options.in_channels(), options.out_channels(), options.stride()));
  bn1 = register_module("bn1", torch::nn::BatchNorm2d(options.out_channels()));
  conv2 = register_module(
      "conv2", conv3x3(options.out_channels(), options.out_channels(), 1));
  bn2 = register_module("bn2", torch::nn::BatchNorm2d(options.out_channels()));
  if (options.stride() != 1 ||
      options.in_channels() != options.out_channels()) {
    shortcut_conv = register_module(
        "shortcut_conv",
        torch::nn::Conv2d(torch::nn::Conv2dOptions(
                              options.in_channels(), options.out_channels(), 1)
                              .stride(options.stride())
                              .bias(false)));
    shortcut_bn = register_module(
        "shortcut_bn", torch::nn::BatchNorm2d(options.out_channels()));
  } else {
    shortcut_conv = nullptr;
    shortcut_bn = nullptr;
  }
}

void ResidualConvBlockImpl::pretty_print(std::ostream& stream) const {
  stream << "remat::models::ResidualConvBlock(" << options.in_channels()
         << " -> " << options.out_channels() << ", stride=" << options.stride()
         << ")";
}

torch::Tensor ResidualConvBlockImpl::forward(const torch::Tensor& input) {
  auto main = torch::relu(bn1->forward(conv1->forward(input)));
  main = bn2->forward(conv2->forward(main));
  auto shortcut = shortcut_conv.is_empty()
                      ? input
                      : shortcut_bn->forward(shortcut_conv->forward(input));
  return torch::relu(main + shortcut);
}

PoolLinearHeadImpl::PoolLinearHeadImpl(int64_t channels_, int64_t classes_)
    : channels(channels_), classes(classes_) {
  reset();
}

void PoolLinearHeadImpl::reset() {
  TORCH_CHECK(
      channels > 0 && classes > 0,
      "remat::models::PoolLinearHead: expected positive channels and classes, "
      "got ",
      channels,
      " and ",
      classes);
  linear = register_module("linear", torch::nn::Linear(channels, classes));
}

void PoolLinearHeadImpl::pretty_print(std::ostream& stream) const {
  stream << "remat::models::PoolLinearHead(" << channels << " -> " << classes
         << ")";
}

torch::Tensor PoolLinearHeadImpl::forward(const torch::Tensor& input) {
  return linear->forward(input.mean({2, 3}));
}

torch::nn::Sequential small_cnn(const SmallCnnOptions& options) {
  const auto& channels = options.channels();
  TORCH_CHECK(
      !channels.empty(),
      "remat::models::small_cnn: expected at least one stage, got none");
  const int64_t reduction = int64_t{1} << channels.size();
  TORCH_CHECK(
      options.image_size() > 0 && options.image_size() % reduction == 0,
      "remat::models::small_cnn: expected an image size divisible by ",
      reduction,
      ", got ",
      options.image_size());
  torch::nn::Sequential model;
  int64_t in_channels = options.in_channels();
  for (int64_t out_channels : channels) {
    model->push_back(ConvBnRelu(ConvBnReluOptions(in_channels, out_channels)));
    model->push_back(torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(2)));
    in_channels = out_channels;
  }
  const int64_t side = options.image_size() / reduction;
  model->push_back(torch::nn::Flatten());
  model->push_back(
      torch::nn::Linear(in_channels * side * side, options.classes()));
  return model;
}

torch::nn::Sequential resnet_chain(const ResNetChainOptions& options) {
  const auto& stage_channels = options.stage_channels();
  TORCH_CHECK(
      !stage_channels.empty(),
      "remat::models::resnet_chain: expected at least one stage, got none");
  TORCH_CHECK(
      options.blocks_per_stage() >= 1,
      "remat::models::resnet_chain: expected blocks_per_stage >= 1, got ",
      options.blocks_per_stage());
  torch::nn::Sequential model;
  model->push_back(
      ConvBnRelu(ConvBnReluOptions(options.in_channels(), stage_channels[0])));
  int64_t in_channels = stage_channels[0];
  for (size_t stage = 0; stage < stage_channels.size(); ++stage) {
    for (int64_t block = 0; block < options.blocks_per_stage(); ++block) {
      const int64_t stride = (stage > 0 && block == 0) ? 2 : 1;
      model->push_back(ResidualConvBlock(
          ResidualConvBlockOptions(in_channels, stage_channels[stage])
              .stride(stride)));
      in_channels = stage_channels[stage];
    }
  }
  model->push_back(PoolLinearHead(in_channels, options.classes()));
  return model;
}

}  // namespace remat::models
