// checkpoint_bench: the memory/time trade-off of remat::checkpoint on a stack
// of residual feed-forward blocks, measured as docs/benchmarks.md describes.
//
// Model: `blocks` residual blocks x + Linear(hidden->dim)(Dropout(GELU(
// Linear(dim->hidden)(LayerNorm(x))))), batch `batch`. Configurations:
//   none             plain forward/backward (the baseline)
//   per-block        remat::checkpoint around every block (non-reentrant)
//   per-block-reent  the same in Mode::kReentrant
//   sequential(K)    remat::checkpoint_sequential with K segments
//   planned(P%)      remat::PlannedSequential, the optimal plan under
//                    Budget::fraction(P/100) of the store-all peak (the chain
//                    is profiled once, before the rounds; --budget 0 leaves
//                    this configuration out)
// Rounds interleave the configurations (A B C D A B C D ...); the first
// `warmup` rounds are discarded. Each step re-seeds the RNG identically, so
// every configuration must reproduce the baseline's gradients exactly: the
// largest absolute gradient difference is reported (0 = bitwise equal).
// Activation peak: MemoryMeter started just before forward, parameter
// gradients already allocated. With --device cuda the model runs on the GPU,
// the peak comes from the CUDA caching allocator's statistics and each timed
// step ends with a device synchronisation.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include <torch/torch.h>
#include <CLI/CLI.hpp>

#include "models/models.h"
#include "remat/remat.h"

namespace {

using Forward =
    std::function<torch::Tensor(torch::nn::Sequential&, const torch::Tensor&)>;

struct Config {
  Config(std::string name, Forward forward)
      : name(std::move(name)), forward(std::move(forward)) {}
  std::string name;
  Forward forward;
  std::vector<double> step_ms;
  int64_t peak_bytes = 0;
  double max_grad_diff = 0;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

torch::Tensor per_block(
    torch::nn::Sequential& model, torch::Tensor x, remat::Mode mode) {
  for (auto it = model->begin(); it != model->end(); ++it) {
    auto module = *it;
    x = remat::checkpoint(
        [module](const torch::Tensor& in) mutable {
          return module.forward(in);
        },
        x,
        remat::CheckpointOptions().mode(mode));
  }
  return x;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"remat checkpoint benchmark"};
  int64_t blocks = 32, dim = 512, hidden = 2048, batch = 1024, segments = 6;
  int warmup = 3, steps = 10, threads = 2;
  bool markdown = false;
  app.add_option("--blocks", blocks, "residual blocks")->capture_default_str();
  app.add_option("--dim", dim, "model width")->capture_default_str();
  app.add_option("--hidden", hidden, "feed-forward width")
      ->capture_default_str();
  app.add_option("--batch", batch, "batch size")->capture_default_str();
  app.add_option("--segments", segments, "checkpoint_sequential segments")
      ->capture_default_str();
  app.add_option("--warmup", warmup, "discarded rounds")->capture_default_str();
  app.add_option("--steps", steps, "measured rounds")->capture_default_str();
  app.add_option("--threads", threads, "torch threads")->capture_default_str();
  app.add_flag("--markdown", markdown, "print the table as markdown");
  double budget_fraction = 0.5;
  app.add_option(
         "--budget",
         budget_fraction,
         "budget of the planned configuration, a fraction of the "
         "store-all peak (0: no planned configuration)")
      ->capture_default_str();
  std::string device_name = "cpu";
  app.add_option("--device", device_name, "cpu, cuda or cuda:N")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const torch::Device device(device_name);
  if (device.is_cuda() && !torch::cuda::is_available()) {
    std::cerr << "checkpoint_bench: --device " << device_name
              << " needs a CUDA GPU, and none is visible\n";
    return 2;
  }
  const auto synchronize = [&] {
    if (device.is_cuda()) {
      torch::cuda::synchronize(device.has_index() ? device.index() : -1);
    }
  };

  torch::set_num_threads(threads);
  remat::install_tracking_allocator();
  torch::manual_seed(0);
  auto model = remat::models::residual_ffn_stack(
      remat::models::ResidualFfnStackOptions().blocks(blocks).dim(dim).hidden(
          hidden));
  model->train();
  model->to(device);
  auto x = torch::randn({batch, dim}, torch::TensorOptions().device(device));
  for (auto& p : model->parameters()) {
    p.mutable_grad() = torch::zeros_like(p);
  }

