// dynamic_remat.cpp: training code with a data-dependent loop under a byte
// budget, with remat::DynamicRemat and no plan.
//
// The model runs a number of residual feed-forward blocks that depends on
// each batch. Each step runs once plainly and once inside a DynamicRemat
// scope (alternating, same seeds), and the program prints the median step
// times, the measured activation peaks and the scope's counters.
//
//   dynamic_remat [--steps N] [--budget-mib B] [--width W] [--batch N]
//                 [--blocks N]
// --budget-mib 0 (the default) means a budget no step reaches: what the
// bookkeeping costs when nothing is evicted.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "remat/remat.h"

namespace {

struct Flags {
  int64_t steps = 5;
  int64_t budget_mib = 0;
  int64_t width = 512;
  int64_t batch = 512;
  int64_t blocks = 16;
};

Flags parse(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string name = argv[i];
    const int64_t value = std::atoll(argv[i + 1]);
    if (name == "--steps") {
      flags.steps = value;
    } else if (name == "--budget-mib") {
      flags.budget_mib = value;
    } else if (name == "--width") {
      flags.width = value;
    } else if (name == "--batch") {
      flags.batch = value;
    } else if (name == "--blocks") {
      flags.blocks = value;
    } else {
      std::cerr << "dynamic_remat: unknown flag " << name << "\n";
      std::exit(2);
    }
  }
  return flags;
}

/// Residual blocks x + W2 dropout(gelu(W1 x)); how many run depends on the
/// batch (between half of them and all).
struct LoopModelImpl : torch::nn::Module {
  LoopModelImpl(int64_t width, int64_t blocks) {
    for (int64_t i = 0; i < blocks; ++i) {
      up.push_back(register_module(
          "up" + std::to_string(i), torch::nn::Linear(width, 4 * width)));
      down.push_back(register_module(
          "down" + std::to_string(i), torch::nn::Linear(4 * width, width)));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    const auto blocks = static_cast<int64_t>(up.size());
    const int64_t active =
        blocks / 2 +
        (x.select(1, 0).gt(0).sum().item<int64_t>() % (blocks / 2 + 1));
    for (int64_t i = 0; i < std::min(active, blocks); ++i) {
      auto inner = torch::gelu(up[i]->forward(x));
      x = x + down[i]->forward(torch::dropout(inner, 0.1, is_training()));
    }
    return x.pow(2).mean();
  }
  std::vector<torch::nn::Linear> up, down;
};
TORCH_MODULE(LoopModel);

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = parse(argc, argv);
  remat::install_tracking_allocator();
  torch::manual_seed(0);
  LoopModel model(flags.width, flags.blocks);
  for (auto& parameter : model->parameters()) {
    parameter.mutable_grad() = torch::zeros_like(parameter);
  }
  const int64_t budget_bytes =
      flags.budget_mib > 0 ? flags.budget_mib << 20 : int64_t{1} << 50;

  std::vector<double> plain_ms, dynamic_ms;
  int64_t plain_peak = 0, dynamic_peak = 0;
  remat::DynamicRematStats stats;
  for (int64_t step = 0; step < flags.steps; ++step) {
    torch::manual_seed(100 + step);
    const torch::Tensor x = torch::randn({flags.batch, flags.width});
    for (const bool dynamic : {false, true}) {
      torch::manual_seed(200 + step);
      remat::MemoryMeter meter;
      const auto start = std::chrono::steady_clock::now();
      if (dynamic) {
        remat::DynamicRemat scope(
            remat::DynamicRematOptions().budget_bytes(budget_bytes));
        model->forward(x).backward();
        stats = scope.stats();
      } else {
        model->forward(x).backward();
      }
      const double ms = std::chrono::duration<double, std::milli>(
                            std::chrono::steady_clock::now() - start)
                            .count();
      (dynamic ? dynamic_ms : plain_ms).push_back(ms);
      (dynamic ? dynamic_peak : plain_peak) = std::max(
          dynamic ? dynamic_peak : plain_peak, meter.peak_delta_bytes());
    }
  }
  const double plain = median(plain_ms);
  const double dynamic = median(dynamic_ms);
  std::cout << "step time (median of " << flags.steps << "): plain " << plain
            << " ms, dynamic " << dynamic << " ms (" << dynamic / plain
            << "x)\n"
            << "activation peak: plain " << (plain_peak >> 20)
            << " MiB, dynamic " << (dynamic_peak >> 20) << " MiB\n"
            << "last dynamic step: " << stats.recorded_calls
            << " calls recorded, " << stats.saved_tensors << " saved ("
            << stats.untracked_saved_tensors << " untracked), tracked peak "
            << (stats.tracked_peak_bytes >> 20) << " MiB, " << stats.evictions
            << " evictions, " << stats.rematerializations
            << " rematerializations\n";
  return 0;
}
