// planned_sequential.cpp: PlannedSequential (a Sequential run by a plan),
// Budget, auto_checkpoint and explain.
//
// The module validates its plan against the Sequential once (simulate() on a
// unit-cost chain of the right length) and delegates execution to
// detail::run_plan (NOTE: [Plan execution] in plan_executor.cpp). Input-shape
// policy: see remat/planned_sequential.h and docs/planned_execution.md.
#include "remat/planned_sequential.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include "plan_executor.h"
#include "remat/planner/simulate.h"

namespace remat {
namespace {

/// The budget-relative plan for `chain`, or a c10::Error stating the minimum.
planner::Plan solve_within(
    const char* caller,
    const planner::Chain& chain,
    const Budget& budget,
    const planner::SolverOptions& solver) {
  const int64_t budget_bytes = budget.resolve_bytes(chain);
  const int64_t minimum_bytes = planner::min_feasible_budget_bytes(chain);
  TORCH_CHECK(
      budget_bytes >= minimum_bytes,
      caller,
      ": expected a budget of at least ",
      minimum_bytes,
      " bytes (the minimum feasible for this model and input), got ",
      budget_bytes,
      " bytes (",
      budget.to_string(),
      ")");
  std::optional<planner::Plan> plan =
      planner::solve_optimal(chain, budget_bytes, solver);
  TORCH_INTERNAL_ASSERT(
      plan.has_value(), "solve_optimal found no plan above the minimum");
  return *plan;
}

std::string shape_string(c10::IntArrayRef shape) {
  std::ostringstream out;
  out << shape;
  return out.str();
}

}  // namespace

// ---- Budget ----------------------------------------------------------------

Budget Budget::bytes(int64_t budget_bytes) {
  TORCH_CHECK(
      budget_bytes > 0,
      "remat::Budget::bytes: expected a positive number of bytes, got ",
      budget_bytes);
  Budget budget;
  budget.budget_bytes = budget_bytes;
  return budget;
}

Budget Budget::fraction(double fraction) {
  TORCH_CHECK(
      fraction > 0 && std::isfinite(fraction),
      "remat::Budget::fraction: expected a positive finite fraction of the "
      "store-all peak, got ",
      fraction);
  Budget budget;
  budget.is_fraction = true;
  budget.budget_fraction = fraction;
  return budget;
}

int64_t Budget::resolve_bytes(const planner::Chain& chain) const {
  if (!is_fraction) {
    return budget_bytes;
  }
  const planner::Simulation store_all =
      planner::simulate(chain, planner::solve_store_all(chain));
  return std::max<int64_t>(
      1,
      static_cast<int64_t>(std::floor(
          budget_fraction * static_cast<double>(store_all.peak_bytes))));
}

std::string Budget::to_string() const {
  std::ostringstream out;
  if (is_fraction) {
    out << budget_fraction * 100 << "% of the store-all peak";
  } else {
    out << budget_bytes << " bytes";
  }
  return out.str();
}

// ---- PlannedSequential -----------------------------------------------------

PlannedSequentialImpl::PlannedSequentialImpl(
    torch::nn::Sequential sequential_,
    planner::Plan plan,
    PlannedSequentialOptions options_)
    : sequential(std::move(sequential_)),
      options(std::move(options_)),
      plan_(std::move(plan)) {
  TORCH_CHECK(
      !sequential.is_empty() && sequential->size() > 0,
      "remat::PlannedSequential: expected a non-empty Sequential, got ",
      sequential.is_empty() ? "a null one" : "one with no children");
  register_module("sequential", sequential);
  reset();
  if (!options.input_shape().empty()) {
    plans_by_shape_.emplace(options.input_shape(), plan_);
  }
}

void PlannedSequentialImpl::reset() {
  const int64_t stages = static_cast<int64_t>(sequential->size());
  const planner::Simulation simulation =
      planner::simulate(detail::unit_chain(stages), plan_);
  TORCH_CHECK(
      simulation.valid,
      "remat::PlannedSequential: expected a valid plan for the Sequential's ",
      stages,
      " stages, got \"",
      plan_.to_string(),
      "\": ",
      simulation.error);
  TORCH_CHECK(
      options.on_shape_change() != ShapePolicy::kReplan ||
          options.budget().has_value(),
      "remat::PlannedSequential: expected options.budget to be set for "
      "ShapePolicy::kReplan, got none");
}

std::shared_ptr<torch::nn::Module> PlannedSequentialImpl::clone(
    const c10::optional<torch::Device>& device) const {
  auto copy = torch::nn::Sequential(
      std::dynamic_pointer_cast<torch::nn::SequentialImpl>(
          sequential->clone(device)));
  auto result = std::make_shared<PlannedSequentialImpl>(copy, plan_, options);
  result->plans_by_shape_ = plans_by_shape_;
  result->train(is_training());
  return result;
}

void PlannedSequentialImpl::pretty_print(std::ostream& stream) const {
  std::string text = plan_.to_string();
  constexpr size_t kMaxChars = 60;
  if (text.size() > kMaxChars) {
    text = text.substr(0, kMaxChars) + " ...";
  }
  stream << "remat::PlannedSequential(stages=" << sequential->size()
         << ", ops=" << plan_.ops.size() << ", plan=" << text << ")";
}

torch::Tensor PlannedSequentialImpl::forward(const torch::Tensor& input) {
  TORCH_CHECK(
      input.defined(),
      "remat::PlannedSequential::forward: expected a defined input tensor");
  if (!options.input_shape().empty() &&
      input.sizes() != c10::IntArrayRef(options.input_shape())) {
    TORCH_CHECK(
        options.on_shape_change() == ShapePolicy::kReplan,
        "remat::PlannedSequential::forward: expected an input of shape ",
        shape_string(options.input_shape()),
        " (the shape the plan was made for), got ",
        shape_string(input.sizes()),
        "; re-plan with auto_checkpoint or profile_chain on the new shape, "
        "or use ShapePolicy::kReplan");
    std::vector<int64_t> shape = input.sizes().vec();
    auto known = plans_by_shape_.find(shape);
    if (known == plans_by_shape_.end()) {
      planner::Chain chain =
          profile_chain(sequential, input, options.profile());
      known = plans_by_shape_
                  .emplace(
                      shape,
                      solve_within(
                          "remat::PlannedSequential::forward (re-plan for a "
                          "new input shape)",
                          chain,
                          *options.budget(),
                          options.solver()))
                  .first;
    }
    plan_ = known->second;
    options.input_shape(std::move(shape));
  }
  bool needs_grad = input.requires_grad();
  for (const auto& parameter : sequential->parameters()) {
    needs_grad |= parameter.requires_grad();
  }
  if (!c10::GradMode::is_enabled() || !needs_grad) {
    return sequential->forward(input);
  }
  return detail::run_plan(sequential, plan_, input);
}

// ---- auto_checkpoint -------------------------------------------------------

PlannedSequential auto_checkpoint(
    torch::nn::Sequential model,
    const torch::Tensor& sample,
    Budget budget,
    const AutoCheckpointOptions& options) {
  planner::Chain chain = profile_chain(model, sample, options.profile());
  planner::Plan plan =
      solve_within("remat::auto_checkpoint", chain, budget, options.solver());
  return PlannedSequential(
      std::move(model),
      std::move(plan),
      PlannedSequentialOptions()
          .input_shape(sample.sizes().vec())
          .on_shape_change(options.on_shape_change())
          .budget(budget)
          .profile(options.profile())
          .solver(options.solver()));
}

// ---- explain ---------------------------------------------------------------

namespace {

std::string format_bytes(int64_t bytes) {
  std::ostringstream out;
  const double value = static_cast<double>(bytes);
  if (bytes >= (int64_t{1} << 30)) {
    out << std::fixed << std::setprecision(2) << value / (1 << 30) << " GiB";
  } else if (bytes >= (int64_t{1} << 20)) {
    out << std::fixed << std::setprecision(2) << value / (1 << 20) << " MiB";
  } else if (bytes >= (int64_t{1} << 10)) {
    out << std::fixed << std::setprecision(2) << value / (1 << 10) << " KiB";
  } else {
    out << bytes << " B";
  }
  return out.str();
}

std::string format_ms(double ms) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(3) << ms;
  return out.str();
}

/// A plain-text table whose columns are as wide as their widest cell:
/// numbers right-aligned, text left-aligned, two spaces between columns.
class TextTable {
 public:
  enum class Align { kLeft, kRight };
  struct Column {
    std::string header;
    Align align;
  };
  explicit TextTable(std::vector<Column> columns)
      : columns_(std::move(columns)) {}
  void add_row(std::vector<std::string> cells) {
    TORCH_INTERNAL_ASSERT(cells.size() == columns_.size());
    rows_.push_back(std::move(cells));
  }
  void print(std::ostream& out) const {
    std::vector<size_t> widths;
    for (const Column& column : columns_) {
      widths.push_back(column.header.size());
    }
    for (const auto& row : rows_) {
      for (size_t c = 0; c < row.size(); ++c) {
        widths[c] = std::max(widths[c], row[c].size());
      }
    }
    std::vector<std::string> header;
    for (const Column& column : columns_) {
      header.push_back(column.header);
    }
    print_row(out, header, widths);
    for (const auto& row : rows_) {
      print_row(out, row, widths);
    }
  }

