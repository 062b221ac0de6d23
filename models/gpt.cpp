// gpt.cpp — GPT-style transformer parts and factory (see gpt.h).
#include <models/gpt.h>

#include <cmath>
#include <limits>

#include "remat/checkpoint.h"
#include "remat/policy.h"

namespace remat::models {
namespace {

/// `layer` applied through the one operator aten::linear. The C++ module's
/// own forward (LibTorch 1.13) computes matmul and then adds the bias in
/// place into the product, so a selective-checkpointing policy could keep
/// neither; as one operator call the projection can be kept whole.
torch::Tensor project(const torch::nn::Linear& layer, const torch::Tensor& x) {
  return torch::linear(x, layer->weight, layer->bias);
}

void check_gpt_options(const char* where, const GptOptions& options) {
  TORCH_CHECK(
      options.vocab() > 0 && options.seq_len() > 0 && options.layers() > 0 &&
          options.hidden() > 0 && options.heads() > 0,
      where,
      ": expected positive vocab, seq_len, layers, hidden and heads, got ",
      options.vocab(),
      ", ",
      options.seq_len(),
      ", ",
      options.layers(),
      ", ",
      options.hidden(),
      ", ",
      options.heads());
  TORCH_CHECK(
      options.hidden() % options.heads() == 0,
      where,
      ": expected hidden divisible by heads, got hidden ",
      options.hidden(),
      " and heads ",
      options.heads());
  TORCH_CHECK(
      options.dropout() >= 0.0 && options.dropout() < 1.0,
      where,
      ": expected dropout in [0, 1), got ",
      options.dropout());
}

torch::nn::LayerNorm layer_norm(int64_t width) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({width}));
}

}  // namespace

// ---- TokenPositionEmbedding
// --------------------------------------------------

TokenPositionEmbeddingImpl::TokenPositionEmbeddingImpl(
    const GptOptions& options_)
    : options(options_) {
  reset();
}

void TokenPositionEmbeddingImpl::reset() {
  check_gpt_options("remat::models::TokenPositionEmbedding", options);
  token = register_module(
      "token", torch::nn::Embedding(options.vocab(), options.hidden()));
  position = register_module(
      "position", torch::nn::Embedding(options.seq_len(), options.hidden()));
  dropout = register_module("dropout", torch::nn::Dropout(options.dropout()));
}

void TokenPositionEmbeddingImpl::pretty_print(std::ostream& stream) const {
  stream << "remat::models::TokenPositionEmbedding(vocab=" << options.vocab()
         << ", seq_len=" << options.seq_len() << ", hidden=" << options.hidden()
         << ")";
}

torch::Tensor TokenPositionEmbeddingImpl::forward(const torch::Tensor& tokens) {
  TORCH_CHECK(
      tokens.dim() == 2 && tokens.scalar_type() == torch::kLong,
      "remat::models::TokenPositionEmbedding: expected int64 token ids "
      "[batch, seq], got ",
      tokens.scalar_type(),
      " ",
      tokens.sizes());
  const int64_t seq = tokens.size(1);
  TORCH_CHECK(
      seq <= options.seq_len(),
      "remat::models::TokenPositionEmbedding: expected seq <= seq_len ",
      options.seq_len(),
      ", got ",
      seq);
  auto positions = torch::arange(seq, tokens.options());
  return dropout->forward(
      token->forward(tokens) + position->forward(positions));
}

// ---- AttentionCore
// -------------------------------------------------------------

AttentionCoreImpl::AttentionCoreImpl(const GptOptions& options_)
    : options(options_) {
  reset();
}

void AttentionCoreImpl::reset() {
  check_gpt_options("remat::models::AttentionCore", options);
  dropout = register_module("dropout", torch::nn::Dropout(options.dropout()));
  causal_mask =
      register_buffer("causal_mask", models::causal_mask(options.seq_len()));
}

void AttentionCoreImpl::pretty_print(std::ostream& stream) const {
  stream << "remat::models::AttentionCore(heads=" << options.heads()
         << ", dropout=" << options.dropout() << ")";
}

torch::Tensor AttentionCoreImpl::mask_for(int64_t seq) const {
  TORCH_CHECK(
      seq >= 0 && seq <= options.seq_len(),
      "remat::models::AttentionCore: expected seq in [0, seq_len ",
      options.seq_len(),
      "], got ",
      seq);
  return causal_mask.narrow(0, 0, seq).narrow(1, 0, seq);
}

torch::Tensor AttentionCoreImpl::forward(const torch::Tensor& qkv) {
  return forward_masked(qkv, mask_for(qkv.dim() == 3 ? qkv.size(1) : 0));
}

