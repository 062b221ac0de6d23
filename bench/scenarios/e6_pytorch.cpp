// e6_pytorch.cpp — scenario E6 of remat_bench: remat next to PyTorch's own
// checkpointing, measured the same way.
//
// Procedure (the PyTorch side is bench/pytorch/e6_pytorch.py, a PythonPeer):
//  1. This process builds the model (residual FFN blocks, seed 0) and the
//     input, and writes the parameters (raw little-endian float32, named as
//     the Sequential names them) and the input with a JSON manifest into a
//     work folder. The Python process builds the same modules and loads
//     them: both sides train exactly the same numbers.
//  2. Gradients, before any timing: every schedule takes one step in both
//     processes with dropout off (eval mode) and one with dropout on and the
//     same seed (both processes draw from the same CPU generator algorithm, so
//     the masks agree when both consume random numbers in the same order). The
//     Python side writes its parameter gradients; they are compared here with
//     remat's, element by element. The planned row, which PyTorch cannot
//     express, is compared with PyTorch's plain run.
//  3. Rounds: warm-up rounds, then timed rounds. In each round every schedule
//     takes one step in each process (A_remat A_torch B_remat B_torch ...),
//     the process going first alternating from round to round. Every step of
//     a round has the same seed, so each process checks its schedules'
//     gradients against its own plain run of the round: remat's must be
//     bitwise equal on CPU (GradientMismatch otherwise, as the harness's
//     gate); PyTorch's differences are reported. Then both plain runs are
//     re-run, interleaved, `rounds` times (has the machine's speed moved?).
//  4. A remat step is Runner::step (remat/measure/runner.h); the Python side
//     takes its steps the same way: gradients zeroed (allocated, not freed),
//     input gradient dropped, seed set, meter restarted, forward + loss
//     (mean(y^2)) timed, backward timed. Both processes count bytes with
//     remat's tracking CPU allocator (NOTE: [Tracking allocator] in
//     src/measure/memory_meter.cpp): the Python process loads it from
//     libremat_meter.so over the same libc10, so peaks are comparable byte
//     for byte.
// The remat side may run on a GPU (--device cuda); the PyTorch side is
// CPU-only and is then left out, with the reason in the section.
//
// This file is the scenario (flags, model, schedules, the remat side of the
// rounds); e6_pytorch_peer.cpp is the PyTorch side, e6_pytorch_report.cpp
// the section (e6_pytorch.h).
#include "e6_pytorch.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chain_plans.h"
#include "models/models.h"