 private:
  void print_row(
      std::ostream& out,
      const std::vector<std::string>& cells,
      const std::vector<size_t>& widths) const {
    std::string line;
    for (size_t c = 0; c < cells.size(); ++c) {
      const std::string padding(widths[c] - cells[c].size(), ' ');
      if (c > 0) {
        line += "  ";
      }
      line += columns_[c].align == Align::kRight ? padding + cells[c]
                                                 : cells[c] + padding;
    }
    while (!line.empty() && line.back() == ' ') {
      line.pop_back();  // no trailing blanks after a left-aligned last column
    }
    out << line << '\n';
  }

  std::vector<Column> columns_;
  std::vector<std::vector<std::string>> rows_;
};

/// The predicted peak inside `op` (NOTE: [The memory model] in
/// src/planner/simulate.cpp), given the live bytes before it.
int64_t op_peak_bytes(
    const planner::Chain& chain, int64_t live_before, const planner::Op& op) {
  const planner::StageCost& cost = chain.stage(op.stage);
  switch (op.kind) {
    case planner::OpKind::kBackward: {
      int64_t peak =
          live_before + chain.value_bytes(op.stage) + cost.backward_tmp_bytes;
      if (op.stage == chain.size() - 1) {
        peak += chain.value_bytes(chain.size());  // g_L
      }
      return peak;
    }
    case planner::OpKind::kForwardRecord:
      return live_before + cost.saved_bytes + cost.record_transient();
    case planner::OpKind::kForwardNoSave:
    case planner::OpKind::kForwardCheckpoint:
      return live_before + cost.output_bytes + cost.forward_tmp_bytes;
  }
  return live_before;
}

}  // namespace

