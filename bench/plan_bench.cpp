// plan_bench: experiments E1 and E2 of bench-protocol.md (planned execution).
//
//   E1  homogeneous chain (n blocks of Linear(w->w)+ReLU): sweep budgets from
//       the minimum to store-all, plus "about 2 sqrt(n) activations kept";
//       per budget the optimal plan's stage forwards next to the fewest any
//       plan needs, measured peak and time ratio against no checkpointing,
//       next to the 1 + extra_forwards / (3 n) rule.
//   E2  heterogeneous chains (ResNet-style CNN, MLP of varying widths): per
//       budget (10% ... 100% of the no-checkpoint peak) the optimal plan
//       against the fastest remat::checkpoint_sequential(k) whose measured
//       peak fits, every k measured.
//   E2-variants (only when named)  prediction only, no training steps: the
//       same comparison by simulate() on finer and deeper versions of the E2
//       chains, and what 500 memory slots cost against 5000.
//
// Protocol: torch::set_num_threads(2), fp32, freed memory kept by malloc
// (keep_freed_memory); every configuration of a table
// is run interleaved (A B C A B C ...) for `--warmup` untimed and `--steps`
// timed steps; medians and spreads (max - min) are reported; the baseline is
// re-run at the end. The loss is sum(output * w) with fixed random weights w
// (a real gradient of the output's size, as with any real loss). Activation
// peak = MemoryMeter peak during forward + loss + backward minus the live
// bytes before forward (parameter gradients preallocated) plus the input
// bytes, i.e. in simulate()'s units. Every
// configuration's gradients are compared bitwise with the baseline's (the
// models have no dropout; a mismatch aborts the run with an error).
//
// Flags: see kUsage (plan_bench --help).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <models/models.h>
#include <torch/torch.h>
#include <torch/version.h>

#include "remat/planner.h"
#include "remat/remat.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace {

namespace planner = remat::planner;
using StepFn = std::function<torch::Tensor(const torch::Tensor&)>;

struct Flags {
  std::string experiment = "all";
  int warmup = 3;
  int steps = 10;
  bool quick = false;
  int64_t e1_batch = 0;      // 0: the default (1024; --quick 64)
  int64_t resnet_batch = 0;  // 0: the default (32; --quick 4)
  int64_t mlp_batch = 0;     // 0: the default (256; --quick 64)
  std::string write_path;
  std::string command;
};

/// One configuration of a table: a way to run the model.
struct Config {
  std::string name;
  StepFn forward;
  std::vector<double> step_ms, forward_ms, backward_ms;
  int64_t peak_bytes = -1;  // activation peak + input bytes
  int64_t stage_forwards = -1;
  /// simulate() of the plan this configuration runs (the schedule of
  /// checkpoint_sequential(k) is solve_uniform(chain, k)).
  int64_t predicted_peak_bytes = -1;
  double predicted_ms = -1;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid]
                           : 0.5 * (values[mid - 1] + values[mid]);
}

double geomean(const std::vector<double>& values) {
  double log_sum = 0;
  for (double value : values) {
    log_sum += std::log(value);
  }
  return std::exp(log_sum / static_cast<double>(values.size()));
}

double spread(const std::vector<double>& values) {
  auto [low, high] = std::minmax_element(values.begin(), values.end());
  return *high - *low;
}

double since_ms(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now() - start)
      .count();
}

Config make_config(std::string name, StepFn forward) {
  Config config;
  config.name = std::move(name);
  config.forward = std::move(forward);
  return config;
}

/// Runs the configurations of one table, interleaved; checks gradients.
class Table {
 public:
  Table(torch::nn::Sequential model, torch::Tensor input)
      : model_(std::move(model)), input_(std::move(input)) {
    torch::NoGradGuard no_grad;
    for (auto& parameter : model_->parameters()) {
      parameter.mutable_grad() = torch::zeros_like(parameter);
    }
    loss_weights_ = torch::randn_like(model_->forward(input_));
  }

