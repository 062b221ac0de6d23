// remat/fit.h: the largest batch, or the largest size of any other kind (a
// sequence length), that trains under a memory cap, with no checkpointing,
// with the best checkpoint_sequential, and with the optimal plan.
//
// fit_batch() and fit_size() answer the question the other way round from
// auto_checkpoint: not "how little memory for this batch" but "how large a
// batch (a length, a size) fits in this memory". They profile the chain at a
// few sizes and model every cost of every stage as a polynomial in the size
// through those profiles (affine for a batch; quadratic for a sequence
// length, whose attention scores grow with its square), search the largest
// size each strategy fits under the cap on that model, then check the
// answer: the chain is profiled again at the answer (a prediction that no
// longer fits moves the answer down; one that fits is tried one size up),
// and one training step at that size, run by PlannedChain under the plan, is
// measured (a measured peak over the cap moves it down again). So every
// answer returned was seen to fit. Under a time limit, answers are chosen on
// predicted times and then timed against no checkpointing's in paired
// rounds. How: docs/planned_execution.md. fit_size() also takes a graph of
// stages (remat/graph.h, a U-Net): the same search with the graph's
// strategies (no checkpointing, every stage checkpointed, the optimal graph
// plan), each step run by PlannedGraph.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <torch/arg.h>
#include <torch/types.h>

#include "remat/graph.h"
#include "remat/measure/statistics.h"
#include "remat/planner/plan.h"
#include "remat/profile.h"
#include "remat/stage.h"