torch::Tensor AttentionCoreImpl::forward_masked(
    const torch::Tensor& qkv, const torch::Tensor& mask) {
  const int64_t hidden = options.hidden();
  TORCH_CHECK(
      qkv.dim() == 3 && qkv.size(2) == 3 * hidden &&
          qkv.size(1) <= options.seq_len(),
      "remat::models::AttentionCore: expected qkv [batch, seq <= ",
      options.seq_len(),
      ", ",
      3 * hidden,
      "], got ",
      qkv.sizes());
  const int64_t batch = qkv.size(0);
  const int64_t seq = qkv.size(1);
  const int64_t heads = options.heads();
  const int64_t head_dim = hidden / heads;
  // [3, batch, heads, seq, head_dim]
  auto parts =
      qkv.view({batch, seq, 3, heads, head_dim}).permute({2, 0, 3, 1, 4});
  auto query = parts[0];
  auto key = parts[1];
  auto value = parts[2];
  auto scores = torch::matmul(query, key.transpose(-2, -1)) *
                (1.0 / std::sqrt(static_cast<double>(head_dim)));
  TORCH_CHECK(
      mask.scalar_type() == torch::kBool && mask.dim() == 2 &&
          mask.size(0) == seq && mask.size(1) == seq,
      "remat::models::AttentionCore: expected a bool mask [",
      seq,
      ", ",
      seq,
      "], got ",
      mask.scalar_type(),
      " ",
      mask.sizes());
  scores = scores.masked_fill(mask, -std::numeric_limits<double>::infinity());
  auto probabilities = dropout->forward(torch::softmax(scores, -1));
  auto context = torch::matmul(probabilities, value);  // [batch, heads, seq, d]
  return context.transpose(1, 2).reshape({batch, seq, hidden});
}

// ---- CausalSelfAttention
// ---------------------------------------------------------

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GptOptions& options_)
    : options(options_) {
  reset();
}

void CausalSelfAttentionImpl::reset() {
  check_gpt_options("remat::models::CausalSelfAttention", options);
  qkv = register_module(
      "qkv", torch::nn::Linear(options.hidden(), 3 * options.hidden()));
  core = register_module("core", AttentionCore(options));
  proj = register_module(
      "proj", torch::nn::Linear(options.hidden(), options.hidden()));
  dropout = register_module("dropout", torch::nn::Dropout(options.dropout()));
}

void CausalSelfAttentionImpl::pretty_print(std::ostream& stream) const {
  stream << "remat::models::CausalSelfAttention(hidden=" << options.hidden()
         << ", heads=" << options.heads() << ")";
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& input) {
  return forward_masked(
      input, core->mask_for(input.dim() == 3 ? input.size(1) : 0));
}

torch::Tensor CausalSelfAttentionImpl::forward_masked(
    const torch::Tensor& input, const torch::Tensor& mask) {
  const torch::Tensor packed = project(qkv, input);
  auto run_core = [this, mask](const torch::Tensor& qkv_input) {
    return core->forward_masked(qkv_input, mask);
  };
  const torch::Tensor context =
      checkpoint_core ? remat::checkpoint(run_core, packed) : run_core(packed);
  return dropout->forward(project(proj, context));
}

// ---- TransformerBlock
// ----------------------------------------------------------

TransformerBlockImpl::TransformerBlockImpl(const GptOptions& options_)
    : options(options_) {
  reset();
}

void TransformerBlockImpl::reset() {
  check_gpt_options("remat::models::TransformerBlock", options);
  const int64_t hidden = options.hidden();
  ln1 = register_module("ln1", layer_norm(hidden));
  attention = register_module("attention", CausalSelfAttention(options));
  ln2 = register_module("ln2", layer_norm(hidden));
  fc1 = register_module("fc1", torch::nn::Linear(hidden, 4 * hidden));
  gelu = register_module("gelu", torch::nn::GELU());
  fc2 = register_module("fc2", torch::nn::Linear(4 * hidden, hidden));
  dropout = register_module("dropout", torch::nn::Dropout(options.dropout()));
}

void TransformerBlockImpl::pretty_print(std::ostream& stream) const {
  stream << "remat::models::TransformerBlock(hidden=" << options.hidden()
         << ", heads=" << options.heads() << ", dropout=" << options.dropout()
         << ")";
}

torch::Tensor TransformerBlockImpl::forward(const torch::Tensor& input) {
  return forward_masked(
      input, attention->core->mask_for(input.dim() == 3 ? input.size(1) : 0));
}