  /// One step; returns the gradients; fills times and (if asked) the peak.
  std::vector<torch::Tensor> step(Config& config, bool timed, bool measure) {
    {
      torch::NoGradGuard no_grad;
      for (auto& parameter : model_->parameters()) {
        parameter.mutable_grad().zero_();
      }
    }
    remat::MemoryMeter meter;
    const auto start = std::chrono::steady_clock::now();
    // loss = sum(output * weights): a linear loss whose gradient g_L is a
    // real tensor of the output's size, as with any real loss (a plain
    // sum's gradient is an expanded scalar, which the cost model, counting
    // g_L, would over-predict). The output is not held past the loss.
    auto loss = (config.forward(input_) * loss_weights_).sum();
    const double forward_ms = since_ms(start);
    const auto backward_start = std::chrono::steady_clock::now();
    loss.backward();
    const double backward_ms = since_ms(backward_start);
    if (measure) {
      config.peak_bytes =
          meter.peak_delta_bytes() + static_cast<int64_t>(input_.nbytes());
    }
    if (timed) {
      config.step_ms.push_back(forward_ms + backward_ms);
      config.forward_ms.push_back(forward_ms);
      config.backward_ms.push_back(backward_ms);
    }
    std::vector<torch::Tensor> grads;
    if (measure) {
      for (const auto& parameter : model_->parameters()) {
        grads.push_back(parameter.grad().clone());
      }
    }
    return grads;
  }

  /// Runs every configuration: gradient gate and peak on a first step, then
  /// warm-up and timed steps interleaved; the baseline (configs[0]) again at
  /// the end. Returns the median of the final baseline run.
  double run(std::vector<Config>& configs, const Flags& flags) {
    std::vector<torch::Tensor> reference;
    for (auto& config : configs) {
      auto grads = step(config, false, true);
      if (reference.empty()) {
        reference = grads;
        continue;
      }
      for (size_t i = 0; i < grads.size(); ++i) {
        TORCH_CHECK(
            grads[i].sizes() == reference[i].sizes() &&
                std::memcmp(
                    grads[i].data_ptr(),
                    reference[i].data_ptr(),
                    grads[i].nbytes()) == 0,
            "plan_bench: gradients of ",
            config.name,
            " differ from the baseline's (parameter ",
            i,
            ")");
      }
    }
    for (int round = 0; round < flags.warmup + flags.steps; ++round) {
      for (auto& config : configs) {
        step(config, round >= flags.warmup, false);
      }
    }
    Config again = configs[0];
    again.step_ms.clear();
    for (int round = 0; round < flags.steps; ++round) {
      step(again, true, false);
    }
    return median(again.step_ms);
  }

  torch::nn::Sequential model() const {
    return model_;
  }
  const torch::Tensor& input() const {
    return input_;
  }

 private:
  torch::nn::Sequential model_;
  torch::Tensor input_;
  torch::Tensor loss_weights_;  // fixed per table: the loss's weights
};

/// Profiling for the plans: more rounds than profile_chain's default (1 + 3),
/// because single stage times of a few ms vary by tens of percent on a
/// shared machine, and the plan follows the times.
remat::ProfileOptions profile_options() {
  return remat::ProfileOptions().warmup(3).repeats(11);
}

/// `chain` with every stage's forward and backward time replaced by the median
/// over its stages, for a chain of identical stages: what differs between
/// their measured times is noise, and the plan should not follow it.
planner::Chain same_stage_times(const planner::Chain& chain) {
  std::vector<double> forward;
  std::vector<double> backward;
  for (const planner::StageCost& stage : chain.stages()) {
    forward.push_back(stage.forward_ms);
    backward.push_back(stage.backward_ms);
  }
  const double forward_ms = median(forward);
  const double backward_ms = median(backward);
  std::vector<planner::StageCost> stages = chain.stages();
  for (planner::StageCost& stage : stages) {
    stage.forward_ms = forward_ms;
    stage.backward_ms = backward_ms;
  }
  return planner::Chain(std::move(stages), chain.input_bytes());
}

/// A counting forward through a plan: forwards are counted from the plan.
int64_t plan_forwards(const planner::Plan& plan) {
  return std::count_if(
      plan.ops.begin(), plan.ops.end(), [](const planner::Op& op) {
        return op.kind != planner::OpKind::kBackward;
      });
}

std::string mib(int64_t bytes) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(1)
      << static_cast<double>(bytes) / (1 << 20);
  return out.str();
}

std::string fixed(double value, int digits) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(digits) << value;
  return out.str();
}

// ---- E1 ---------------------------------------------------------------------