namespace remat {

/// Options of fit_batch().
///
/// A ProfileOptions::selective_policy in `profile` is carried through: the
/// modelled chains keep every stage's selective costs (StageCost::selective),
/// so the optimal plan may run stages selectively, and the measured step runs
/// them under that policy.
struct FitOptions {
  /// The smallest batch considered, and the first profiled one (the other
  /// is twice it, or max_batch where that is smaller: fit_profile_sizes()).
  /// Default: 4.
  TORCH_ARG(int64_t, probe_batch) = 4;
  /// The largest batch considered. Default: 4096.
  TORCH_ARG(int64_t, max_batch) = 4096;
  /// How each stage is profiled. Default: one warm-up run, one timed run.
  TORCH_ARG(ProfileOptions, profile) = ProfileOptions().warmup(1).repeats(1);
  /// The largest time per sample a checkpointing strategy may take, as a
  /// multiple of no checkpointing's at its own answer (e.g. 1.3: at most
  /// 30 % slower per sample), as predicted: simulate()'s time of the plan on
  /// the chain profiled at that batch (FitAnswer::predicted_time_ratio). A
  /// strategy over the limit at its largest fitting batch gets the largest
  /// batch between no checkpointing's answer and that one within it (0 if
  /// none is). The optimal strategy's answer is never smaller than
  /// checkpoint_sequential's. Then the answers are timed against no
  /// checkpointing's in 10 interleaved rounds after 3 untimed ones
  /// (FitAnswer::measured_time_ratio, with its interval: whether the
  /// measured time confirms the limit). 0: no limit, the largest batch that
  /// fits whatever it costs (each answer's time is then one step's).
  /// Without a fitting no-checkpointing answer there is no reference and no
  /// limit. Default: 0.
  TORCH_ARG(double, max_time_ratio) = 0;
  /// The loss of the measured step, from the chain output. Default: the sum
  /// of the output (in fp32). A loss that is not a scalar requiring grad is
  /// refused by the first measured step with std::invalid_argument (as
  /// measure::measure_step), naming what it returned.
  TORCH_ARG(std::function<torch::Tensor(const torch::Tensor&)>, loss) = {};
};

/// The largest size one strategy trains under the cap.
struct FitAnswer {
  /// "none", "checkpoint_sequential", "optimal"; for a graph "none",
  /// "per-block", "optimal".
  std::string strategy;
  /// The size fitted: the batch for fit_batch(), make_problem's argument for
  /// fit_size(). 0: not even the smallest size considered fits.
  int64_t size = 0;
  /// The first dimension of the input at that size (fit_batch(): = size;
  /// fit_size() over a sequence length: the fixed batch). 0 if size is 0.
  int64_t batch = 0;
  int64_t segments = 0;  ///< checkpoint_sequential: its segment count
  planner::Plan plan;    ///< the plan at that size
  int64_t predicted_peak_bytes = 0;  ///< simulate() on the chain profiled there
  double predicted_step_ms = 0;      ///< simulate()'s time there
  int64_t measured_peak_bytes = 0;   ///< the measured step's activation peak
                                     ///< plus the input's bytes
  /// The measured step's time (with a time limit: the median of the timed
  /// rounds).
  double measured_step_ms = 0;
  /// With a time limit: the plan's predicted time per unit of size
  /// (FitSizeOptions::units_of_size) over no checkpointing's at its answer,
  /// the figure the limit was applied to;
  /// 0 otherwise.
  double predicted_time_ratio = 0;
  /// With a time limit: the measured time per unit of size over no
  /// checkpointing's at its answer, paired by round (both run in each of
  /// the 10 timed rounds), with its 95 % interval. rounds == 0 where not
  /// measured: no limit, size 0, or no checkpointing's own answer.
  measure::RatioInterval measured_time_ratio;
  /// Measured time per sample: measured_step_ms / batch (0 if batch is 0).
  double ms_per_sample() const {
    return batch > 0 ? measured_step_ms / static_cast<double>(batch) : 0;
  }
};

/// For each strategy (no checkpointing, the fastest checkpoint_sequential(k)
/// that fits, the optimal plan), the largest batch in [probe_batch,
/// max_batch] whose training step stays under `cap_bytes` (activations plus
/// the input, the planner's units), measured. `make_input(b)` makes an input
/// of batch size b (the same kind of input every time; random values are
/// fine). Costs are modelled as affine in the batch, through profiles at
/// probe_batch and twice it (never above max_batch: fit_profile_sizes()).
/// Answers come in that order; each was verified by a measured step;
/// FitAnswer::size and FitAnswer::batch are both the batch.
///
/// Example:
// clang-format off
///   auto answers = remat::fit_batch(
///       [](int64_t b) { return torch::randn({b, 512}); }, stages, 256LL << 20);
///   for (const auto& a : answers) std::cout << a.strategy << ": " << a.batch << "\n";
// clang-format on
///
/// Throws c10::Error if cap_bytes <= 0, max_time_ratio < 0, probe_batch < 1,
/// max_batch < probe_batch or above 2^60, `make_input` is empty or makes an
/// input whose first dimension is not the batch asked for, and as
/// profile_chain.
std::vector<FitAnswer> fit_batch(
    const std::function<torch::Tensor(int64_t)>& make_input,
    const std::vector<Stage>& stages,
    int64_t cap_bytes,
    const FitOptions& options = {});

/// How the costs of a chain grow with the size fit_size() searches over.
///
/// The profiles are taken at the sizes fit_profile_sizes() gives, all in
/// [probe_size, max_size].
enum class SizeModel {
  /// Every cost affine in the size, through profiles at probe_size and
  /// 2 probe_size (a batch: what fit_batch() uses).
  kAffine,
  /// Every cost quadratic in the size, through profiles at probe_size,
  /// 2 probe_size and 4 probe_size (a sequence length: attention scores and
  /// probabilities grow with its square, the rest with it).
  kQuadratic,
};

/// One size of the problem fit_size() searches: the chain's stages at that
/// size and an input of that size (what make_problem returns).
struct FitProblem {
  std::vector<Stage> stages;
  torch::Tensor input;
};

/// Options of fit_size().
///
/// A ProfileOptions::selective_policy in `profile` is carried through, as in
/// FitOptions.
struct FitSizeOptions {
  /// The smallest size considered, and the first profiled one (the others
  /// are 2 and, for SizeModel::kQuadratic, 4 times it, or spread over
  /// [probe_size, max_size] where those are above max_size:
  /// fit_profile_sizes()). Default: 16.
  TORCH_ARG(int64_t, probe_size) = 16;
  /// The largest size considered; no problem larger is made or profiled.
  /// Default: 4096.
  TORCH_ARG(int64_t, max_size) = 4096;
  /// How costs grow with the size. Default: SizeModel::kQuadratic.
  TORCH_ARG(SizeModel, size_model) = SizeModel::kQuadratic;
  /// How each stage is profiled. Default: one warm-up run, one timed run.
  TORCH_ARG(ProfileOptions, profile) = ProfileOptions().warmup(1).repeats(1);
  /// The largest time per unit of size (units_of_size) a checkpointing
  /// strategy may take, as a multiple of no checkpointing's at its own
  /// answer, predicted and then timed as FitOptions::max_time_ratio. 0: no
  /// limit. Default: 0.
  TORCH_ARG(double, max_time_ratio) = 0;
  /// How much work size n stands for: the time limit compares step time
  /// divided by units_of_size(n). A batch or a sequence length is its own
  /// count (samples, positions); the edge n of a 2D image is n² pixels, of a
  /// 3D volume n³ voxels, so that a larger image is not judged slower per
  /// unit only for holding more pixels. Must return a positive finite
  /// number (else c10::Error naming the size and the value). Default: empty,
  /// n itself.
  TORCH_ARG(std::function<double(int64_t)>, units_of_size) = {};
  /// The loss of the measured step, from the chain output. Default: the sum
  /// of the output (in fp32). A loss that is not a scalar requiring grad is
  /// refused by the first measured step with std::invalid_argument (as
  /// measure::measure_step), naming what it returned.
  TORCH_ARG(std::function<torch::Tensor(const torch::Tensor&)>, loss) = {};
};

/// The sizes fit_size() (and fit_batch(), with SizeModel::kAffine) profiles
/// to model the costs, in increasing order, all in [probe_size, max_size]:
/// probe_size, 2 probe_size and, for SizeModel::kQuadratic, 4 probe_size
/// where the largest of them is at most max_size; else as many sizes as the
/// model needs spread evenly over [probe_size, max_size] (probe_size, the
/// midpoint rounded down, max_size); where the range holds fewer sizes than
/// that, every size in it (a model of lower degree, exact on the whole
/// range).
///
/// Example:
// clang-format off
///   remat::fit_profile_sizes(remat::FitSizeOptions().probe_size(16).max_size(512));  // {16, 32, 64}
///   remat::fit_profile_sizes(remat::FitSizeOptions().probe_size(16).max_size(32));   // {16, 24, 32}
///   remat::fit_profile_sizes(remat::FitSizeOptions().probe_size(16).max_size(17));   // {16, 17}
// clang-format on
///
/// Throws c10::Error if probe_size < 1 or max_size < probe_size.
std::vector<int64_t> fit_profile_sizes(const FitSizeOptions& options);

/// For each strategy (no checkpointing, the fastest checkpoint_sequential(k)
/// that fits, the optimal plan), the largest size n in [probe_size,
/// max_size] whose training step stays under `cap_bytes` (activations plus
/// the input, the planner's units), measured. `make_problem(n)` returns the
/// chain at size n and an input of that size; the size is whatever the
/// caller makes it: a sequence length (the stages close over a mask of that
/// length), an image side, a batch. The memory each strategy needs must grow
/// with n; make_problem is called with sizes in [probe_size, max_size]
/// only. Answers come in that order; each was verified by a measured step.
///
/// Example (the built-in GPT of remat_models, over the sequence length):
// clang-format off
///   auto answers = remat::fit_size(
///       [&](int64_t len) {
///         return remat::FitProblem{
///             models::gpt_stages(model, models::causal_mask(len)),
///             torch::randint(vocab, {batch, len})};
///       },
///       256LL << 20, remat::FitSizeOptions().max_size(1024));
// clang-format on
///
/// Throws c10::Error if cap_bytes <= 0, max_time_ratio < 0, probe_size < 1,
/// max_size < probe_size or above 2^60, units_of_size is given and not
/// positive and finite at probe_size or max_size, `make_problem` is empty or
/// returns no stages or an undefined input, and as profile_chain.
std::vector<FitAnswer> fit_size(
    const std::function<FitProblem(int64_t)>& make_problem,
    int64_t cap_bytes,
    const FitSizeOptions& options = {});

/// One size of a graph problem fit_size() searches: the graph's stages at
/// that size and an input of that size.
struct GraphFitProblem {
  std::vector<GraphStage> stages;
  torch::Tensor input;
};

/// fit_size() on a graph of stages (remat/graph.h): for each strategy (no
/// checkpointing; "per-block", every stage checkpointed as
/// planner::schedule_graph with StageMode::kCheckpoint on every stage
/// schedules it; the optimal graph plan, planner::solve_optimal at the cap),
/// the largest size n in [probe_size, max_size] whose training step, run by
/// PlannedGraph, stays under `cap_bytes` (activations plus the input),
/// measured. The same model, search and checks as for a chain; a size must
/// keep the graph's structure (each stage's inputs). Answers come in that
/// order; each was verified by a measured step. Graphs have no selective
/// costs here (ProfileOptions::selective_policy is not used).
///
/// Example (a U-Net over its image edge, in multiples of 2^levels):
// clang-format off
///   auto answers = remat::fit_size(
///       [&](int64_t k) {
///         return remat::GraphFitProblem{unet->stages(),
///                                       torch::randn({4, 1, 8 * k, 8 * k})};
///       },
///       64LL << 20,
///       remat::FitSizeOptions().probe_size(1).max_size(64)
///           .max_time_ratio(1.35)  // per pixel: (8k)² pixels at edge 8k
///           .units_of_size([](int64_t k) { return 64.0 * k * k; }));
// clang-format on
///
/// Throws c10::Error as the chain's fit_size(), and as profile_graph.
std::vector<FitAnswer> fit_size(
    const std::function<GraphFitProblem(int64_t)>& make_problem,
    int64_t cap_bytes,
    const FitSizeOptions& options = {});

}  // namespace remat
