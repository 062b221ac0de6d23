// plan_a_transformer: your own transformer, planned into half its memory.
//
// The model is written the way LibTorch users write one: an embedding
// module, blocks whose forward takes the hidden state *and* an attention
// mask, a head. It is not a torch::nn::Sequential of one-tensor children, so
// it is handed to remat as a chain of stages: each stage is a callable from
// the hidden state to the next one, closing over what else the block needs
// (here the causal mask), plus the module that owns its parameters. remat
// profiles the stages, picks the fastest schedule within the budget, and
// trains with gradients equal to the plain model's.
//
//   plan_a_transformer [--steps N]     (default 20)
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include <remat/remat.h>
#include <torch/torch.h>

namespace {

constexpr int64_t kVocab = 64, kSeq = 128, kWidth = 128, kHeads = 4,
                  kLayers = 6;

struct EmbedImpl : torch::nn::Module {
  EmbedImpl()
      : token(register_module("token", torch::nn::Embedding(kVocab, kWidth))),
        position(
            register_module("position", torch::nn::Embedding(kSeq, kWidth))) {}
  torch::Tensor forward(const torch::Tensor& tokens) {
    return token(tokens) + position(torch::arange(tokens.size(1)));
  }
  torch::nn::Embedding token, position;
};
TORCH_MODULE(Embed);

/// Pre-norm block; `mask` is true where a position may not attend.
struct BlockImpl : torch::nn::Module {
  BlockImpl()
      : norm1(register_module(
            "norm1", torch::nn::LayerNorm(std::vector<int64_t>{kWidth}))),
        qkv(register_module("qkv", torch::nn::Linear(kWidth, 3 * kWidth))),
        out(register_module("out", torch::nn::Linear(kWidth, kWidth))),
        norm2(register_module(
            "norm2", torch::nn::LayerNorm(std::vector<int64_t>{kWidth}))),
        up(register_module("up", torch::nn::Linear(kWidth, 4 * kWidth))),
        down(register_module("down", torch::nn::Linear(4 * kWidth, kWidth))),
        dropout(register_module("dropout", torch::nn::Dropout(0.1))) {}

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask) {
    const int64_t batch = x.size(0), seq = x.size(1), head = kWidth / kHeads;
    auto parts = qkv(norm1(x))
                     .view({batch, seq, 3, kHeads, head})
                     .permute({2, 0, 3, 1, 4});
    auto scores = torch::matmul(parts[0], parts[1].transpose(-2, -1)) /
                  std::sqrt(double(head));
    auto weights =
        dropout(torch::softmax(scores.masked_fill(mask, -INFINITY), -1));
    auto context = torch::matmul(weights, parts[2])
                       .transpose(1, 2)
                       .reshape({batch, seq, kWidth});
    auto h = x + out(context);
    return h + dropout(down(torch::gelu(up(norm2(h)))));
  }
  torch::nn::LayerNorm norm1;
  torch::nn::Linear qkv, out;
  torch::nn::LayerNorm norm2;
  torch::nn::Linear up, down;
  torch::nn::Dropout dropout;
};
TORCH_MODULE(Block);

}  // namespace

int main(int argc, char** argv) {
  int steps = 20;
  if (argc == 3 && std::string(argv[1]) == "--steps") {
    steps = std::atoi(argv[2]);
  } else if (argc != 1) {
    std::cerr << "usage: plan_a_transformer [--steps N]\n";
    return 2;
  }
  torch::manual_seed(0);
  Embed embed;
  std::vector<Block> blocks(kLayers);
  torch::nn::Linear head(kWidth, kVocab);
  const torch::Tensor causal = torch::ones({kSeq, kSeq}, torch::kBool).triu(1);

  // The model as a chain of stages.
  std::vector<remat::Stage> stages;
  stages.push_back(
      {[embed](const torch::Tensor& t) mutable { return embed->forward(t); },
       embed.ptr()});
  for (Block block : blocks) {  // a copy of the holder: the same module
    stages.push_back(
        {[block, causal](const torch::Tensor& x) mutable {
           return block->forward(x, causal);
         },
         block.ptr()});
  }
  stages.push_back(
      {[head](const torch::Tensor& x) mutable { return head(x); }, head.ptr()});

  const torch::Tensor tokens = torch::randint(kVocab, {8, kSeq});
  const torch::Tensor targets =
      torch::roll(tokens, -1, 1);  // predict the next token

  // Profile, then the fastest plan within half of the store-everything peak.
  const remat::planner::Chain chain = remat::profile_chain(stages, tokens);
  remat::PlannedChain net =
      remat::auto_checkpoint(stages, tokens, remat::Budget::parse("50%"));
  std::cout << remat::explain(chain, net->plan()) << "\n";

  torch::optim::Adam optimizer(
      net->parameters(), torch::optim::AdamOptions(3e-3));
  for (int step = 1; step <= steps; ++step) {
    remat::MemoryMeter meter;
    optimizer.zero_grad();
    auto logits = net->forward(tokens);
    auto loss = torch::nn::functional::cross_entropy(
        logits.reshape({-1, kVocab}), targets.reshape({-1}));
    logits = torch::Tensor();  // the logits are the chain output: let backward
                               // free them
    loss.backward();
    optimizer.step();
    if (step == 1 || step % 5 == 0 || step == steps) {
      std::cout << "step " << step << "  loss " << loss.item<double>()
                << "  activation peak " << meter.peak_delta_bytes() / (1 << 20)
                << " MiB\n";
    }
  }
  return 0;
}