std::string run_e1(const Flags& flags) {
  std::ostringstream md;
  const int64_t width = 512;
  const int64_t batch =
      flags.e1_batch > 0 ? flags.e1_batch : (flags.quick ? 64 : 1024);
  md << "Model: n blocks of Linear(" << width << "->" << width
     << ")+ReLU, batch " << batch
     << (batch == 1024 ? " (the protocol's)"
                       : " (protocol: 1024; scaled down for time)")
     << ", "
        "fp32. Budgets from the minimum feasible to store-all; plans from "
        "`solve_optimal` (500 slots) on the chain `profile_chain` measured, "
        "with every stage's forward and backward time set to the median over "
        "the stages (identical stages: the differences are noise). `least "
        "fwd` = the fewest stage forwards of any plan at the budget (the DP "
        "with forward time 1, backward 0). "
        "`fwd` = executed stage forwards (n = none recomputed); rule = 1 + "
        "extra_forwards / (3 n). Peaks include the input (simulate()'s "
        "units).\n\n";
  for (int64_t blocks : {int64_t{32}, int64_t{64}}) {
    torch::manual_seed(7);
    auto model = remat::models::uniform_mlp_chain(blocks, width);
    auto input = torch::randn({batch, width});
    const auto chain =
        same_stage_times(remat::profile_chain(model, input, profile_options()));
    const int64_t minimum = planner::min_feasible_budget_bytes(chain);
    const auto store_all =
        planner::simulate(chain, planner::solve_store_all(chain));
    Table table(model, input);
    std::vector<Config> configs;
    configs.push_back(make_config(
        "no checkpointing",
        [model](const torch::Tensor& x) mutable { return model->forward(x); }));
    std::vector<planner::Plan> plans{planner::solve_store_all(chain)};
    std::vector<int64_t> budgets{store_all.peak_bytes};
    // Budgets: fractions of the way from the minimum to store-all, and the
    // protocol's "about 2 sqrt(n) activations kept": store-all keeps n
    // activations plus a working set (input, gradients, a transient); this
    // budget keeps ceil(2 sqrt(n)) activations plus the same working set.
    const double root = std::sqrt(static_cast<double>(blocks));
    const int64_t activation = chain.stage(0).output_bytes;
    const int64_t two_root_kept =
        store_all.peak_bytes -
        (blocks - static_cast<int64_t>(std::ceil(2.0 * root))) * activation;
    std::vector<int64_t> sweep{two_root_kept};
    for (double fraction : {0.05, 1.0 / root, 2.0 / root, 0.5, 1.0}) {
      sweep.push_back(
          minimum +
          static_cast<int64_t>(
              fraction * static_cast<double>(store_all.peak_bytes - minimum)));
    }
    std::sort(sweep.begin(), sweep.end());
    // The least stage forwards any plan needs at a budget: the same DP on the
    // chain with every forward costing 1 and every backward 0 (exact here:
    // the sizes share the factor |x|, see solve_optimal).
    std::vector<planner::StageCost> counting_stages = chain.stages();
    for (planner::StageCost& stage : counting_stages) {
      stage.forward_ms = 1;
      stage.backward_ms = 0;
    }
    const planner::Chain counting(counting_stages, chain.input_bytes());
    std::vector<int64_t> least_forwards{blocks};
    for (const int64_t budget : sweep) {
      least_forwards.push_back(
          plan_forwards(*planner::solve_optimal(counting, budget)));
      auto plan = planner::solve_optimal(chain, budget);
      TORCH_CHECK(plan.has_value(), "plan_bench: no plan at ", budget);
      budgets.push_back(budget);
      plans.push_back(*plan);
      remat::PlannedSequential net(model, *plan);
      configs.push_back(make_config(
          "optimal@" + mib(budget),
          [net](const torch::Tensor& x) mutable { return net->forward(x); }));
    }
    const double baseline_end_ms = table.run(configs, flags);
    const double baseline_ms = median(configs[0].step_ms);
    md << "### E1, n = " << blocks << "\n\n"
       << "| budget MiB | predicted peak MiB | measured peak MiB | memory "
          "ratio "
          "| fwd | least fwd | recomputed | step ms (fwd/bwd) | spread ms | "
          "time ratio | rule | predicted time ratio |\n"
       << "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    const int64_t baseline_peak = configs[0].peak_bytes;
    for (size_t c = 0; c < configs.size(); ++c) {
      const Config& config = configs[c];
      const planner::Plan& plan = plans[c == 0 ? 0 : c];
      const int64_t forwards = plan_forwards(plan);
      const auto simulation = planner::simulate(chain, plan);
      const double ratio = median(config.step_ms) / baseline_ms;
      md << "| "
         << (c == 0 ? "none (plain)"
                    : mib(budgets[c]) +
                          (budgets[c] == two_root_kept ? " (2√n kept)" : ""))
         << " | " << mib(simulation.peak_bytes) << " | "
         << mib(config.peak_bytes) << " | "
         << fixed(static_cast<double>(config.peak_bytes) / baseline_peak, 3)
         << " | " << forwards << " | " << least_forwards[c] << " | "
         << forwards - blocks << " | " << fixed(median(config.step_ms), 1)
         << " (" << fixed(median(config.forward_ms), 1) << "/"
         << fixed(median(config.backward_ms), 1) << ") | "
         << fixed(spread(config.step_ms), 1) << " | " << fixed(ratio, 3)
         << " | "
         << fixed(
                1.0 + static_cast<double>(forwards - blocks) / (3.0 * blocks),
                3)
         << " | " << fixed(simulation.time_ms / store_all.time_ms, 3) << " |\n";
    }
    int64_t at_least = 0;
    for (size_t c = 0; c < configs.size(); ++c) {
      at_least += plan_forwards(plans[c]) == least_forwards[c] ? 1 : 0;
    }
    md << "\nStage forwards equal the least possible on " << at_least << " of "
       << configs.size()
       << " rows. Baseline re-run at the end: " << fixed(baseline_end_ms, 1)
       << " ms (interleaved median " << fixed(baseline_ms, 1) << " ms).\n\n";
    std::cout << md.str() << std::flush;
  }
  return md.str();
}

