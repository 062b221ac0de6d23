// e8_dynamic.cpp — scenario E8 of remat_bench: dynamic rematerialization
// (remat::DynamicRemat, no stages and no plan) against the optimal static
// plan at the same budget, and on a GPT whose sequence length varies from
// batch to batch against a plan made for each length.
//
// Procedure, per model (E2's ResNet and MLP chains, the GPT of E2-selective
// at E8's sizes, the 2D U-Net of E7 at a smaller size):
//  1. Profile (a chain with profile_for_planning; the U-Net as a graph cut
//     one stage per convolution round). A budget "P%" is
//     Budget::parse("P%") resolved on that profile: P % of the predicted
//     store-all peak in simulate()'s units (activations plus the input).
//  2. Sides, each one step per round: none (the plain model), per budget
//     the optimal plan (plan_within; PlannedSequential or PlannedGraph) and
//     dynamic (the plain model in a DynamicRemat scope of budget_bytes = the
//     budget less the input's bytes, the input being outside the scope's
//     count), and on the MLP and the GPT dynamic at 1 TiB (nothing is ever
//     evicted: the cost of the bookkeeping alone).
//  3. A scope is opened before Runner::step and closed after it: forward,
//     loss and backward all run inside it. Its stats are read per step:
//     tracked_peak_bytes against budget_bytes, evictions, re-runs.
//  4. Rounds: one gate round, warm-up rounds, timed rounds; every step of a
//     round has one seed and its gradients are compared bitwise (CPU) with
//     none's of the round (GradientMismatch otherwise). Ratios are paired by
//     round.
//  5. Varying lengths: every round draws one length (a multiple of 16 in
//     [seq/4, seq], fixed seed), the same for every side. The byte budget
//     is 50 % of the longest length's store-all peak; the plan-per-shape
//     side profiles and plans each distinct length once, before the rounds,
//     within that byte budget (its time is reported apart).
//
// Not measured here: GPUs (CPU only), a budget below 50 %.
#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "chain_plans.h"
#include "harness/scenario.h"
#include "models/gpt.h"
#include "models/models.h"
#include "remat/measure/timer.h"
#include "remat/remat.h"