  std::vector<Config> configs;
  configs.emplace_back(
      "none", [](torch::nn::Sequential& m, const torch::Tensor& in) {
        return m->forward(in);
      });
  configs.emplace_back(
      "per-block", [](torch::nn::Sequential& m, const torch::Tensor& in) {
        return per_block(m, in, remat::Mode::kNonReentrant);
      });
  configs.emplace_back(
      "per-block-reentrant",
      [](torch::nn::Sequential& m, const torch::Tensor& in) {
        return per_block(m, in, remat::Mode::kReentrant);
      });
  configs.emplace_back(
      "sequential(" + std::to_string(segments) + ")",
      [segments](torch::nn::Sequential& m, const torch::Tensor& in) {
        return remat::checkpoint_sequential(m, segments, in);
      });
  // Reentrant mode needs an input that requires grad to reach the parameters.
  auto x_grad = x.clone().requires_grad_(true);
  int64_t budget_bytes = 0;
  int64_t input_bytes = 0;
  if (budget_fraction > 0) {
    const auto budget = remat::Budget::fraction(budget_fraction);
    const remat::planner::Chain chain = remat::profile_chain(model, x_grad);
    budget_bytes = budget.resolve_bytes(chain);
    input_bytes = chain.input_bytes();
    const auto plan = remat::planner::solve_optimal(chain, budget_bytes);
    if (!plan) {
      std::cerr << "checkpoint_bench: no plan fits " << budget.to_string()
                << " (" << budget_bytes << " bytes); the minimum is "
                << remat::planner::min_feasible_budget_bytes(chain)
                << " bytes\n";
      return 2;
    }
    remat::PlannedSequential planned(model, *plan);
    configs.emplace_back(
        "planned(" + std::to_string(std::lround(budget_fraction * 100)) + "%)",
        [planned](torch::nn::Sequential&, const torch::Tensor& in) mutable {
          return planned->forward(in);
        });
  }

  std::vector<torch::Tensor> reference_grads;
  for (int round = 0; round < warmup + steps; ++round) {
    for (size_t c = 0; c < configs.size(); ++c) {
      auto& config = configs[c];
      for (auto& p : model->parameters()) {
        p.mutable_grad().zero_();
      }
      torch::manual_seed(1000 + round);
      synchronize();
      remat::MemoryMeter meter(device);
      const auto start = std::chrono::steady_clock::now();
      auto y = config.forward(model, x_grad);
      y.pow(2).mean().backward();
      synchronize();
      const double ms = std::chrono::duration<double, std::milli>(
                            std::chrono::steady_clock::now() - start)
                            .count();
      const int64_t peak = meter.peak_delta_bytes();
      x_grad.mutable_grad() = torch::Tensor();
      if (round < warmup) {
        continue;
      }
      config.step_ms.push_back(ms);
      config.peak_bytes = std::max(config.peak_bytes, peak);
      if (c == 0) {
        reference_grads.clear();
        for (auto& p : model->parameters()) {
          reference_grads.push_back(p.grad().clone());
        }
      } else {
        auto params = model->parameters();
        for (size_t i = 0; i < params.size(); ++i) {
          config.max_grad_diff = std::max(
              config.max_grad_diff,
              (params[i].grad() - reference_grads[i])
                  .abs()
                  .max()
                  .item<double>());
        }
      }
    }
  }

  const auto& base = configs[0];
  const double base_ms = median(base.step_ms);
  std::printf(
      "model: %lld residual blocks dim %lld hidden %lld, batch %lld; %s; %d "
      "threads; "
      "%d warm-up + %d measured rounds, interleaved\n",
      (long long)blocks,
      (long long)dim,
      (long long)hidden,
      (long long)batch,
      device.str().c_str(),
      threads,
      warmup,
      steps);
  const char* row =
      markdown ? "| %-22s | %10.1f | %6.3f | %9.1f | %9.1f | %6.3f | %9.3g |\n"
               : "%-24s %10.1f %8.3f %11.1f %11.1f %8.3f %11.3g\n";
  if (markdown) {
    std::printf(
        "| config | peak MB | memory ratio | median ms | spread ms | time "
        "ratio | max grad diff |\n"
        "|---|---|---|---|---|---|---|\n");
  } else {
    std::printf(
        "%-24s %10s %8s %11s %11s %8s %11s\n",
        "config",
        "peak MB",
        "mem x",
        "median ms",
        "spread ms",
        "time x",
        "grad diff");
  }
  for (const auto& config : configs) {
    const auto [lo, hi] =
        std::minmax_element(config.step_ms.begin(), config.step_ms.end());
    std::printf(
        row,
        config.name.c_str(),
        config.peak_bytes / 1e6,
        static_cast<double>(config.peak_bytes) / base.peak_bytes,
        median(config.step_ms),
        *hi - *lo,
        median(config.step_ms) / base_ms,
        config.max_grad_diff);
  }
  if (budget_fraction > 0) {
    // The budget counts the chain input, which the meter does not (it exists
    // before the step starts).
    const auto& planned = configs.back();
    const int64_t counted = planned.peak_bytes + input_bytes;
    std::printf(
        "%s: peak %.1f MB + input %.1f MB = %.1f MB against a budget of %.1f "
        "MB: %s\n",
        planned.name.c_str(),
        planned.peak_bytes / 1e6,
        input_bytes / 1e6,
        counted / 1e6,
        budget_bytes / 1e6,
        counted <= budget_bytes ? "within" : "OVER");
  }
  return 0;
}
