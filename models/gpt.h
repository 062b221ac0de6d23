// gpt.h — a GPT-style character-level transformer as a torch::nn::Sequential:
//   TokenPositionEmbedding -> layers x TransformerBlock -> LmHead
// Input int64 token ids [batch, seq]; output logits [batch, seq, vocab].
//
// Demo model (not the remat API); experiment E3's model is
// GptOptions().seq_len(512).layers(4).hidden(384).heads(6).dropout(0.1).
// Blocks are pre-LayerNorm with causal multi-head self-attention written out
// explicitly, so the [batch, heads, seq, seq] score and probability tensors
// exist (no fused attention), dropout on the attention probabilities and on
// both residual branches, and a GELU MLP of width 4 * hidden. The parameter-
// free attention core (scores, mask, softmax, dropout, weighted sum) is its own
// submodule, AttentionCore, reachable as block->attention->core, so that it
// can be recomputed alone (selective recompute).
//
// Every child of the Sequential takes and returns one Tensor; only the first
// takes token ids, the others float activations [batch, seq, hidden].
#pragma once

#include <torch/torch.h>

#include "remat/policy.h"
#include "remat/stage.h"

#include <cstdint>
#include <string>
#include <vector>

namespace remat::models {

/// How the blocks of a gpt() recompute in backward: the transformer recipes
/// of docs/checkpoint.md, on remat::checkpoint.
enum class GptRecompute {
  kNone,       ///< keep every activation (plain autograd)
  kFull,       ///< checkpoint each whole block
  kAttention,  ///< checkpoint only each attention core (scores, mask,
               ///< softmax, dropout, weighted sum), Megatron's selective
               ///< recompute
  kSelective,  ///< checkpoint each block under a per-op policy
               ///< (TransformerBlockImpl::policy)
};

/// Parses "none", "full", "attention" or "selective". Throws c10::Error
/// naming the text otherwise.
GptRecompute parse_gpt_recompute(const std::string& text);

/// Options of gpt() and of each of its parts.
struct GptOptions {
  /// Vocabulary size (token ids in [0, vocab)). Default: 96.
  TORCH_ARG(int64_t, vocab) = 96;
  /// Maximum sequence length (positions). Default: 512.
  TORCH_ARG(int64_t, seq_len) = 512;
  /// Number of transformer blocks. Default: 4.
  TORCH_ARG(int64_t, layers) = 4;
  /// Model width; must be divisible by heads. Default: 384.
  TORCH_ARG(int64_t, hidden) = 384;
  /// Attention heads. Default: 6.
  TORCH_ARG(int64_t, heads) = 6;
  /// Dropout probability (embeddings, attention probabilities, residual
  /// branches). Default: 0.1.
  TORCH_ARG(double, dropout) = 0.1;
};

/// Token embedding + learned position embedding, then dropout.
/// Input int64 [batch, seq] with seq <= seq_len; output [batch, seq, hidden].
class TokenPositionEmbeddingImpl
    : public torch::nn::Cloneable<TokenPositionEmbeddingImpl> {
 public:
  explicit TokenPositionEmbeddingImpl(const GptOptions& options_);
  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  torch::Tensor forward(const torch::Tensor& tokens);

  GptOptions options;
  torch::nn::Embedding token{nullptr};
  torch::nn::Embedding position{nullptr};
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(TokenPositionEmbedding);

/// The attention core: softmax(mask(q k^T / sqrt(d))) with dropout, times v.
/// Input the packed projections qkv [batch, seq, 3 * hidden] (q, k, v in that
/// order, heads contiguous within each); output [batch, seq, hidden]. No
/// parameters; a boolean causal-mask buffer [seq_len, seq_len].
class AttentionCoreImpl : public torch::nn::Cloneable<AttentionCoreImpl> {
 public:
  explicit AttentionCoreImpl(const GptOptions& options_);
  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  /// With the causal mask of qkv's sequence length.
  torch::Tensor forward(const torch::Tensor& qkv);
  /// With `mask`, bool [seq, seq], true where a query may not attend a key.
  /// Throws c10::Error naming the mask's type and shape otherwise.
  torch::Tensor forward_masked(
      const torch::Tensor& qkv, const torch::Tensor& mask);
  /// The causal mask of `seq` positions (a view of causal_mask). Throws
  /// c10::Error unless 0 <= seq <= seq_len.
  torch::Tensor mask_for(int64_t seq) const;

  GptOptions options;
  torch::nn::Dropout dropout{nullptr};
  torch::Tensor causal_mask;  // true above the diagonal (future positions)
};
TORCH_MODULE(AttentionCore);

/// Causal multi-head self-attention: dropout(proj(core(qkv(x)))).
/// Input and output [batch, seq, hidden].
class CausalSelfAttentionImpl
    : public torch::nn::Cloneable<CausalSelfAttentionImpl> {
 public:
  explicit CausalSelfAttentionImpl(const GptOptions& options_);
  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  /// With the causal mask.
  torch::Tensor forward(const torch::Tensor& input);
  /// With `mask` (see AttentionCore).
  torch::Tensor forward_masked(
      const torch::Tensor& input, const torch::Tensor& mask);

  GptOptions options;
  /// Checkpoint the core (GptRecompute::kAttention). Default: false.
  bool checkpoint_core = false;
  torch::nn::Linear qkv{nullptr};
  AttentionCore core{nullptr};
  torch::nn::Linear proj{nullptr};
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(CausalSelfAttention);

/// Pre-LayerNorm transformer block:
///   x = x + attention(ln1(x));  x = x + dropout(fc2(gelu(fc1(ln2(x)))))
/// Input and output [batch, seq, hidden]. `recompute` chooses how it is
/// checkpointed (set_recompute() sets it on every block of a model).
class TransformerBlockImpl : public torch::nn::Cloneable<TransformerBlockImpl> {
 public:
  explicit TransformerBlockImpl(const GptOptions& options_);
  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  /// With the causal mask (a child of a Sequential takes one tensor).
  torch::Tensor forward(const torch::Tensor& input);
  /// With `mask` (see AttentionCore): a block as a planned chain's stage
  /// closes over it (gpt_stages()). (Not an overload of forward: a module
  /// stored in a Sequential has one forward.)
  torch::Tensor forward_masked(
      const torch::Tensor& input, const torch::Tensor& mask);

  GptOptions options;
  /// Default: GptRecompute::kNone.
  GptRecompute recompute = GptRecompute::kNone;
  /// The policy of GptRecompute::kSelective. Default:
  /// remat::policies::save_compute_intensive().
  remat::Policy policy = remat::policies::save_compute_intensive();
  torch::nn::LayerNorm ln1{nullptr};
  CausalSelfAttention attention{nullptr};
  torch::nn::LayerNorm ln2{nullptr};
  torch::nn::Linear fc1{nullptr};
  torch::nn::GELU gelu{nullptr};
  torch::nn::Linear fc2{nullptr};
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(TransformerBlock);

/// Final LayerNorm and vocabulary projection (no bias).
/// Input [batch, seq, hidden]; output logits [batch, seq, vocab].
class LmHeadImpl : public torch::nn::Cloneable<LmHeadImpl> {
 public:
  explicit LmHeadImpl(const GptOptions& options_);
  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  torch::Tensor forward(const torch::Tensor& input);

  GptOptions options;
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear linear{nullptr};
};
TORCH_MODULE(LmHead);

/// The GPT as a Sequential of layers + 2 children.
///
/// Example:
///   auto model = gpt(GptOptions().vocab(65).seq_len(128).layers(2));
///   auto logits = model->forward(tokens);        // tokens int64 [B, S]
///   auto loss = gpt_loss(logits, targets);
/// Throws c10::Error on non-positive sizes, hidden not divisible by heads,
/// or dropout outside [0, 1).
torch::nn::Sequential gpt(const GptOptions& options = {});

/// Sets how every TransformerBlock of `model` (a gpt()) recomputes and, if
/// given, the policy of kSelective (empty: save_compute_intensive()).
///
/// Example:
///   auto model = gpt();
///   set_recompute(model, GptRecompute::kSelective);
void set_recompute(
    const torch::nn::Sequential& model,
    GptRecompute recompute,
    remat::Policy policy = {});

/// The stages of `model` (a gpt()) for remat::PlannedChain: the embedding,
/// each block with `mask` (bool [seq, seq], see AttentionCore) captured, and
/// the head. With the causal mask of the input's length, running them equals
/// model->forward bitwise.
///
/// Example:
// clang-format off
///   auto net = remat::auto_checkpoint(gpt_stages(model, causal_mask(seq)), tokens,
///                                     remat::Budget::parse("50%"));
// clang-format on
/// Throws c10::Error if a child of `model` is not a gpt() part.
std::vector<remat::Stage> gpt_stages(
    const torch::nn::Sequential& model, const torch::Tensor& mask);

/// The causal mask of `seq` positions, bool [seq, seq], true above the
/// diagonal (where a query may not attend a key): the mask gpt_stages()
/// takes for inputs of length seq, and the one every AttentionCore holds for
/// its seq_len. Throws c10::Error if seq < 0.
///
/// Example:
///   auto stages = gpt_stages(model, causal_mask(tokens.size(1)));
torch::Tensor causal_mask(int64_t seq);

/// Mean next-token cross-entropy of logits [B, S, vocab] against int64
/// targets [B, S]. Throws c10::Error if the shapes do not match.
torch::Tensor gpt_loss(
    const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace remat::models