namespace remat::bench {
namespace {

struct E8Options {
  E2Sizes e2;
  int64_t gpt_layers = 4;
  int64_t gpt_hidden = 256;
  int64_t gpt_heads = 4;
  int64_t gpt_seq = 128;
  int64_t gpt_batch = 8;
  int64_t unet_size = 64;  // 2D images: size x size
  int64_t unet_batch = 4;
  std::vector<int64_t> percents = {50, 70};  // of the store-all peak
};

// What the scopes of one side did over its steps.
struct ScopeTally {
  int64_t steps = 0;       // steps taken in a scope (gate and warm-up too)
  int64_t steps_over = 0;  // steps whose tracked peak exceeded budget_bytes
  int64_t tracked_peak_bytes = 0;  // the highest over the steps
  int64_t timed_steps = 0;
  int64_t evictions = 0;  // over the timed steps
  int64_t rematerializations = 0;
};

// One way to take a step.
struct Side {
  std::string name;
  ForwardFn forward;
  int64_t budget_bytes = 0;        // the budget it is held to; 0: none
  int64_t scope_budget_bytes = 0;  // a DynamicRemat scope's; 0: no scope
  Measurement measured;
  ScopeTally scope;
};

Side make_side(
    std::string name,
    ForwardFn forward,
    int64_t budget_bytes = 0,
    int64_t scope_budget_bytes = 0) {
  Side side;
  side.name = std::move(name);
  side.forward = std::move(forward);
  side.budget_bytes = budget_bytes;
  side.scope_budget_bytes = scope_budget_bytes;
  return side;
}

// A DynamicRemat side: the scope gets the budget less the input's bytes.
Side dynamic_side(
    std::string name,
    ForwardFn forward,
    int64_t budget_bytes,
    int64_t input_bytes) {
  return make_side(
      std::move(name),
      std::move(forward),
      budget_bytes,
      budget_bytes - input_bytes);
}

// One step of `side` (in its scope, if it has one).
Measurement take_step(Runner& runner, Side& side, uint64_t seed, bool timed) {
  if (side.scope_budget_bytes == 0) {
    return runner.step(side.forward, seed);
  }
  DynamicRemat scope(
      DynamicRematOptions().budget_bytes(side.scope_budget_bytes));
  Measurement step = runner.step(side.forward, seed);
  const DynamicRematStats stats = scope.stats();
  ScopeTally& tally = side.scope;
  tally.steps += 1;
  tally.steps_over += stats.tracked_peak_bytes > side.scope_budget_bytes;
  tally.tracked_peak_bytes =
      std::max(tally.tracked_peak_bytes, stats.tracked_peak_bytes);
  if (timed) {
    tally.timed_steps += 1;
    tally.evictions += stats.evictions;
    tally.rematerializations += stats.rematerializations;
  }
  return step;
}

// The gate round, warm-up and timed rounds of every side (the top, step 4);
// `before_round(index)` runs before each (index -1: the gate).
void run_rounds(
    std::vector<Side>& sides,
    Runner& runner,
    torch::nn::Module& model,
    const Context& context,
    const std::function<void(int)>& before_round = {}) {
  const uint64_t first_seed = context.runner_options().seed;
  const bool bitwise = context.torch_device().is_cpu();
  for (int index = -1; index < context.warmup + context.rounds; ++index) {
    if (before_round) {
      before_round(index);
    }
    const bool timed = index >= context.warmup;
    const uint64_t seed = first_seed + 1 + static_cast<uint64_t>(index + 1);
    std::vector<torch::Tensor> reference;
    for (size_t s = 0; s < sides.size(); ++s) {
      Side& side = sides[s];
      const Measurement step = take_step(runner, side, seed, timed);
      if (s == 0) {
        reference = gradients(model);
      } else {
        check_gradients(
            "E8",
            side.name,
            gradients(model),
            reference,
            bitwise,
            side.measured);
      }
      if (timed) {
        append(side.measured, step);
      } else {
        side.measured.peak_bytes =
            std::max(side.measured.peak_bytes, step.peak_bytes);
      }
    }
  }
}

std::string percent_name(int64_t percent) {
  return std::to_string(percent) + "%";
}

// ------------------------------------------------------------- targets

// The rows the targets are judged on, gathered over the models.
struct Verdicts {
  int64_t scoped_steps = 0;
  int64_t steps_over = 0;
  std::vector<std::pair<std::string, RatioInterval>> dynamic_vs_none_50;
  std::vector<std::pair<std::string, RatioInterval>> dynamic_vs_optimal;
  std::vector<std::pair<std::string, RatioInterval>> bookkeeping;

  double highest_tracked_ratio = 0;  // tracked peak / budget_bytes

