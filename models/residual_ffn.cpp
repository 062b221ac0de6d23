// residual_ffn.cpp — residual FFN blocks and stack (see residual_ffn.h).
#include <models/residual_ffn.h>

namespace remat::models {

ResidualFfnBlockImpl::ResidualFfnBlockImpl(
    const ResidualFfnBlockOptions& options_)
    : options(options_) {
  reset();
}

void ResidualFfnBlockImpl::reset() {
  TORCH_CHECK(
      options.dim() > 0 && options.hidden() > 0,
      "remat::models::ResidualFfnBlock: expected positive dim and hidden, got ",
      options.dim(),
      " and ",
      options.hidden());
  TORCH_CHECK(
      options.dropout() >= 0.0 && options.dropout() < 1.0,
      "remat::models::ResidualFfnBlock: expected dropout in [0, 1), got ",
      options.dropout());
  norm = register_module(
      "norm",
      torch::nn::LayerNorm(torch::nn::LayerNormOptions({options.dim()})));
  fc1 = register_module(
      "fc1", torch::nn::Linear(options.dim(), options.hidden()));
  gelu = register_module("gelu", torch::nn::GELU());
  dropout = register_module("dropout", torch::nn::Dropout(options.dropout()));
  fc2 = register_module(
      "fc2", torch::nn::Linear(options.hidden(), options.dim()));
}

void ResidualFfnBlockImpl::pretty_print(std::ostream& stream) const {
  stream << "remat::models::ResidualFfnBlock(dim=" << options.dim()
         << ", hidden=" << options.hidden() << ", dropout=" << options.dropout()
         << ")";
}

torch::Tensor ResidualFfnBlockImpl::forward(const torch::Tensor& input) {
  auto hidden = gelu->forward(fc1->forward(norm->forward(input)));
  return input + fc2->forward(dropout->forward(hidden));
}

torch::nn::Sequential residual_ffn_stack(
    const ResidualFfnStackOptions& options) {
  TORCH_CHECK(
      options.blocks() >= 1,
      "remat::models::residual_ffn_stack: expected blocks >= 1, got ",
      options.blocks());
  torch::nn::Sequential model;
  for (int64_t block = 0; block < options.blocks(); ++block) {
    model->push_back(ResidualFfnBlock(
        ResidualFfnBlockOptions(options.dim(), options.hidden())
            .dropout(options.dropout())));
  }
  return model;
}

}  // namespace remat::models