// ---- E2 ---------------------------------------------------------------------

std::string run_e2_model(
    const std::string& name,
    torch::nn::Sequential model,
    torch::Tensor input,
    const Flags& flags,
    std::vector<double>* all_ratios,
    std::vector<double>* predicted_ratios) {
  std::ostringstream md;
  const auto chain = remat::profile_chain(model, input, profile_options());
  const int64_t stages = chain.size();
  Table table(model, input);
  std::vector<Config> configs;
  configs.push_back(make_config(
      "no checkpointing",
      [model](const torch::Tensor& x) mutable { return model->forward(x); }));
  for (int64_t k = 1; k <= stages; ++k) {
    configs.push_back(make_config(
        "checkpoint_sequential(" + std::to_string(k) + ")",
        [model, k](const torch::Tensor& x) mutable {
          return remat::checkpoint_sequential(model, k, x);
        }));
    const planner::Plan uniform = planner::solve_uniform(chain, k);
    const auto simulation = planner::simulate(chain, uniform);
    configs.back().stage_forwards = plan_forwards(uniform);
    configs.back().predicted_peak_bytes = simulation.peak_bytes;
    configs.back().predicted_ms = simulation.time_ms;
  }
  // Budgets: fractions of the no-checkpoint peak measured now.
  Config probe = configs[0];
  table.step(probe, false, true);
  const int64_t baseline_peak = probe.peak_bytes;
  const int64_t minimum = planner::min_feasible_budget_bytes(chain);
  std::vector<int64_t> budgets;
  std::map<std::string, size_t> config_of_plan;
  std::vector<size_t> optimal_config;  // per budget; 0: infeasible
  for (int percent = 10; percent <= 100; percent += 10) {
    const int64_t budget = baseline_peak * percent / 100;
    budgets.push_back(budget);
    auto plan = budget >= minimum ? planner::solve_optimal(chain, budget)
                                  : std::nullopt;
    if (!plan) {
      optimal_config.push_back(0);
      continue;
    }
    const std::string key = plan->to_string();
    if (!config_of_plan.count(key)) {
      remat::PlannedSequential net(model, *plan);
      config_of_plan[key] = configs.size();
      configs.push_back(make_config(
          "optimal@" + std::to_string(percent) + "%",
          [net](const torch::Tensor& x) mutable { return net->forward(x); }));
      const auto simulation = planner::simulate(chain, *plan);
      configs.back().stage_forwards = plan_forwards(*plan);
      configs.back().predicted_peak_bytes = simulation.peak_bytes;
      configs.back().predicted_ms = simulation.time_ms;
    }
    optimal_config.push_back(config_of_plan[key]);
  }
  const double baseline_end_ms = table.run(configs, flags);
  const double baseline_ms = median(configs[0].step_ms);

  md << "### E2, " << name << " (" << stages << " stages, input "
     << input.sizes() << ")\n\n"
     << "No-checkpoint peak " << mib(baseline_peak) << " MiB, step "
     << fixed(baseline_ms, 1)
     << " ms (re-run at the end: " << fixed(baseline_end_ms, 1)
     << " ms); minimum feasible budget " << mib(minimum) << " MiB.\n\n"
     << "| budget | budget MiB | optimal: peak MiB, ms, fwd | best "
        "checkpoint_sequential: k, peak MiB, ms | time ratio opt/best-k | "
        "predicted ratio | within budget |\n"
     << "|---|---|---|---|---|---|---|\n";
  for (size_t b = 0; b < budgets.size(); ++b) {
    const int64_t budget = budgets[b];
    int best_k = -1;
    double best_ms = 0;
    for (int64_t k = 1; k <= stages; ++k) {
      const Config& config = configs[k];
      if (config.peak_bytes <= budget &&
          (best_k < 0 || median(config.step_ms) < best_ms)) {
        best_k = static_cast<int>(k);
        best_ms = median(config.step_ms);
      }
    }
    md << "| " << (b + 1) * 10 << "% | " << mib(budget) << " | ";
    const size_t c = optimal_config[b];
    double optimal_ms = 0;
    if (c == 0) {
      md << "infeasible";
    } else {
      optimal_ms = median(configs[c].step_ms);
      md << mib(configs[c].peak_bytes) << ", " << fixed(optimal_ms, 1) << ", "
         << configs[c].stage_forwards;
    }
    md << " | ";
    if (best_k < 0) {
      md << "none fits";
    } else {
      md << best_k << ", " << mib(configs[best_k].peak_bytes) << ", "
         << fixed(best_ms, 1);
    }
    md << " | ";
    if (c != 0 && best_k > 0) {
      const double ratio = optimal_ms / best_ms;
      const double predicted =
          configs[c].predicted_ms / configs[best_k].predicted_ms;
      all_ratios->push_back(ratio);
      predicted_ratios->push_back(predicted);
      md << fixed(ratio, 3) << " | " << fixed(predicted, 3);
    } else {
      md << "— | —";
    }
    md << " | "
       << (c == 0                            ? "—"
           : configs[c].peak_bytes <= budget ? "yes"
                                             : "NO")
       << " |\n";
  }
  const auto store_all =
      planner::simulate(chain, planner::solve_store_all(chain));
  md << "\nEvery configuration (predicted = simulate() on the profiled chain; "
        "time ratios against the no-checkpoint run, predicted against the "
        "store-all plan):\n\n"
     << "| configuration | fwd | predicted peak MiB | measured peak MiB | "
        "predicted time ratio | step ms (fwd/bwd) | spread ms | time ratio |\n"
     << "|---|---|---|---|---|---|---|---|\n";
  for (const Config& config : configs) {
    md << "| " << config.name << " | "
       << (config.stage_forwards < 0 ? std::to_string(stages)
                                     : std::to_string(config.stage_forwards))
       << " | "
       << (config.predicted_peak_bytes < 0 ? mib(store_all.peak_bytes)
                                           : mib(config.predicted_peak_bytes))
       << " | " << mib(config.peak_bytes) << " | "
       << fixed(
              (config.predicted_ms < 0 ? store_all.time_ms
                                       : config.predicted_ms) /
                  store_all.time_ms,
              3)
       << " | " << fixed(median(config.step_ms), 1) << " ("
       << fixed(median(config.forward_ms), 1) << "/"
       << fixed(median(config.backward_ms), 1) << ") | "
       << fixed(spread(config.step_ms), 1) << " | "
       << fixed(median(config.step_ms) / baseline_ms, 3) << " |\n";
  }
  md << "\n";
  std::cout << md.str() << std::flush;
  return md.str();
}