  void count(const Side& side) {
    scoped_steps += side.scope.steps;
    steps_over += side.scope.steps_over;
    if (side.scope_budget_bytes > 0) {
      highest_tracked_ratio = std::max(
          highest_tracked_ratio,
          double(side.scope.tracked_peak_bytes) /
              double(side.scope_budget_bytes));
    }
  }
};

// Met when every interval lies at or below `limit`, missed when one lies
// wholly above it, undecided otherwise (an interval contains the limit).
std::string judged(
    const std::string& target,
    double limit,
    const std::vector<std::pair<std::string, RatioInterval>>& rows) {
  int64_t medians_within = 0;
  bool all_below = true;
  bool one_above = false;
  for (const auto& [name, ratio] : rows) {
    medians_within += ratio.median <= limit;
    all_below = all_below && ratio.high <= limit;
    one_above = one_above || ratio.low > limit;
  }
  std::ostringstream text;
  text << "- " << target << ": "
       << (one_above   ? "**missed**"
           : all_below ? "**met**"
                       : "**undecided**, an interval contains the target")
       << " (" << medians_within << " of " << rows.size() << " medians within;";
  for (const auto& [name, ratio] : rows) {
    text << " " << name << " " << Cell::ratio_interval(ratio).markdown() << ";";
  }
  text.seekp(-1, std::ios_base::cur);
  text << ").";
  return text.str();
}

std::string targets_text(const Verdicts& verdicts) {
  std::ostringstream text;
  text << "**Targets.**\n\n- Tracked peak ≤ budget_bytes on every step: "
       << (verdicts.steps_over == 0 ? "**met**" : "**missed**") << " ("
       << verdicts.steps_over << " of " << verdicts.scoped_steps
       << " scoped steps over, gate and warm-up steps included; the highest "
          "tracked peak / budget_bytes of a side "
       << Cell::ratio(verdicts.highest_tracked_ratio).markdown() << ").\n"
       << judged(
              "Dynamic ≤ 1.25× none at 50 %", 1.25, verdicts.dynamic_vs_none_50)
       << "\n"
       << judged(
              "Dynamic / optimal ≤ 1.15 on the chains",
              1.15,
              verdicts.dynamic_vs_optimal)
       << "\n"
       << judged(
              "Bookkeeping (nothing evicted) ≤ 1.03× none",
              1.03,
              verdicts.bookkeeping);
  return text.str();
}

// ------------------------------------------------------------- models

// A model with its static planner: how a budget resolves on its profile and
// the forward of the optimal plan within it.
struct Subject {
  std::string id;  // table names: "mlp", "resnet", "gpt", "unet"
  std::string description;
  std::shared_ptr<torch::nn::Module> model;
  torch::Tensor input;
  LossFn loss;  // empty: the Runner's default
  int64_t input_bytes = 0;
  ForwardFn plain;
  std::function<int64_t(const Budget&)> resolve_bytes;
  std::function<ForwardFn(const Budget&)> optimal;
  int64_t minimum_bytes = 0;  // the least budget a static plan fits
  bool bookkeeping = false;   // also a scope that evicts nothing
};

Subject chain_subject(
    std::string id,
    std::string description,
    torch::nn::Sequential model,
    const torch::Tensor& input,
    LossFn loss = {}) {
  const auto chain =
      std::make_shared<planner::Chain>(profile_for_planning(model, input));
  Subject subject;
  subject.id = std::move(id);
  subject.description = std::move(description);
  subject.model = model.ptr();
  subject.input = input;
  subject.loss = std::move(loss);
  subject.input_bytes = chain->input_bytes();
  subject.minimum_bytes = planner::min_feasible_budget_bytes(*chain);
  subject.plain = [model](const torch::Tensor& x) mutable {
    return model->forward(x);
  };
  subject.resolve_bytes = [chain](const Budget& budget) {
    return budget.resolve_bytes(*chain);
  };
  subject.optimal = [chain, model](const Budget& budget) -> ForwardFn {
    PlannedSequential planned(model, plan_within(*chain, budget));
    return [planned](const torch::Tensor& x) mutable {
      return planned->forward(x);
    };
  };
  return subject;
}

models::GptOptions gpt_options(const E8Options& options, bool quick) {
  return models::GptOptions()
      .layers(quick ? 2 : options.gpt_layers)
      .hidden(quick ? 64 : options.gpt_hidden)
      .heads(quick ? 2 : options.gpt_heads)
      .seq_len(quick ? 32 : options.gpt_seq)
      .dropout(0.1);
}

// The GPT (seed 13, as E2-selective's), full-length tokens and targets.
struct GptRun {
  models::GptOptions gpt;
  int64_t batch = 0;
  torch::nn::Sequential model;
  torch::Tensor tokens;
  torch::Tensor targets;
};

GptRun build_gpt(const E8Options& options, const Context& context) {
  GptRun run;
  run.gpt = gpt_options(options, context.quick);
  run.batch = context.quick ? 2 : options.gpt_batch;
  torch::manual_seed(13);
  run.model = models::gpt(run.gpt);
  run.model->train();
  const std::vector<int64_t> shape{run.batch, run.gpt.seq_len()};
  run.tokens = torch::randint(run.gpt.vocab(), shape, torch::kLong);
  run.targets = torch::randint(run.gpt.vocab(), shape, torch::kLong);
  return run;
}

// Next-token loss against the targets' first positions (as many as the
// logits have).
LossFn gpt_loss_of(torch::Tensor targets) {
  return [targets](const torch::Tensor& logits) {
    return models::gpt_loss(logits, targets.narrow(1, 0, logits.size(1)));
  };
}

std::string gpt_text(const GptRun& run) {
  std::ostringstream text;
  text << "GPT (" << run.gpt.layers() << " layers, hidden " << run.gpt.hidden()
       << ", " << run.gpt.heads() << " heads, sequence " << run.gpt.seq_len()
       << ", batch " << run.batch << ", dropout " << run.gpt.dropout() << ")";
  return text.str();
}

// The 2D U-Net of E7 (seed 0, BatchNorm, 3 levels, base width 8) on
// phantoms (seed 1): none and dynamic run its blocks (run_graph), the
// optimal plans its convolution rounds (E7's default cut).
Subject unet_subject(const E8Options& options, const Context& context) {
  const int64_t size = context.quick ? 32 : options.unet_size;
  const int64_t batch = context.quick ? 2 : options.unet_batch;
  torch::manual_seed(0);
  models::UNet net(models::UNetOptions().dims(2).levels(3).base_width(8));
  net->train();
  const auto data = models::phantom_batch(batch, {size, size}, 1);
  const auto blocks = net->stages(models::UNetStageSplit::kBlock);
  const auto rounds = net->stages(models::UNetStageSplit::kConvolution);
  const auto graph =
      std::make_shared<planner::Graph>(profile_graph(rounds, data.images));
  Subject subject;
  subject.id = "unet";
  subject.description = "2D U-Net (3 levels, base width 8, BatchNorm), " +
                        std::to_string(size) + "×" + std::to_string(size) +
                        " phantoms, batch " + std::to_string(batch);
  subject.model = net.ptr();
  subject.input = data.images;
  subject.input_bytes = static_cast<int64_t>(data.images.nbytes());
  subject.minimum_bytes = planner::min_feasible_budget_bytes(*graph);
  subject.plain = [blocks](const torch::Tensor& x) {
    return run_graph(blocks, x);
  };
  subject.resolve_bytes = [graph](const Budget& budget) {
    return budget.resolve_bytes(*graph);
  };
  subject.optimal = [graph, rounds](const Budget& budget) -> ForwardFn {
    PlannedGraph planned(rounds, plan_within(*graph, budget));
    return [planned](const torch::Tensor& x) mutable {
      return planned->forward(x);
    };
  };
  return subject;
}

// ------------------------------------------------------------- reports

Cell per_step(int64_t total, int64_t steps) {
  return steps > 0 ? Cell::number(double(total) / double(steps), 1)
                   : Cell::empty();
}

std::string within(int64_t peak_bytes, int64_t budget_bytes) {
  return peak_bytes <= budget_bytes ? "yes" : "NO";
}

// Every side's times and peaks against none's.
Table sides_table(
    const std::string& id,
    const std::string& caption,
    const std::vector<Side>& sides,
    int64_t input_bytes) {
  Table table;
  table.name = id + "-sides";
  table.caption = caption;
  table.columns = {
      "side",
      "measured peak",
      "tracked peak",
      "scope budget_bytes",
      "steps over"};
  for (const std::string& column : step_time_columns()) {
    table.columns.push_back(column);
  }
  for (const Side& side : sides) {
    const bool scoped = side.scope_budget_bytes > 0;
    std::vector<Cell> row{
        Cell::text(side.name),
        Cell::bytes(side.measured.peak_bytes + input_bytes),
        scoped ? Cell::bytes(side.scope.tracked_peak_bytes) : Cell::empty(),
        scoped ? Cell::bytes(side.scope_budget_bytes) : Cell::empty(),
        scoped ? Cell::integer(side.scope.steps_over) : Cell::empty()};
    for (Cell& cell : step_time_cells(side.measured, sides.front().measured)) {
      row.push_back(std::move(cell));
    }
    table.add_row(std::move(row));
  }
  return table;
}

// One row per budget: optimal at [o], dynamic at [d]; none is sides[0].
std::vector<Cell> budget_row(
    const std::string& budget_name,
    const std::vector<Side>& sides,
    std::optional<size_t> o,
    size_t d,
    int64_t input_bytes) {
  const Side& none = sides.front();
  const Side& dynamic = sides[d];
  const auto peak = [&](const Side& side) {
    return side.measured.peak_bytes + input_bytes;
  };
  const auto ratio = [](const Side& side, const Side& baseline) {
    return Cell::ratio_interval(side.measured.step_ratio(baseline.measured));
  };
  std::vector<Cell> row{
      Cell::text(budget_name),
      Cell::bytes(dynamic.budget_bytes),
      o ? ratio(dynamic, sides[*o]) : Cell::empty(),
      ratio(dynamic, none),
      o ? ratio(sides[*o], none) : Cell::empty(),
      Cell::bytes(peak(none)),
      o ? Cell::bytes(peak(sides[*o])) : Cell::empty(),
      Cell::bytes(peak(dynamic)),
      Cell::text(
          (o ? within(peak(sides[*o]), dynamic.budget_bytes) : "—") +
          std::string(" / ") + within(peak(dynamic), dynamic.budget_bytes)),
      Cell::bytes(dynamic.scope.tracked_peak_bytes),
      Cell::bytes(dynamic.scope_budget_bytes),
      Cell::integer(dynamic.scope.steps_over),
      per_step(dynamic.scope.evictions, dynamic.scope.timed_steps),
      per_step(dynamic.scope.rematerializations, dynamic.scope.timed_steps)};
  return row;
}

std::vector<std::string> budget_columns(const std::string& static_name) {
  return {
      "budget (of the store-all peak)",
      "budget bytes",
      "time dynamic / " + static_name + " [95% CI]",
      "time dynamic / none [95% CI]",
      "time " + static_name + " / none [95% CI]",
      "none peak",
      static_name + " peak",
      "dynamic peak",
      "within budget (" + static_name + " / dynamic)",
      "tracked peak (highest step)",
      "scope budget_bytes",
      "steps over",
      "evictions / step",
      "re-runs / step"};
}

constexpr int64_t kNothingEvicted = int64_t{1} << 40;  // 1 TiB

// Steps 2-4 of the top on one model; a table row per budget.
// The sides of one model: none, the bookkeeping scope if asked for, and per
// budget the optimal plan (when one fits) and dynamic.
struct SubjectSides {
  std::vector<Side> sides;
  // Per budget: the optimal side (none when no plan fits), the dynamic one.
  std::vector<std::pair<std::optional<size_t>, size_t>> at_budget;
  std::optional<size_t> bookkeeping;
};

SubjectSides subject_sides(const Subject& subject, const E8Options& options) {
  SubjectSides made;
  std::vector<Side>& sides = made.sides;
  sides.push_back(make_side("none", subject.plain));
  if (subject.bookkeeping) {
    made.bookkeeping = sides.size();
    sides.push_back(make_side(
        "dynamic@1TiB", subject.plain, kNothingEvicted, kNothingEvicted));
  }
  for (const int64_t percent : options.percents) {
    const Budget budget = Budget::parse(percent_name(percent));
    const int64_t budget_bytes = subject.resolve_bytes(budget);
    std::optional<size_t> optimal;
    if (budget_bytes >= subject.minimum_bytes) {
      optimal = sides.size();
      sides.push_back(make_side(
          "optimal@" + percent_name(percent),
          subject.optimal(budget),
          budget_bytes));
    }
    sides.push_back(dynamic_side(
        "dynamic@" + percent_name(percent),
        subject.plain,
        budget_bytes,
        subject.input_bytes));
    made.at_budget.emplace_back(optimal, sides.size() - 1);
  }
  return made;
}

void run_subject(
    const Subject& subject,
    const E8Options& options,
    const Context& context,
    Section& section,
    Verdicts& verdicts) {
  Runner runner(
      {subject.model.get(), subject.input, subject.loss},
      context.runner_options());
  auto [sides, at_budget, bookkeeping] = subject_sides(subject, options);
  run_rounds(sides, runner, *subject.model, context);

  Table table;
  table.name = subject.id + "-budgets";
  table.caption = subject.description;
  table.columns = budget_columns("optimal");
  const bool chain = subject.id != "unet";
  for (size_t b = 0; b < at_budget.size(); ++b) {
    const auto [o, d] = at_budget[b];
    std::vector<Cell> row = budget_row(
        percent_name(options.percents[b]), sides, o, d, subject.input_bytes);
    if (!o) {
      row[2] = Cell::text("no static plan fits");
    }
    table.add_row(std::move(row));
    const std::string name =
        subject.id + "@" + percent_name(options.percents[b]);
    if (options.percents[b] == 50) {
      verdicts.dynamic_vs_none_50.emplace_back(
          name, sides[d].measured.step_ratio(sides[0].measured));
    }
    if (chain && o) {
      verdicts.dynamic_vs_optimal.emplace_back(
          name, sides[d].measured.step_ratio(sides[*o].measured));
    }
  }
  if (bookkeeping) {
    table.add_row(budget_row(
        "1 TiB (nothing evicted)",
        sides,
        std::nullopt,
        *bookkeeping,
        subject.input_bytes));
    verdicts.bookkeeping.emplace_back(
        subject.id, sides[*bookkeeping].measured.step_ratio(sides[0].measured));
  }
  for (const Side& side : sides) {
    verdicts.count(side);
  }
  section.add_table(std::move(table));
  section.add_table(sides_table(
      subject.id,
      subject.description + ": every side",
      sides,
      subject.input_bytes));
}

// ------------------------------------------------------ varying lengths

// One length per round, gate first (the top, step 5).
std::vector<int64_t> draw_lengths(int64_t seq, int count) {
  const int64_t step = std::max<int64_t>(1, seq / 8);
  std::mt19937 generator(8);
  std::uniform_int_distribution<int64_t> multiple(
      std::max<int64_t>(1, seq / 4 / step), seq / step);
  std::vector<int64_t> lengths;
  for (int i = 0; i < count; ++i) {
    lengths.push_back(multiple(generator) * step);
  }
  return lengths;
}

// A PlannedSequential per distinct length, each within `budget_bytes`, and
// what making it cost.
struct ShapePlans {
  std::map<int64_t, PlannedSequential> planned;
  Table table;
};

ShapePlans plan_per_shape(
    const GptRun& run,
    const std::vector<int64_t>& lengths,
    int64_t budget_bytes) {
  ShapePlans plans;
  plans.table.name = "gpt-varying-planning";
  plans.table.caption = "Plan per shape: profile and solve per length";
  plans.table.columns = {
      "length",
      "profile ms",
      "plan_within ms",
      "stage forwards",
      "predicted peak"};
  std::vector<int64_t> distinct = lengths;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  for (const int64_t length : distinct) {
    const Timer profiling;
    const planner::Chain chain =
        profile_for_planning(run.model, run.tokens.narrow(1, 0, length));
    const double profile_ms = profiling.elapsed_ms();
    const Timer solving;
    const planner::Plan plan = plan_within(chain, Budget::bytes(budget_bytes));
    const double solve_ms = solving.elapsed_ms();
    plans.planned.emplace(length, PlannedSequential(run.model, plan));
    plans.table.add_row(
        {Cell::integer(length),
         Cell::ms(profile_ms),
         Cell::ms(solve_ms),
         Cell::integer(stage_forwards(plan)),
         Cell::bytes(planner::simulate(chain, plan).peak_bytes)});
  }
  return plans;
}

void run_varying(
    const E8Options& options,
    const Context& context,
    Section& section,
    Verdicts& verdicts) {
  GptRun run = build_gpt(options, context);
  const int64_t seq = run.gpt.seq_len();
  const std::vector<int64_t> lengths =
      draw_lengths(seq, 1 + context.warmup + context.rounds);
  const planner::Chain longest = profile_for_planning(run.model, run.tokens);
  // 50 %, or the least a plan for the longest length fits if that is more.
  const int64_t half_bytes = Budget::parse("50%").resolve_bytes(longest);
  const int64_t budget_bytes =
      std::max(half_bytes, planner::min_feasible_budget_bytes(longest));
  const int64_t input_bytes = longest.input_bytes();
  ShapePlans plans = plan_per_shape(run, lengths, budget_bytes);

  auto length = std::make_shared<int64_t>(seq);
  auto model = run.model;
  const ForwardFn plain = [model, length](const torch::Tensor& x) mutable {
    return model->forward(x.narrow(1, 0, *length));
  };
  auto planned = std::make_shared<std::map<int64_t, PlannedSequential>>(
      std::move(plans.planned));
  const ForwardFn per_shape = [planned, length](const torch::Tensor& x) {
    return planned->at(*length)->forward(x.narrow(1, 0, *length));
  };
  std::vector<Side> sides{
      make_side("none", plain),
      make_side("plan per shape", per_shape, budget_bytes),
      dynamic_side("dynamic", plain, budget_bytes, input_bytes)};
  Runner runner(
      {run.model.get(), run.tokens, gpt_loss_of(run.targets)},
      context.runner_options());
  run_rounds(sides, runner, *run.model, context, [&](int index) {
    *length = lengths[static_cast<size_t>(index + 1)];
  });

  std::ostringstream about;
  about << "**Varying lengths**: the " << gpt_text(run)
        << " with each round's batch cut to a length drawn from the multiples "
           "of "
        << std::max<int64_t>(1, seq / 8) << " in [" << seq / 4 << ", " << seq
        << "] (lengths, gate and warm-up first:";
  for (const int64_t l : lengths) {
    about << " " << l;
  }
  about << "). Byte budget " << planner::format_bytes(budget_bytes) << " ("
        << (budget_bytes == half_bytes
                ? "50 % of the longest length's store-all peak"
                : "the least a static plan for the longest length fits, "
                  "above 50 % of its store-all peak")
        << ") for every side; the peaks below are the highest over the "
           "rounds.";
  section.add_text(about.str());
  Table table;
  table.name = "gpt-varying";
  table.columns = budget_columns("plan per shape");
  table.add_row(budget_row("50% of the longest", sides, 1, 2, input_bytes));
  verdicts.dynamic_vs_none_50.emplace_back(
      "gpt varying", sides[2].measured.step_ratio(sides[0].measured));
  for (const Side& side : sides) {
    verdicts.count(side);
  }
  section.add_table(std::move(table));
  section.add_table(std::move(plans.table));
  section.add_table(sides_table(
      "gpt-varying", "Varying lengths: every side", sides, input_bytes));
}

// ------------------------------------------------------------- E8

Section run_e8(const E8Options& options, const Context& context) {
  Section section;
  section.title =
      "E8 — dynamic rematerialization against the optimal static "
      "plan";
  section.add_text(
      "Budgets are fractions of the predicted store-all peak of each model's "
      "profile (`Budget::parse`, simulate()'s units: activations plus the "
      "input). optimal = `plan_within` run by `PlannedSequential` (chains) or "
      "`PlannedGraph` (the U-Net, one stage per convolution round); dynamic = "
      "the plain model in a `DynamicRemat` scope open around forward, loss "
      "and backward, budget_bytes = the budget less the input's bytes (the "
      "input is made outside the scope and is not tracked). Measured peaks "
      "are the tracking allocator's activation peak plus the input's bytes "
      "(E2's units); tracked peak = the scope's `tracked_peak_bytes`, the "
      "highest over every scoped step (gate and warm-up included); evictions "
      "and re-runs are means over the timed steps. Every step's gradients "
      "were compared bitwise with none's of the same round. Time ratios are "
      "medians of per-round ratios of wall-clock step time, with 95 % "
      "intervals.");
  Verdicts verdicts;
  {
    const E2Chain chain = options.e2.resnet_chain(context);
    run_subject(
        chain_subject(
            chain.id, "E2's " + chain.description, chain.model, chain.input),
        options,
        context,
        section,
        verdicts);
  }
  {
    const E2Chain chain = options.e2.mlp_chain(context);
    Subject mlp = chain_subject(
        chain.id, "E2's " + chain.description, chain.model, chain.input);
    mlp.bookkeeping = true;
    run_subject(mlp, options, context, section, verdicts);
  }
  {
    const GptRun run = build_gpt(options, context);
    Subject gpt = chain_subject(
        "gpt", gpt_text(run), run.model, run.tokens, gpt_loss_of(run.targets));
    gpt.bookkeeping = true;
    run_subject(gpt, options, context, section, verdicts);
  }
  run_subject(
      unet_subject(options, context), options, context, section, verdicts);
  run_varying(options, context, section, verdicts);
  section.add_text(
      "**Reading the tables.** The two budgets bound different things. A "
      "static plan's bounds the predicted activation peak of the whole step, "
      "backward's temporaries included, and its measured peak stays within "
      "it. The scope's bounds only the saved tensors it tracks: its measured "
      "peak lies above the budget by backward's working memory (gradients in "
      "flight, the inputs of a re-run operator) and by what the code still "
      "holds, and its tracked peak by the tensor whose saving triggers an "
      "eviction. So dynamic and optimal are compared at equal budgets, not "
      "at equal measured peaks; at the same budget dynamic keeps more. Sides "
      "run in a fixed order within each round (none first), so an interval "
      "that excludes 1 by a few per cent may be an effect of that order.");
  section.add_text(targets_text(verdicts));
  section.add_text(
      "Not measured here: a GPU; budgets below 50 % (each model's minimum "
      "feasible budget differs); the bookkeeping on the ResNet and the U-Net; "
      "the cost of opening and closing a scope (outside the timed step, a "
      "few microseconds); varying lengths on models other than the GPT.");
  return section;
}

ScenarioRun setup_e8(CLI::App& command) {
  auto options = std::make_shared<E8Options>();
  options->e2.add_flags(command);
  command.add_option("--gpt-layers", options->gpt_layers, "GPT blocks")
      ->capture_default_str();
  command.add_option("--gpt-hidden", options->gpt_hidden, "GPT width")
      ->capture_default_str();
  command.add_option("--gpt-seq", options->gpt_seq, "GPT longest sequence")
      ->capture_default_str();
  command.add_option("--gpt-batch", options->gpt_batch, "GPT sequences")
      ->capture_default_str();
  command.add_option("--unet-size", options->unet_size, "U-Net image edge")
      ->capture_default_str();
  command.add_option("--unet-batch", options->unet_batch, "U-Net images")
      ->capture_default_str();
  command
      .add_option(
          "--percents", options->percents, "Budgets, % of the store-all peak")
      ->capture_default_str();
  return
      [options](const Context& context) { return run_e8(*options, context); };
}

}  // namespace

const bool kE8Registered = register_scenario(
    {"E8",
     "dynamic rematerialization (DynamicRemat) vs the optimal static plan "
     "at equal budget; varying-length GPT vs a plan per shape",
     80,
     setup_e8});

}  // namespace remat::bench
