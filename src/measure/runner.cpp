// runner.cpp — Runner (see runner.h for the procedure; this file follows it
// step by step).
#include "remat/measure/runner.h"

#include <algorithm>
#include <cstring>
#include <iostream>
#include <sstream>

#include "remat/measure/machine.h"
#include "remat/measure/step.h"
#include "remat/measure/timer.h"
#include "remat/memory_meter.h"

namespace remat::measure {
namespace {

bool bitwise_equal(const torch::Tensor& lhs, const torch::Tensor& rhs) {
  if (!lhs.defined() || !rhs.defined()) {
    return lhs.defined() == rhs.defined();
  }
  if (lhs.sizes() != rhs.sizes() || lhs.dtype() != rhs.dtype()) {
    return false;
  }
  const auto left = lhs.to(torch::kCPU).contiguous();
  const auto right = rhs.to(torch::kCPU).contiguous();
  // An empty tensor may have no storage: memcmp must not see its null pointer.
  return left.nbytes() == 0 ||
         std::memcmp(left.data_ptr(), right.data_ptr(), left.nbytes()) == 0;
}

double max_abs_difference(const torch::Tensor& lhs, const torch::Tensor& rhs) {
  if (!lhs.defined() || !rhs.defined() || lhs.sizes() != rhs.sizes()) {
    return lhs.defined() == rhs.defined()
               ? 0.0
               : std::numeric_limits<double>::infinity();
  }
  return (lhs - rhs).abs().max().item<double>();
}

}  // namespace

Runner::Runner(Workload workload, RunnerOptions options)
    : workload_(std::move(workload)), options_(options) {
  if (workload_.model == nullptr || !workload_.input.defined()) {
    throw std::invalid_argument(
        "remat::measure::Runner: expected a model and a defined input, got " +
        std::string(workload_.model == nullptr ? "no model" : "no input"));
  }
  options_.rounds = std::max(1, options_.rounds);
  options_.warmup = std::max(0, options_.warmup);
  if (workload_.input.device().is_cpu()) {
    remat::install_tracking_allocator();
  }
  torch::NoGradGuard no_grad;
  for (auto& parameter : workload_.model->parameters()) {
    parameter.mutable_grad() = torch::zeros_like(parameter);
  }
}

std::vector<torch::Tensor> Runner::gradients() const {
  std::vector<torch::Tensor> grads;
  for (const auto& parameter : workload_.model->parameters()) {
    grads.push_back(parameter.grad().clone());
  }
  return grads;
}

void Runner::step_into(
    const ForwardFn& forward, uint64_t seed, Measurement& into) {
  zero_gradients(workload_.model->parameters());
  workload_.input.mutable_grad() = torch::Tensor();
  if (!workload_.loss && !loss_weights_.defined()) {
    // The default loss's weights, drawn once from the gate seed.
    torch::NoGradGuard no_grad;
    torch::manual_seed(options_.seed);
    loss_weights_ = torch::randn_like(forward(workload_.input));
  }
  torch::manual_seed(seed);
  const StepMeasurement step = measure_step(workload_.input.device(), [&] {
    // The output is not held past the loss.
    const torch::Tensor output = forward(workload_.input);
    return workload_.loss ? workload_.loss(output)
                          : (output * loss_weights_).sum();
  });
  into.cpu_ms.push_back(step.cpu_ms);
  into.peak_bytes = std::max(into.peak_bytes, step.peak_delta_bytes);
  into.forward_ms.push_back(step.forward_ms);
  into.backward_ms.push_back(step.backward_ms);
  into.step_ms.push_back(step.step_ms());
}

Measurement Runner::step(const ForwardFn& forward, uint64_t seed) {
  Measurement measurement;
  step_into(forward, seed, measurement);
  return measurement;
}

RunResult Runner::run(const std::vector<Configuration>& configurations) {
  if (configurations.empty()) {
    throw std::invalid_argument(
        "remat::measure::Runner::run: expected at least one configuration, got "
        "none");
  }
  RunResult result;
  // The gradient gate (untimed: its times are dropped below).
  const bool bitwise = workload_.input.device().is_cpu();
  std::vector<torch::Tensor> reference;
  for (const Configuration& configuration : configurations) {
    Measurement measurement;
    measurement.name = configuration.name;
    step_into(configuration.forward, options_.seed, measurement);
    const auto grads = gradients();
    if (reference.empty()) {
      reference = grads;
    } else {
      for (size_t i = 0; i < grads.size(); ++i) {
        const double difference = max_abs_difference(grads[i], reference[i]);
        measurement.max_grad_diff =
            std::max(measurement.max_grad_diff, difference);
        const bool equal = bitwise ? bitwise_equal(grads[i], reference[i])
                                   : difference <= options_.cuda_tolerance;
        if (!equal) {
          std::ostringstream why;
          why << "remat::measure::Runner: the gradients of '"
              << configuration.name << "' differ from the baseline's ('"
              << configurations.front().name << "') at parameter " << i
              << ": max |difference| " << difference
              << (bitwise ? " (bitwise required on CPU)"
                          : " (above the CUDA tolerance)");
          throw GradientMismatch(why.str());
        }
      }
    }
    measurement.forward_ms.clear();
    measurement.backward_ms.clear();
    measurement.step_ms.clear();
    measurement.cpu_ms.clear();
    result.configurations.push_back(std::move(measurement));
  }
  result.load_before = read_load_average();
  // Interleaved rounds: warm-up discarded, then timed; in the adaptive mode
  // more rounds until every ratio is known well enough, or the limit.
  const int limit = std::max(options_.rounds, options_.max_rounds);
  int round = 0;
  for (;; ++round) {
    const int timed = round - options_.warmup;
    if (timed >= options_.rounds) {
      result.converged = intervals_within(result, options_);
      if (result.converged || timed >= limit) {
        break;
      }
    }
    if (options_.verbose) {
      std::cerr << "  round " << round + 1 << "/" << options_.warmup + limit
                << (round < options_.warmup ? " (warm-up)" : "") << "\n";
    }
    const uint64_t seed = options_.seed + 1 + static_cast<uint64_t>(round);
    for (size_t c = 0; c < configurations.size(); ++c) {
      Measurement& into = result.configurations[c];
      if (round < options_.warmup) {
        Measurement discarded;
        step_into(configurations[c].forward, seed, discarded);
        into.peak_bytes = std::max(into.peak_bytes, discarded.peak_bytes);
      } else {
        step_into(configurations[c].forward, seed, into);
      }
    }
  }
  result.rounds = round - options_.warmup;
  // The baseline again, alone.
  result.baseline_rerun.name = configurations.front().name + " (re-run)";
  for (int rerun = 0; rerun < result.rounds; ++rerun) {
    step_into(
        configurations.front().forward,
        options_.seed + 1 + static_cast<uint64_t>(options_.warmup + rerun),
        result.baseline_rerun);
  }
  result.load_after = read_load_average();
  return result;
}

RatioInterval Measurement::step_ratio(const Measurement& baseline) const {
  return paired_ratio(step_ms, baseline.step_ms);
}

RatioInterval Measurement::cpu_ratio(const Measurement& baseline) const {
  return paired_ratio(cpu_ms, baseline.cpu_ms);
}

bool intervals_within(const RunResult& result, const RunnerOptions& options) {
  if (options.target_half_width <= 0) {
    return true;
  }
  for (const Measurement& measurement : result.configurations) {
    const RatioInterval ratio = measurement.step_ratio(result.baseline());
    if (!ratio.has_interval ||
        ratio.relative_half_width() > options.target_half_width) {
      return false;
    }
  }
  return true;
}

std::optional<std::string> busy_machine_warning(
    const RunResult& result, int threads) {
  // The 1-minute load average counts runnable threads, this run's own
  // included: idle is below 0.5 before the run and below the run's threads
  // + 0.5 at its end.
  std::ostringstream why;
  if (result.load_before >= 0.5) {
    why << "load average " << result.load_before << " before the run";
  }
  if (result.load_after >= threads + 0.5) {
    why << (why.tellp() > 0 ? ", " : "") << "load average " << result.load_after
        << " at its end (this run's " << threads << " thread"
        << (threads == 1 ? "" : "s") << " included)";
  }
  if (why.tellp() == 0) {
    return std::nullopt;
  }
  return "the machine was not idle (" + why.str() +
         "): other work competed for the cores, and the times are less "
         "certain than their intervals say";
}

}  // namespace remat::measure