namespace remat::bench::e6 {

std::vector<torch::Tensor> gradients(torch::nn::Sequential& model) {
  std::vector<torch::Tensor> grads;
  for (const auto& parameter : model->parameters()) {
    grads.push_back(parameter.grad().detach().clone());
  }
  return grads;
}

namespace {

// --quick: the smallest sizes.
E6Options sized_for(const E6Options& requested, const Context& context) {
  E6Options options = requested;
  if (context.quick) {
    options.blocks = 4;
    options.dim = 64;
    options.hidden = 256;
    options.batch = 32;
    options.segments = 2;
  }
  return options;
}

torch::Tensor per_block(
    torch::nn::Sequential& model, torch::Tensor x, remat::Mode mode) {
  for (auto& module : *model) {
    auto block = module;
    x = remat::checkpoint(
        [block](const torch::Tensor& in) mutable { return block.forward(in); },
        x,
        remat::CheckpointOptions().mode(mode));
  }
  return x;
}

Row make_row(
    std::string name,
    std::string remat_call,
    std::string pytorch_kind,
    std::string pytorch_call,
    ForwardFn forward) {
  Row row;
  row.name = std::move(name);
  row.remat_call = std::move(remat_call);
  row.pytorch_kind = std::move(pytorch_kind);
  row.pytorch_call = std::move(pytorch_call);
  row.forward = std::move(forward);
  row.remat.name = row.name;
  row.pytorch.name = row.name;
  return row;
}

// The schedules both processes run: none first (every round's reference),
// then per block and checkpoint_sequential(K), each in both modes.
std::vector<Row> shared_schedule_rows(
    const E6Options& options, torch::nn::Sequential model) {
  const std::string k = std::to_string(options.segments);
  const int64_t segments = options.segments;
  std::vector<Row> rows;
  rows.push_back(make_row(
      "none",
      "plain autograd",
      "none",
      "plain autograd",
      [model](const torch::Tensor& x) mutable { return model->forward(x); }));
  rows.push_back(make_row(
      "per-block",
      "remat::checkpoint per block",
      "per-block",
      "checkpoint(block, use_reentrant=False) per block",
      [model](const torch::Tensor& x) mutable {
        return per_block(model, x, remat::Mode::kNonReentrant);
      }));
  rows.push_back(make_row(
      "per-block-reentrant",
      "remat::checkpoint per block, Mode::kReentrant",
      "per-block-reentrant",
      "checkpoint(block, use_reentrant=True) per block",
      [model](const torch::Tensor& x) mutable {
        return per_block(model, x, remat::Mode::kReentrant);
      }));
  rows.push_back(make_row(
      "sequential(" + k + ")",
      "remat::checkpoint_sequential(" + k + ")",
      "sequential",
      "checkpoint_sequential(" + k + "), non-reentrant",
      [model, segments](const torch::Tensor& x) {
        return remat::checkpoint_sequential(model, segments, x);
      }));
  rows.push_back(make_row(
      "sequential(" + k + ")-reentrant",
      "remat::checkpoint_sequential(" + k + "), Mode::kReentrant",
      "sequential-reentrant",
      "checkpoint_sequential(" + k + "), reentrant",
      [model, segments](const torch::Tensor& x) {
        return remat::checkpoint_sequential(
            model,
            segments,
            x,
            remat::CheckpointOptions().mode(remat::Mode::kReentrant));
      }));
  return rows;
}

// The planned row (remat only): the optimal plan within --budget of the
// profiled chain's store-all peak, with that budget in `planned`.
Row planned_row(
    const E6Options& options,
    torch::nn::Sequential model,
    const torch::Tensor& input,
    PlannedBudget* planned) {
  const auto budget = remat::Budget::fraction(options.budget);
  model->train();
  const auto chain = remat::profile_chain(model, input);
  const int64_t budget_bytes = budget.resolve_bytes(chain);
  const auto plan = remat::planner::solve_optimal(chain, budget_bytes);
  TORCH_CHECK(
      plan.has_value(),
      "remat_bench E6: expected a plan within ",
      budget.to_string(),
      " (",
      budget_bytes,
      " bytes), got none; the minimum is ",
      remat::planner::min_feasible_budget_bytes(chain),
      " bytes");
  remat::PlannedSequential planned_model(model, *plan);
  const std::string percent =
      std::to_string(std::lround(options.budget * 100)) + "%";
  planned->budget_bytes = budget_bytes;
  planned->input_bytes = chain.input_bytes();
  return make_row(
      "planned(" + percent + ")",
      "remat::PlannedSequential, the optimal plan within " + budget.to_string(),
      "",
      "no counterpart (its gradients are compared with PyTorch's plain run)",
      [planned_model](const torch::Tensor& x) mutable {
        return planned_model->forward(x);
      });
}

std::vector<Row> make_rows(
    const E6Options& options,
    torch::nn::Sequential model,
    const torch::Tensor& input,
    PlannedBudget* planned) {
  std::vector<Row> rows = shared_schedule_rows(options, model);
  if (options.budget > 0) {
    rows.push_back(planned_row(options, model, input, planned));
  }
  return rows;
}

/// One round of step 3: its index, its seed (every step of the round takes
/// it) and whether it is timed.
struct Round {
  int index = 0;
  uint64_t seed = 0;
  bool timed = false;
};

// The remat side's gradients of `row` against the round's reference (the
// plain run's): the largest difference goes into the row; on the CPU any
// difference is a GradientMismatch.
void check_against_reference(
    Row& row,
    const std::vector<torch::Tensor>& grads,
    const std::vector<torch::Tensor>& reference_grads,
    const Round& round,
    const torch::Device& device) {
  for (size_t p = 0; p < grads.size(); ++p) {
    const double diff =
        (grads[p] - reference_grads[p]).abs().max().item<double>();
    row.remat.max_grad_diff = std::max(row.remat.max_grad_diff, diff);
    if (device.is_cpu() && diff != 0) {
      throw GradientMismatch(
          "remat_bench E6: " + row.name +
          " computed other gradients "
          "than none in round " +
          std::to_string(round.index) + " (parameter " + std::to_string(p) +
          ", max |diff| " + format_difference(diff) + ")");
    }
  }
}

// The interleaved rounds of both processes (step 3 of the procedure).
class Rounds {
 public:
  Rounds(
      std::vector<Row>& rows,
      Runner& runner,
      torch::nn::Sequential& model,
      PytorchSide& pytorch,
      const E6Options& options,
      const torch::Device& device)
      : rows_(rows),
        runner_(runner),
        model_(model),
        pytorch_(pytorch),
        options_(options),
        device_(device) {}