std::string run_e2(const Flags& flags) {
  std::ostringstream md;
  md << "Budgets are fractions of the measured no-checkpoint peak (input "
        "included); the optimal plan (`solve_optimal`, 500 slots, on the "
        "profiled chain) against the fastest `remat::checkpoint_sequential(k)` "
        "(non-reentrant) whose measured peak fits, every k measured in the "
        "same interleaved run. `fwd` = executed stage forwards.\n\n";
  std::vector<double> ratios;
  std::vector<double> predicted_ratios;
  {
    torch::manual_seed(11);
    const int64_t batch =
        flags.resnet_batch > 0 ? flags.resnet_batch : (flags.quick ? 4 : 32);
    auto model = remat::models::resnet_chain(
        remat::models::ResNetChainOptions().stage_channels({16, 32, 64, 128}));
    auto input = torch::randn({batch, 3, 32, 32});
    md << run_e2_model(
        "ResNet-style chain (channels 16-32-64-128, 2 blocks per "
        "stage, 32x32 images, batch " +
            std::to_string(batch) + ")",
        model,
        input,
        flags,
        &ratios,
        &predicted_ratios);
  }
  {
    torch::manual_seed(12);
    const int64_t batch =
        flags.mlp_batch > 0 ? flags.mlp_batch : (flags.quick ? 64 : 256);
    const int64_t stages = 16;
    auto model = remat::models::mlp_chain(remat::models::MlpChainOptions(
        remat::models::varying_mlp_widths(stages)));
    auto input =
        torch::randn({batch, remat::models::varying_mlp_widths(stages)[0]});
    md << run_e2_model(
        "MLP of varying widths (256 ... 2048, " + std::to_string(stages) +
            " stages, batch " + std::to_string(batch) + ")",
        model,
        input,
        flags,
        &ratios,
        &predicted_ratios);
  }
  if (!ratios.empty()) {
    md << "**Summary:** geometric-mean time ratio optimal / best "
          "checkpoint_sequential over "
       << ratios.size() << " budgets: " << fixed(geomean(ratios), 3)
       << "; worst "
       << fixed(*std::max_element(ratios.begin(), ratios.end()), 3)
       << " (targets: ≤ 0.85, never above 1.02). Predicted by simulate() for "
          "the same pairs: geometric mean "
       << fixed(geomean(predicted_ratios), 3) << ", worst "
       << fixed(
              *std::max_element(
                  predicted_ratios.begin(), predicted_ratios.end()),
              3)
       << ".\n\n";
  }
  std::cout << md.str() << std::flush;
  return md.str();
}

