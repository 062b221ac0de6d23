// mlp.cpp — MLP chain stages and factories (see mlp.h).
#include <models/mlp.h>

namespace remat::models {

LinearReluImpl::LinearReluImpl(const LinearReluOptions& options_)
    : options(options_) {
  reset();
}

void LinearReluImpl::reset() {
  TORCH_CHECK(
      options.in_features() > 0 && options.out_features() > 0,
      "remat::models::LinearRelu: expected positive widths, got ",
      options.in_features(),
      " -> ",
      options.out_features());
  TORCH_CHECK(
      options.dropout() >= 0.0 && options.dropout() < 1.0,
      "remat::models::LinearRelu: expected dropout in [0, 1), got ",
      options.dropout());
  linear = register_module(
      "linear",
      torch::nn::Linear(options.in_features(), options.out_features()));
  if (options.dropout() > 0.0) {
    dropout = register_module("dropout", torch::nn::Dropout(options.dropout()));
  } else {
    dropout = nullptr;
  }
}

void LinearReluImpl::pretty_print(std::ostream& stream) const {
  stream << "remat::models::LinearRelu(" << options.in_features() << " -> "
         << options.out_features() << ", dropout=" << options.dropout() << ")";
}

torch::Tensor LinearReluImpl::forward(const torch::Tensor& input) {
  auto output = torch::relu(linear->forward(input));
  if (!dropout.is_empty()) {
    output = dropout->forward(output);
  }
  return output;
}

torch::nn::Sequential mlp_chain(const MlpChainOptions& options) {
  const auto& widths = options.widths();
  TORCH_CHECK(
      widths.size() >= 2,
      "remat::models::mlp_chain: expected at least 2 widths, got ",
      widths.size());
  torch::nn::Sequential model;
  for (size_t stage = 0; stage + 1 < widths.size(); ++stage) {
    model->push_back(
        LinearRelu(LinearReluOptions(widths[stage], widths[stage + 1])
                       .dropout(options.dropout())));
  }
  return model;
}

torch::nn::Sequential uniform_mlp_chain(int64_t blocks, int64_t width) {
  TORCH_CHECK(
      blocks >= 1,
      "remat::models::uniform_mlp_chain: expected blocks >= 1, got ",
      blocks);
  return mlp_chain(MlpChainOptions(std::vector<int64_t>(blocks + 1, width)));
}

std::vector<int64_t> varying_mlp_widths(int64_t stages) {
  TORCH_CHECK(
      stages >= 1,
      "remat::models::varying_mlp_widths: expected stages >= 1, got ",
      stages);
  static const int64_t kCycle[] = {512, 2048, 256, 1024, 2048, 768, 256, 1536};
  constexpr int64_t kCycleLength = sizeof(kCycle) / sizeof(kCycle[0]);
  std::vector<int64_t> widths;
  for (int64_t index = 0; index <= stages; ++index) {
    widths.push_back(kCycle[index % kCycleLength]);
  }
  return widths;
}

}  // namespace remat::models