  // Every row once in each process per round, the process going first
  // alternating from round to round.
  void run(const Context& context) {
    const uint64_t first_seed = context.runner_options().seed;
    for (int index = 0; index < context.warmup + context.rounds; ++index) {
      const Round round{
          index,
          first_seed + 1 + static_cast<uint64_t>(index),
          index >= context.warmup};
      for (size_t row_index = 0; row_index < rows_.size(); ++row_index) {
        if (index % 2 == 0) {
          remat_round_step(row_index, round);
          pytorch_round_step(row_index, round);
        } else {
          pytorch_round_step(row_index, round);
          remat_round_step(row_index, round);
        }
      }
    }
  }

  // Both plain runs once more, interleaved, `rounds` times.
  BaselineRerun rerun_baselines(const Context& context) {
    const uint64_t first_seed = context.runner_options().seed;
    Row& none = rows_.front();
    BaselineRerun rerun;
    Row pytorch_rerun = none;
    pytorch_rerun.pytorch = Measurement{};
    for (int round = 0; round < context.rounds; ++round) {
      const uint64_t seed = first_seed + 1000 + static_cast<uint64_t>(round);
      append(rerun.remat, runner_.step(none.forward, seed));
      if (pytorch_.up()) {
        std::string why;
        if (!pytorch_step(
                *pytorch_.peer,
                pytorch_rerun,
                options_,
                seed,
                /*reference=*/false,
                /*timed=*/true,
                &why)) {
          pytorch_.unavailable = "during the baseline re-run: " + why;
        }
      }
    }
    rerun.pytorch = std::move(pytorch_rerun.pytorch);
    return rerun;
  }

 private:
  // Row 0 (none) sets the round's reference gradients.
  void remat_round_step(size_t index, const Round& round) {
    Row& row = rows_[index];
    const Measurement step = runner_.step(row.forward, round.seed);
    if (index == 0) {
      reference_grads_ = gradients(model_);
    } else {
      check_against_reference(
          row, gradients(model_), reference_grads_, round, device_);
    }
    if (round.timed) {
      append(row.remat, step);
    }
  }

  void pytorch_round_step(size_t index, const Round& round) {
    Row& row = rows_[index];
    if (pytorch_.up() && !row.pytorch_kind.empty() &&
        !pytorch_step(
            *pytorch_.peer,
            row,
            options_,
            round.seed,
            index == 0,
            round.timed,
            &pytorch_.unavailable)) {
      pytorch_.unavailable = "during the rounds: " + pytorch_.unavailable;
    }
  }

