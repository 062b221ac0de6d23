// basic_checkpoint: the README's first example. A stack of feed-forward blocks
// Linear(1024->4096), ReLU, Linear(4096->1024) trained with AdamW, one step
// with and one without remat::checkpoint around each block. Prints the
// activation peak of each step (measured by remat::MemoryMeter) and checks
// that the gradients are identical.
//
//   basic_checkpoint [--steps N]
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include <remat/remat.h>
#include <torch/torch.h>

int main(int argc, char** argv) {
  int steps = 1;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--steps") {
      steps = std::atoi(argv[i + 1]);
    }
  }
  torch::manual_seed(0);
  std::vector<torch::nn::Sequential> blocks;
  std::vector<torch::Tensor> parameters;
  for (int i = 0; i < 4; ++i) {
    blocks.emplace_back(
        torch::nn::Linear(1024, 4096),
        torch::nn::ReLU(),
        torch::nn::Linear(4096, 1024));
    for (const auto& p : blocks.back()->parameters()) {
      parameters.push_back(p);
    }
  }
  torch::optim::AdamW optimizer(parameters, /*lr=*/1e-3);
  auto x = torch::randn({1024, 1024});

  // One training step's forward and backward; returns the activation peak.
  auto step = [&](bool use_checkpoint) {
    for (auto& p : parameters) {  // zero in place: gradients stay allocated
      if (p.grad().defined()) {
        p.mutable_grad().zero_();
      }
    }
    remat::MemoryMeter meter;  // counts every CPU tensor byte from here on
    torch::Tensor h = x;
    for (auto& block : blocks) {
      h = use_checkpoint
              ? remat::checkpoint(
                    [&](const torch::Tensor& in) { return block->forward(in); },
                    h)
              : block->forward(h);
    }
    h.pow(2).mean().backward();
    return meter.peak_delta_bytes();
  };

  step(false);  // allocates the gradients, so both measured steps start alike
  for (int i = 0; i < steps; ++i) {
    const int64_t plain_peak = step(false);
    auto plain_grad = parameters[0].grad().clone();
    const int64_t checkpoint_peak = step(true);
    const bool same = torch::equal(plain_grad, parameters[0].grad());
    optimizer.step();
    std::cout << "activation peak without checkpoint: " << plain_peak / 1e6
              << " MB\n"
              << "activation peak with checkpoint:    " << checkpoint_peak / 1e6
              << " MB (" << 100.0 * checkpoint_peak / plain_peak << "%)\n"
              << "gradients identical: " << (same ? "yes" : "NO") << "\n";
    if (!same) {
      return 1;
    }
  }
  return 0;
}
