// e6_pytorch_report.cpp — the section of scenario E6: what it runs (the
// preamble), which PyTorch ran, and its tables: "E6" (both sides per
// schedule), "E6-times" (each side's step times against its own plain run),
// "E6-gradients" (remat's gradients against PyTorch's; only when the PyTorch
// side took part to the end), then the baselines' re-run and the planned
// row's budget check.
#include "e6_pytorch.h"

#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace remat::bench::e6 {
namespace {

// The PyTorch side measured `row` in the rounds.
bool pytorch_has(const Row& row, bool with_pytorch) {
  return with_pytorch && !row.pytorch.step_ms.empty();
}

Table summary_table(const std::vector<Row>& rows, bool with_pytorch) {
  const Row& none = rows.front();
  Table summary;
  summary.name = "E6";
  summary.caption = "remat and PyTorch per schedule";
  summary.columns = {
      "schedule",
      "remat peak",
      "PyTorch peak",
      "memory remat/PyTorch",
      "remat memory ratio",
      "remat time ratio [95% CI]",
      "PyTorch time ratio [95% CI]",
      "remat/PyTorch forward [95% CI]",
      "remat/PyTorch backward [95% CI]",
      "remat/PyTorch step [95% CI]"};
  for (const Row& row : rows) {
    const bool both = pytorch_has(row, with_pytorch);
    const bool peaks = both && row.pytorch_peak_measured;
    const auto remat_over_pytorch = [&](const std::vector<double>& lhs,
                                        const std::vector<double>& rhs) {
      return both ? paired_ratio_cell(lhs, rhs) : Cell::empty();
    };
    summary.add_row(
        {Cell::text(row.name),
         Cell::bytes(row.remat.peak_bytes),
         peaks ? Cell::bytes(row.pytorch.peak_bytes) : Cell::empty(),
         peaks && row.pytorch.peak_bytes > 0
             ? Cell::ratio(
                   static_cast<double>(row.remat.peak_bytes) /
                   static_cast<double>(row.pytorch.peak_bytes))
             : Cell::empty(),
         Cell::ratio(
             static_cast<double>(row.remat.peak_bytes) /
             static_cast<double>(none.remat.peak_bytes)),
         paired_ratio_cell(row.remat.step_ms, none.remat.step_ms),
         both ? paired_ratio_cell(row.pytorch.step_ms, none.pytorch.step_ms)
              : Cell::empty(),
         remat_over_pytorch(row.remat.forward_ms, row.pytorch.forward_ms),
         remat_over_pytorch(row.remat.backward_ms, row.pytorch.backward_ms),
         remat_over_pytorch(row.remat.step_ms, row.pytorch.step_ms)});
  }
  return summary;
}

// One row of E6-times: one side's run of one schedule.
std::vector<Cell> side_times_cells(
    const std::string& schedule,
    const std::string& side,
    const std::string& call,
    const Measurement& measured,
    const Measurement& baseline,
    Cell peak,
    Cell grad_diff) {
  std::vector<Cell> cells = {
      Cell::text(schedule), Cell::text(side), Cell::text(call)};
  for (auto& cell : step_time_cells(measured, baseline)) {
    cells.push_back(std::move(cell));
  }
  cells.push_back(std::move(peak));
  cells.push_back(std::move(grad_diff));
  return cells;
}

Table times_table(const std::vector<Row>& rows, bool with_pytorch) {
  const Row& none = rows.front();
  Table times;
  times.name = "E6-times";
  times.caption = "Step times of each side (ratio: to its own none)";
  times.columns = {"schedule", "side", "call"};
  for (const auto& column : step_time_columns()) {
    times.columns.push_back(column);
  }
  times.columns.push_back("peak");
  times.columns.push_back("max grad diff vs none");
  for (const Row& row : rows) {
    times.add_row(side_times_cells(
        row.name,
        "remat",
        row.remat_call,
        row.remat,
        none.remat,
        Cell::bytes(row.remat.peak_bytes),
        Cell::text(format_difference(row.remat.max_grad_diff))));
    if (pytorch_has(row, with_pytorch)) {
      times.add_row(side_times_cells(
          row.name,
          "PyTorch",
          row.pytorch_call,
          row.pytorch,
          none.pytorch,
          row.pytorch_peak_measured ? Cell::bytes(row.pytorch.peak_bytes)
                                    : Cell::empty(),
          row.pytorch_grad_measured
              ? Cell::text(format_difference(row.pytorch.max_grad_diff))
              : Cell::empty()));
    }
  }
  return times;
}

Table gradients_table(
    const std::vector<Row>& rows,
    int64_t parameter_elements,
    const E6Options& options) {
  Table gradients;
  gradients.name = "E6-gradients";
  gradients.caption =
      "remat's parameter gradients against PyTorch's (same schedule; "
      "planned: PyTorch's plain run), one step each";
  gradients.columns = {
      "schedule",
      "dropout",
      "max abs diff",
      "max rel diff",
      "elements differing",
      "elements"};
  for (const Row& row : rows) {
    for (const bool train : {false, true}) {
      const GradCompare& compare = train ? row.dropout_on : row.dropout_off;
      if (!compare.measured) {
        continue;
      }
      gradients.add_row(
          {Cell::text(row.name),
           Cell::text(
               train ? "on (p " + format_difference(options.dropout) +
                           ", one seed)"
                     : "off"),
           Cell::text(format_difference(compare.max_abs_diff)),
           Cell::text(format_difference(compare.max_rel_diff)),
           Cell::integer(compare.differing),
           Cell::integer(parameter_elements)});
    }
  }
  return gradients;
}

// The baselines' re-run against their rounds, and the planned row's peak
// against its budget.
std::string closing_text(
    const std::vector<Row>& rows,
    const BaselineRerun& rerun,
    const PlannedBudget& planned,
    bool with_pytorch) {
  const Row& none = rows.front();
  std::ostringstream text;
  text << "Baselines re-run after the rounds: remat none "
       << summarize(rerun.remat.step_ms).median
       << " ms (rounds: " << none.remat.step().median << " ms)";
  if (pytorch_has(none, with_pytorch) && !rerun.pytorch.step_ms.empty()) {
    text << ", PyTorch none " << rerun.pytorch.step().median
         << " ms (rounds: " << none.pytorch.step().median << " ms)";
  }
  text << ".";
  if (planned.budget_bytes > 0) {
    const Row& row = rows.back();
    const int64_t counted = row.remat.peak_bytes + planned.input_bytes;
    text << " " << row.name << ": activation peak " << row.remat.peak_bytes
         << " + input " << planned.input_bytes << " = " << counted
         << " bytes against a budget of " << planned.budget_bytes
         << " bytes: " << (counted <= planned.budget_bytes ? "within" : "OVER")
         << ".";
  }
  return text.str();
}

}  // namespace