std::string explain(const planner::Chain& chain, const planner::Plan& plan) {
  using Align = TextTable::Align;
  std::ostringstream out;
  const int64_t stages = chain.size();
  const planner::Simulation simulation = planner::simulate(chain, plan);
  const planner::Simulation store_all =
      planner::simulate(chain, planner::solve_store_all(chain));
  if (!simulation.valid) {
    out << "invalid plan: " << simulation.error << "\n";
    return out.str();
  }

  // Per stage: how it is first run (what it keeps) and how often.
  std::vector<int64_t> forwards(stages, 0);
  std::vector<int64_t> checkpoints(stages, 0);
  std::vector<int64_t> records(stages, 0);
  for (const planner::Op& op : plan.ops) {
    if (op.kind == planner::OpKind::kBackward) {
      continue;
    }
    ++forwards[op.stage];
    checkpoints[op.stage] += op.kind == planner::OpKind::kForwardCheckpoint;
    records[op.stage] += op.kind == planner::OpKind::kForwardRecord;
  }
  TextTable stage_table({
      {"stage", Align::kRight},
      {"fwd ms", Align::kRight},
      {"bwd ms", Align::kRight},
      {"output", Align::kRight},
      {"saved", Align::kRight},
      {"forwards", Align::kRight},
      {"keeps", Align::kLeft},
  });
  for (int64_t i = 0; i < stages; ++i) {
    const planner::StageCost& cost = chain.stage(i);
    std::string keeps;
    if (checkpoints[i] > 0) {
      keeps = "input x_" + std::to_string(i) + " (checkpoint, " +
              format_bytes(chain.value_bytes(i)) + ")";
    }
    if (forwards[i] == records[i] && checkpoints[i] == 0) {
      keeps = "record (stored from the first forward)";
    } else if (keeps.empty()) {
      keeps = "recomputed from an earlier checkpoint";
    }
    stage_table.add_row(
        {std::to_string(i),
         format_ms(cost.forward_ms),
         format_ms(cost.backward_ms),
         format_bytes(cost.output_bytes),
         format_bytes(cost.saved_bytes),
         std::to_string(forwards[i]),
         keeps});
  }
  stage_table.print(out);

  // Per op: predicted live bytes after it and the peak inside it.
  TextTable op_table({
      {"#", Align::kRight},
      {"op", Align::kLeft},
      {"kind", Align::kLeft},
      {"live after", Align::kRight},
      {"peak in op", Align::kRight},
  });
  planner::Replay replay(chain);
  for (size_t k = 0; k < plan.ops.size(); ++k) {
    const planner::Op& op = plan.ops[k];
    const int64_t op_peak = op_peak_bytes(chain, replay.current_bytes(), op);
    const std::string error = replay.apply(op);
    TORCH_INTERNAL_ASSERT(error.empty(), "valid plan rejected: ", error);
    op_table.add_row(
        {std::to_string(k),
         std::string(1, planner::op_kind_letter(op.kind)) +
             std::to_string(op.stage),
         planner::op_kind_name(op.kind),
         format_bytes(replay.current_bytes()),
         format_bytes(op_peak)});
  }
  out << "\n";
  op_table.print(out);

  int64_t total_forwards = 0;
  for (int64_t count : forwards) {
    total_forwards += count;
  }
  out << "\npredicted peak " << format_bytes(simulation.peak_bytes) << " ("
      << simulation.peak_bytes << " bytes, " << std::fixed
      << std::setprecision(2)
      << 100.0 * static_cast<double>(simulation.peak_bytes) /
             static_cast<double>(store_all.peak_bytes)
      << "% of store-all " << format_bytes(store_all.peak_bytes)
      << "), predicted time " << std::setprecision(3) << simulation.time_ms
      << " ms (store-all " << store_all.time_ms << " ms), "
      << total_forwards - stages << " recomputed stage forwards\n";
  return out.str();
}

}  // namespace remat