// ---- output -----------------------------------------------------------------

std::string machine_line() {
  std::string cpu = "unknown CPU";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d", std::localtime(&now));
  std::string load = "unknown";
  std::ifstream loadavg("/proc/loadavg");
  loadavg >> load;
  std::ostringstream out;
  out << date << ", " << cpu << ", " << torch::get_num_threads()
      << " threads, LibTorch " << TORCH_VERSION
      << " (TORCH_VERSION), 1-minute load average " << load << " at the start";
  return out.str();
}

/// Replaces the section starting at `heading` (up to the next "## ") in the
/// file at `path`, or appends it.
void write_section(
    const std::string& path,
    const std::string& heading,
    const std::string& body) {
  std::string text;
  {
    std::ifstream in(path);
    std::stringstream buffer;
    buffer << in.rdbuf();
    text = buffer.str();
  }
  const std::string section = heading + "\n\n" + body;
  size_t begin = text.find(heading + "\n");
  if (begin == std::string::npos) {
    if (!text.empty() && text.back() != '\n') {
      text += "\n";
    }
    text += "\n" + section;
  } else {
    size_t end = text.find("\n## ", begin + heading.size());
    end = end == std::string::npos ? text.size() : end + 1;
    text.replace(begin, end - begin, section);
  }
  std::ofstream out(path);
  out << text;
}

// ---- E2 variants (prediction only) -----------------------------------------

/// `model` with every ConvBnRelu and LinearRelu child split into its layers
/// (Conv2d, BatchNorm2d, ReLU / Linear, ReLU, Dropout): a finer chain of the
/// same computation.
torch::nn::Sequential split_children(const torch::nn::Sequential& model) {
  torch::nn::Sequential split;
  for (const auto& child : *model) {
    if (auto conv = std::dynamic_pointer_cast<remat::models::ConvBnReluImpl>(
            child.ptr())) {
      split->push_back(conv->conv);
      split->push_back(conv->bn);
      split->push_back(torch::nn::ReLU());
    } else if (
        auto linear = std::dynamic_pointer_cast<remat::models::LinearReluImpl>(
            child.ptr())) {
      split->push_back(linear->linear);
      split->push_back(torch::nn::ReLU());
      if (!linear->dropout.is_empty()) {
        split->push_back(linear->dropout);
      }
    } else {
      split->push_back(child);
    }
  }
  return split;
}