  std::vector<Row>& rows_;
  Runner& runner_;
  torch::nn::Sequential& model_;
  PytorchSide& pytorch_;
  const E6Options& options_;
  const torch::Device device_;
  std::vector<torch::Tensor> reference_grads_;
};

// The residual FFN stack (seed 0), in training mode on `device`.
torch::nn::Sequential build_model(
    const E6Options& options, const torch::Device& device) {
  torch::manual_seed(0);
  auto model =
      remat::models::residual_ffn_stack(remat::models::ResidualFfnStackOptions()
                                            .blocks(options.blocks)
                                            .dim(options.dim)
                                            .hidden(options.hidden)
                                            .dropout(options.dropout));
  model->to(device);
  model->train();
  return model;
}

int64_t parameter_elements(torch::nn::Sequential& model) {
  int64_t elements = 0;
  for (const auto& parameter : model->parameters()) {
    elements += parameter.numel();
  }
  return elements;
}

Section run_e6(const E6Options& requested, const Context& context) {
  const E6Options options = sized_for(requested, context);
  const torch::Device device = context.torch_device();
  Section section;
  section.scenario = "E6";
  section.title = "E6 — remat next to PyTorch's own checkpointing";
  section.add_text(preamble(options, context));

  auto model = build_model(options, device);
  // Reentrant checkpointing reaches the parameters only through an input
  // that requires grad, so every schedule gets such an input (drawn right
  // after the model, under its seed).
  auto input = torch::randn({options.batch, options.dim})
                   .to(device)
                   .requires_grad_(true);
  Workload workload;
  workload.model = model.ptr().get();
  workload.input = input;
  workload.loss = [](const torch::Tensor& output) {
    return output.pow(2).mean();
  };
  Runner runner(workload, context.runner_options());
  PlannedBudget planned;
  auto rows = make_rows(options, model, input, &planned);

  Workdir workdir(options.workdir);  // outlives the Python process
  PytorchSide pytorch =
      start_pytorch_side(options, context, device, workdir, model, input);
  compare_gradients_with_pytorch(
      rows, runner, model, pytorch, workdir, options);
  Rounds rounds(rows, runner, model, pytorch, options, device);
  rounds.run(context);
  const BaselineRerun rerun = rounds.rerun_baselines(context);

  section.add_text(pytorch_side_text(pytorch, options));
  add_results(
      section,
      rows,
      rerun,
      planned,
      pytorch.up(),
      parameter_elements(model),
      options);
  return section;
}

ScenarioRun setup_e6(CLI::App& command) {
  auto options = std::make_shared<E6Options>();
  command.add_option("--blocks", options->blocks, "residual FFN blocks")
      ->capture_default_str();
  command.add_option("--dim", options->dim, "model width")
      ->capture_default_str();
  command.add_option("--hidden", options->hidden, "feed-forward width")
      ->capture_default_str();
  command.add_option("--batch", options->batch, "input rows")
      ->capture_default_str();
  command.add_option("--dropout", options->dropout, "dropout probability")
      ->capture_default_str();
  command
      .add_option(
          "--segments", options->segments, "K of the sequential(K) schedules")
      ->capture_default_str();
  command
      .add_option(
          "--budget",
          options->budget,
          "budget of the planned row, a fraction of the store-all peak (0: "
          "no planned row)")
      ->capture_default_str();
  command.add_flag(
      "--no-pytorch", options->no_pytorch, "measure the remat side only");
  command
      .add_option(
          "--python", options->python, "the interpreter of the PyTorch side")
      ->capture_default_str();
  command.add_option("--script", options->script, "e6_pytorch.py")
      ->capture_default_str();
  command.add_option("--meter", options->meter, "libremat_meter.so")
      ->capture_default_str();
  command.add_option(
      "--workdir",
      options->workdir,
      "folder for the exchanged files (default: a fresh one, removed)");
  return
      [options](const Context& context) { return run_e6(*options, context); };
}

const bool kRegistered = register_scenario(
    {"E6",
     "remat next to PyTorch's torch.utils.checkpoint: same model, weights, "
     "schedules, memory meter",
     60,
     setup_e6});

}  // namespace
}  // namespace remat::bench::e6