torch::Tensor TransformerBlockImpl::forward_masked(
    const torch::Tensor& input, const torch::Tensor& mask) {
  attention->checkpoint_core = recompute == GptRecompute::kAttention;
  auto body = [this, mask](const torch::Tensor& block_input) {
    auto x = block_input +
             attention->forward_masked(ln1->forward(block_input), mask);
    auto mlp = project(fc2, gelu->forward(project(fc1, ln2->forward(x))));
    return x + dropout->forward(mlp);
  };
  switch (recompute) {
    case GptRecompute::kFull:
      return remat::checkpoint(body, input);
    case GptRecompute::kSelective:
      return remat::checkpoint(
          body, input, remat::CheckpointOptions().policy(policy));
    case GptRecompute::kNone:
    case GptRecompute::kAttention:
      break;
  }
  return body(input);
}

// ---- LmHead
// --------------------------------------------------------------------

LmHeadImpl::LmHeadImpl(const GptOptions& options_) : options(options_) {
  reset();
}

void LmHeadImpl::reset() {
  check_gpt_options("remat::models::LmHead", options);
  norm = register_module("norm", layer_norm(options.hidden()));
  linear = register_module(
      "linear",
      torch::nn::Linear(
          torch::nn::LinearOptions(options.hidden(), options.vocab())
              .bias(false)));
}

void LmHeadImpl::pretty_print(std::ostream& stream) const {
  stream << "remat::models::LmHead(hidden=" << options.hidden()
         << ", vocab=" << options.vocab() << ")";
}

torch::Tensor LmHeadImpl::forward(const torch::Tensor& input) {
  return project(linear, norm->forward(input));
}

// ---- factory
// -------------------------------------------------------------------

torch::nn::Sequential gpt(const GptOptions& options) {
  check_gpt_options("remat::models::gpt", options);
  torch::nn::Sequential model;
  model->push_back(TokenPositionEmbedding(options));
  for (int64_t layer = 0; layer < options.layers(); ++layer) {
    model->push_back(TransformerBlock(options));
  }
  model->push_back(LmHead(options));
  return model;
}

torch::Tensor causal_mask(int64_t seq) {
  TORCH_CHECK(
      seq >= 0, "remat::models::causal_mask: expected seq >= 0, got ", seq);
  return torch::ones({seq, seq}, torch::kBool).triu(1);
}

std::vector<remat::Stage> gpt_stages(
    const torch::nn::Sequential& model, const torch::Tensor& mask) {
  std::vector<remat::Stage> stages;
  for (size_t i = 0; i < model->size(); ++i) {
    std::shared_ptr<torch::nn::Module> child = model->ptr(i);
    if (auto block = std::dynamic_pointer_cast<TransformerBlockImpl>(child)) {
      stages.push_back(
          {[block, mask](const torch::Tensor& x) {
             return block->forward_masked(x, mask);
           },
           block});
    } else if (
        auto embedding =
            std::dynamic_pointer_cast<TokenPositionEmbeddingImpl>(child)) {
      stages.push_back(
          {[embedding](const torch::Tensor& t) {
             return embedding->forward(t);
           },
           embedding});
    } else if (auto head = std::dynamic_pointer_cast<LmHeadImpl>(child)) {
      stages.push_back(
          {[head](const torch::Tensor& x) { return head->forward(x); }, head});
    } else {
      TORCH_CHECK(
          false,
          "remat::models::gpt_stages: expected the children of a gpt(), child ",
          i,
          " is ",
          child->name());
    }
  }
  return stages;
}

GptRecompute parse_gpt_recompute(const std::string& text) {
  if (text == "none") {
    return GptRecompute::kNone;
  }
  if (text == "full") {
    return GptRecompute::kFull;
  }
  if (text == "attention") {
    return GptRecompute::kAttention;
  }
  TORCH_CHECK(
      text == "selective",
      "remat::models::parse_gpt_recompute: expected none, full, attention or "
      "selective, got '",
      text,
      "'");
  return GptRecompute::kSelective;
}

void set_recompute(
    const torch::nn::Sequential& model,
    GptRecompute recompute,
    remat::Policy policy) {
  if (!policy) {
    policy = remat::policies::save_compute_intensive();
  }
  for (const auto& child : model->children()) {
    if (auto block = std::dynamic_pointer_cast<TransformerBlockImpl>(child)) {
      block->recompute = recompute;
      block->policy = policy;
    }
  }
}

torch::Tensor gpt_loss(
    const torch::Tensor& logits, const torch::Tensor& targets) {
  TORCH_CHECK(
      logits.dim() == 3 && targets.dim() == 2 &&
          logits.size(0) == targets.size(0) &&
          logits.size(1) == targets.size(1),
      "remat::models::gpt_loss: expected logits [B, S, vocab] and targets "
      "[B, S], got ",
      logits.sizes(),
      " and ",
      targets.sizes());
  return torch::nn::functional::cross_entropy(
      logits.reshape({-1, logits.size(2)}), targets.reshape({-1}));
}

}  // namespace remat::models