/// Predicted time of the optimal plan over that of the fastest
/// solve_uniform(k) whose predicted peak fits, per budget of 10% ... 100% of
/// the store-all peak where both fit; and the optimal plan's predicted time
/// at 500 slots over 5000 slots.
std::string predict_variant(
    const std::string& name, torch::nn::Sequential model, torch::Tensor input) {
  const auto chain = remat::profile_chain(model, input, profile_options());
  const auto store_all =
      planner::simulate(chain, planner::solve_store_all(chain));
  const int64_t minimum = planner::min_feasible_budget_bytes(chain);
  std::vector<planner::Simulation> uniform;
  for (int64_t k = 1; k <= chain.size(); ++k) {
    uniform.push_back(
        planner::simulate(chain, planner::solve_uniform(chain, k)));
  }
  std::vector<double> ratios;
  double worst_slots = 1;
  for (int percent = 10; percent <= 100; percent += 10) {
    const int64_t budget = store_all.peak_bytes * percent / 100;
    if (budget < minimum) {
      continue;
    }
    const double optimal_ms =
        planner::simulate(chain, *planner::solve_optimal(chain, budget))
            .time_ms;
    const double fine_ms =
        planner::simulate(chain, *planner::solve_optimal(chain, budget, {5000}))
            .time_ms;
    worst_slots = std::max(worst_slots, optimal_ms / fine_ms);
    double best_uniform_ms = -1;
    for (const auto& simulation : uniform) {
      if (simulation.peak_bytes <= budget &&
          (best_uniform_ms < 0 || simulation.time_ms < best_uniform_ms)) {
        best_uniform_ms = simulation.time_ms;
      }
    }
    if (best_uniform_ms > 0) {
      ratios.push_back(optimal_ms / best_uniform_ms);
    }
  }
  std::ostringstream row;
  row << "| " << name << " | " << chain.size() << " | " << ratios.size()
      << " | ";
  if (ratios.empty()) {
    row << "— | — | ";
  } else {
    row << fixed(geomean(ratios), 3) << " | "
        << fixed(*std::max_element(ratios.begin(), ratios.end()), 3) << " | ";
  }
  row << fixed(worst_slots, 4) << " |\n";
  std::cout << row.str() << std::flush;
  return row.str();
}

std::string run_e2_variants(const Flags& flags) {
  std::ostringstream md;
  md << "Prediction only (simulate() on profiled chains, no training steps): "
        "the optimal plan against the fastest checkpoint_sequential(k) by "
        "predicted peak and time, at the budgets 10% ... 100% of store-all "
        "where both fit; `500/5000 slots` = the optimal plan's predicted time "
        "at the default 500 memory slots over 5000, worst budget.\n\n"
     << "| chain | stages | budgets | geometric mean | worst | 500/5000 "
        "slots |\n|---|---|---|---|---|---|\n";
  std::cout << md.str() << std::flush;
  const int64_t resnet_batch =
      flags.resnet_batch > 0 ? flags.resnet_batch : (flags.quick ? 4 : 32);
  const auto images = [&](int64_t side) {
    return torch::randn({resnet_batch, 3, side, side});
  };
  const auto resnet = [](int64_t blocks) {
    torch::manual_seed(11);
    return remat::models::resnet_chain(
        remat::models::ResNetChainOptions().blocks_per_stage(blocks));
  };
  md << predict_variant("ResNet (E2's)", resnet(2), images(32));
  md << predict_variant(
      "ResNet, stem split", split_children(resnet(2)), images(32));
  md << predict_variant(
      "ResNet, stem split, 3 blocks per stage",
      split_children(resnet(3)),
      images(32));
  md << predict_variant(
      "ResNet, stem split, 64x64 images",
      split_children(resnet(2)),
      images(64));
  const int64_t mlp_batch =
      flags.mlp_batch > 0 ? flags.mlp_batch : (flags.quick ? 64 : 256);
  const auto widths = remat::models::varying_mlp_widths(16);
  const auto mlp = [&](double dropout) {
    torch::manual_seed(12);
    return remat::models::mlp_chain(
        remat::models::MlpChainOptions(widths).dropout(dropout));
  };
  const auto rows = torch::randn({mlp_batch, widths[0]});
  md << predict_variant("MLP (E2's)", mlp(0), rows);
  md << predict_variant(
      "MLP, Linear and ReLU split", split_children(mlp(0)), rows);
  md << predict_variant(
      "MLP, split, dropout 0.1", split_children(mlp(0.1)), rows);
  return md.str();
}

}  // namespace