std::string format_difference(double value) {
  std::ostringstream text;
  text << value;
  return text.str();
}

std::string preamble(const E6Options& options, const Context& context) {
  std::ostringstream text;
  text << "E6 runs one model under the same checkpointing schedules twice: "
          "with remat in this process, and with PyTorch's own "
          "torch.utils.checkpoint in "
       << options.python
       << " (bench/pytorch/e6_pytorch.py, driven step by step). Model: "
       << options.blocks << " residual FFN blocks x + Linear(" << options.hidden
       << "→" << options.dim << ")(Dropout(" << options.dropout
       << ")(GELU(Linear(" << options.dim << "→" << options.hidden
       << ")(LayerNorm(x))))), batch " << options.batch
       << ", fp32, loss mean(y²), " << context.threads
       << " torch threads in each process. The C++ side writes its "
          "parameters and input to files that the Python side loads, so both "
          "train the same numbers. Schedules: per-block checkpointing and "
          "checkpoint_sequential("
       << options.segments
       << ") in both modes; the planned row (remat's optimal plan within a "
          "budget) has no PyTorch counterpart.\n\n"
          "**Memory** is counted the same way in both processes: by remat's "
          "tracking CPU allocator, which the Python process loads from "
          "libremat_meter.so (ctypes) before importing torch, over the same "
          "libc10. Activation peak = peak live bytes during forward, loss and "
          "backward minus the live bytes just before forward, with the "
          "parameter gradients allocated and zeroed. **Time**: forward (with "
          "the loss) and backward timed separately; "
       << context.warmup << " warm-up and " << context.rounds
       << " timed rounds, each running every schedule once in each process, "
          "interleaved, the process going first alternating; medians and "
          "spreads (max − min). Time ratios are against each process's own "
          "no-checkpoint run, remat/PyTorch between the two processes' runs "
          "of one schedule; each is paired by round (the median of the "
          "per-round ratios, with its 95 % interval: a difference only where "
          "the interval excludes 1). **Gradients**: each process checks every "
          "schedule "
          "against its own plain run of the round (same seed), and the "
          "parameter gradients of the two processes are compared element by "
          "element, with dropout off and with dropout on under one seed.";
  return text.str();
}

std::string pytorch_side_text(
    const PytorchSide& pytorch, const E6Options& options) {
  if (!pytorch.up()) {
    return "PyTorch column unavailable: " + pytorch.unavailable + ".";
  }
  const auto& greeting = pytorch.peer->greeting();
  return "PyTorch " + greeting.value("torch", std::string("?")) + " (" +
         greeting.value("executable", options.python) + ", Python " +
         greeting.value("python", std::string("?")) +
         "); memory meter in the Python process: " +
         greeting.value("meter", std::string("?")) + ". PyTorch schedules: " +
         greeting.value("sequential", std::string("?")) + ".";
}

void add_results(
    Section& section,
    const std::vector<Row>& rows,
    const BaselineRerun& rerun,
    const PlannedBudget& planned,
    bool with_pytorch,
    int64_t parameter_elements,
    const E6Options& options) {
  section.add_table(summary_table(rows, with_pytorch));
  section.add_table(times_table(rows, with_pytorch));
  if (with_pytorch) {
    section.add_table(gradients_table(rows, parameter_elements, options));
  }
  section.add_text(closing_text(rows, rerun, planned, with_pytorch));
}

}  // namespace remat::bench::e6