constexpr const char* kUsage =
    "usage: plan_bench [--experiment E1|E2|E2-variants|all] [--warmup N]\n"
    "                  [--steps N]\n"
    "                  [--quick] [--e1-batch N] [--resnet-batch N]\n"
    "                  [--mlp-batch N] [--write docs/benchmarks.md]\n"
    "\n"
    "Experiments E1 and E2 of bench-protocol.md (see the top of\n"
    "bench/plan_bench.cpp). 2 threads, fp32, configurations interleaved.\n"
    "  --experiment   E1, E2, E2-variants or all (default all; E2-variants,\n"
    "                 prediction only for finer and deeper E2 chains, runs\n"
    "                 only when named)\n"
    "  --warmup N     untimed steps per configuration (default 3)\n"
    "  --steps N      timed steps per configuration, medians reported\n"
    "                 (default 10)\n"
    "  --quick        small batches, 1 warm-up, 3 steps (a smoke run)\n"
    "  --e1-batch N   E1 batch (default 1024, the protocol's)\n"
    "  --resnet-batch N, --mlp-batch N\n"
    "                 E2 batches (default 32 and 256)\n"
    "  --write PATH   replace the \"## E1\" / \"## E2\" sections of PATH\n";

/// Keeps freed activation memory in the process: glibc returns large freed
/// blocks to the OS (munmap, heap trim) and every step then faults them in
/// again, which cost about 15% of a step here and most of the step-to-step
/// noise. A caching allocator (as on CUDA) behaves like this setting. The
/// measured bytes do not change: MemoryMeter counts what tensors request.
void keep_freed_memory() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 256 << 20);
#endif
}

int main(int argc, char** argv) {
  keep_freed_memory();
  remat::install_tracking_allocator();
  torch::set_num_threads(2);
  Flags flags;
  flags.command = "build/bench/plan_bench";
  std::vector<std::string> args(argv + 1, argv + argc);
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      return 0;
    }
    flags.command += " " + arg;
    auto value = [&]() -> std::string {
      if (i + 1 >= args.size()) {
        std::cerr << "plan_bench: " << arg << " needs a value\n" << kUsage;
        std::exit(2);
      }
      flags.command += " " + args[i + 1];
      return args[++i];
    };
    auto number = [&]() -> int {
      const std::string text = value();
      try {
        size_t used = 0;
        const int parsed = std::stoi(text, &used);
        if (used == text.size() && parsed >= 0) {
          return parsed;
        }
      } catch (const std::exception&) {
      }
      std::cerr << "plan_bench: " << arg
                << " expects a non-negative integer, got '" << text << "'\n";
      std::exit(2);
    };
    if (arg == "--experiment") {
      flags.experiment = value();
      if (flags.experiment != "E1" && flags.experiment != "E2" &&
          flags.experiment != "E2-variants" && flags.experiment != "all") {
        std::cerr << "plan_bench: --experiment expects E1, E2, E2-variants "
                     "or all, got '"
                  << flags.experiment << "'\n";
        return 2;
      }
    } else if (arg == "--warmup") {
      flags.warmup = number();
    } else if (arg == "--steps") {
      flags.steps = std::max(1, number());
    } else if (arg == "--quick") {
      flags.quick = true;
      flags.warmup = 1;
      flags.steps = 3;
    } else if (arg == "--e1-batch") {
      flags.e1_batch = std::max(1, number());
    } else if (arg == "--resnet-batch") {
      flags.resnet_batch = std::max(1, number());
    } else if (arg == "--mlp-batch") {
      flags.mlp_batch = std::max(1, number());
    } else if (arg == "--write") {
      flags.write_path = value();
    } else {
      std::cerr << "plan_bench: unknown argument '" << arg << "'\n" << kUsage;
      return 2;
    }
  }
  const std::string header =
      "Run " + machine_line() + ". Command: `" + flags.command + "` (warm-up " +
      std::to_string(flags.warmup) + ", timed steps " +
      std::to_string(flags.steps) + ", interleaved).\n\n";
  try {
    if (flags.experiment == "E1" || flags.experiment == "all") {
      const std::string body = header + run_e1(flags);
      if (!flags.write_path.empty()) {
        write_section(flags.write_path, "## E1", body);
      }
    }
    if (flags.experiment == "E2" || flags.experiment == "all") {
      const std::string body = header + run_e2(flags);
      if (!flags.write_path.empty()) {
        write_section(flags.write_path, "## E2", body);
      }
    }
    if (flags.experiment == "E2-variants") {
      const std::string body = "Run " + machine_line() + ". Command: `" +
                               flags.command + "`.\n\n" +
                               run_e2_variants(flags);
      if (!flags.write_path.empty()) {
        write_section(flags.write_path, "## E2 variants", body);
      }
    }
  } catch (const std::exception& error) {
    std::cerr << "plan_bench: " << error.what() << "\n";
    return 1;
  }
  return 0;
}
