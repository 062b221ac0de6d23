// explain.cpp: the plan report of remat/planner/explain.h. Every number comes
// from simulate(); nothing here models memory.
#include "remat/planner/explain.h"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "remat/planner/simulate.h"
#include "remat/planner/solvers.h"
#include "remat/planner/units.h"

namespace remat::planner {
namespace {

std::string fixed(double value, int decimals) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.*f", decimals, value);
  return text;
}

/// "1234567 (1.18 MiB)": exact for programs, readable for people.
std::string exact_bytes(int64_t bytes) {
  return std::to_string(bytes) + " (" + format_bytes(bytes) + ")";
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
    cells.resize(columns_.size());
    rows_.push_back(std::move(cells));
  }
  void print(std::ostream& out) const {
    std::vector<size_t> widths;
    std::vector<std::string> header;
    for (const Column& column : columns_) {
      widths.push_back(column.header.size());
      header.push_back(column.header);
    }
    for (const auto& row : rows_) {
      for (size_t c = 0; c < row.size(); ++c) {
        widths[c] = std::max(widths[c], row[c].size());
      }
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

/// What the plan keeps of stage `i`, in words.
std::string keeps_text(const Chain& chain, const ExplainStage& row) {
  std::string keeps;
  if (row.forwards == row.records && row.checkpoints == 0) {
    keeps = "record (stored from the first forward)";
  } else if (row.forwards == row.selectives && row.checkpoints == 0) {
    keeps = "what its policy saves (selective, " +
            format_bytes(row.cost.selective->saved_bytes) + ")";
  } else if (row.checkpoints > 0) {
    keeps = "input x_" + std::to_string(row.stage) + " (checkpoint, " +
            format_bytes(chain.value_bytes(row.stage)) + ")";
  } else {
    keeps = "recomputed from an earlier checkpoint";
  }
  if (row.selectives > 0 && row.forwards > row.selectives) {
    keeps += "; recorded selectively";
  }
  return keeps;
}

/// Whether the chain's memory model counts parameters (sharded training).
bool counts_parameters(const Chain& chain) {
  if (chain.resident_bytes() > 0) {
    return true;
  }
  return std::any_of(
      chain.stages().begin(), chain.stages().end(), [](const StageCost& s) {
        return s.gathered_bytes > 0;
      });
}

/// Where the peak is and what its op gathers of parameters.
void locate_peak(const Chain& chain, ExplainReport& report) {
  report.peak_at = "before any op";
  for (const ExplainOp& row : report.ops) {
    if (row.op_peak_bytes == report.peak_bytes) {
      const StageCost& cost = chain.stage(row.op.stage);
      report.peak_gathered_bytes =
          (row.op.kind == OpKind::kBackward ? 2 : 1) * cost.gathered_bytes;
      report.peak_at = std::string("in op ") + op_kind_letter(row.op.kind) +
                       std::to_string(row.op.stage);
      return;
    }
  }
}

void print_stages(std::ostream& out, const ExplainReport& report) {
  using Align = TextTable::Align;
  std::vector<TextTable::Column> columns{{"stage", Align::kRight}};
  if (report.graph) {
    columns.push_back({"reads", Align::kLeft});
  }
  for (TextTable::Column column :
       {TextTable::Column{"fwd ms", Align::kRight},
        {"bwd ms", Align::kRight},
        TextTable::Column{"output", Align::kRight},
        TextTable::Column{"saved", Align::kRight}}) {
    columns.push_back(column);
  }
  if (report.counts_parameters) {
    columns.push_back({"gathered", Align::kRight});
  }
  columns.push_back({"forwards", Align::kRight});
  columns.push_back({"keeps", Align::kLeft});
  TextTable table(std::move(columns));
  for (const ExplainStage& row : report.stages) {
    std::vector<std::string> cells{std::to_string(row.stage)};
    if (report.graph) {
      std::string reads;
      for (int64_t input : row.reads) {
        reads += (reads.empty() ? "" : ",") +
                 (input < 0 ? std::string("in") : std::to_string(input));
      }
      cells.push_back(reads);
    }
    for (std::string cell :
         {fixed(row.cost.forward_ms, 3),
          fixed(row.cost.backward_ms, 3),
          format_bytes(row.cost.output_bytes),
          format_bytes(row.cost.saved_bytes)}) {
      cells.push_back(std::move(cell));
    }
    if (report.counts_parameters) {
      cells.push_back(format_bytes(row.cost.gathered_bytes));
    }
    cells.push_back(std::to_string(row.forwards));
    cells.push_back(row.keeps);
    table.add_row(std::move(cells));
  }
  table.print(out);
}

void print_ops(std::ostream& out, const ExplainReport& report) {
  using Align = TextTable::Align;
  TextTable table({
      {"#", Align::kRight},
      {"op", Align::kLeft},
      {"kind", Align::kLeft},
      {"live after", Align::kRight},
      {"peak in op", Align::kRight},
  });
  for (size_t k = 0; k < report.ops.size(); ++k) {
    const ExplainOp& row = report.ops[k];
    table.add_row(
        {std::to_string(k),
         op_kind_letter(row.op.kind) + std::to_string(row.op.stage),
         op_kind_name(row.op.kind),
         exact_bytes(row.live_after_bytes),
         exact_bytes(row.op_peak_bytes)});
  }
  table.print(out);
}

/// The parts of the report a chain and a graph share: `keeps` words what the
/// plan keeps of a stage; base_bytes is what is live before the first op.
template <typename Model, typename Keeps>
ExplainReport build_report(
    const Model& model, const Plan& plan, int64_t base_bytes, Keeps keeps) {
  ExplainReport report;
  const Simulation simulation = simulate(model, plan);
  report.valid = simulation.valid;
  if (!simulation.valid) {
    report.error = simulation.error;
    return report;
  }
  const Simulation store_all = simulate(model, solve_store_all(model));
  for (int64_t i = 0; i < model.size(); ++i) {
    ExplainStage row;
    row.stage = i;
    row.cost = model.stage(i);
    report.stages.push_back(std::move(row));
  }
  for (const Op& op : plan.ops) {
    if (op.kind == OpKind::kBackward) {
      continue;
    }
    ExplainStage& row = report.stages[op.stage];
    if (row.forwards++ == 0) {
      row.first_forward = op.kind;
    }
    row.checkpoints += op.kind == OpKind::kForwardCheckpoint;
    row.records += op.kind == OpKind::kForwardRecord;
    row.selectives += op.kind == OpKind::kForwardSelective;
  }
  for (ExplainStage& row : report.stages) {
    row.keeps = keeps(row);
    report.recomputed_forwards += row.forwards - 1;
  }
  report.start_bytes = base_bytes;
  int64_t running = report.start_bytes;
  for (size_t k = 0; k < simulation.op_peak_bytes.size(); ++k) {
    running = std::max(running, simulation.op_peak_bytes[k]);
    report.ops.push_back(
        {plan.ops[k],
         simulation.live_after_bytes[k],
         simulation.op_peak_bytes[k],
         running});
  }
  report.peak_bytes = simulation.peak_bytes;
  report.step_ms = simulation.step_ms;
  report.store_all_peak_bytes = store_all.peak_bytes;
  report.store_all_step_ms = store_all.step_ms;
  return report;
}

/// What the plan keeps of a graph stage, in words.
std::string graph_keeps_text(const ExplainStage& row) {
  if (row.forwards == row.records) {
    return "record (stored from the first forward)";
  }
  if (row.forwards == row.selectives) {
    return "what its policy saves (selective, " +
           format_bytes(row.cost.selective->saved_bytes) + ")";
  }
  return "recorded again for its backward (first forward keeps nothing)";
}

}  // namespace

ExplainReport explain_report(const Chain& chain, const Plan& plan) {
  ExplainReport report = build_report(
      chain, plan, chain.base_bytes(), [&](const ExplainStage& row) {
        return keeps_text(chain, row);
      });
  if (report.valid) {
    report.counts_parameters = counts_parameters(chain);
    report.resident_bytes = chain.resident_bytes();
    locate_peak(chain, report);
  }
  return report;
}

ExplainReport explain_report(const Graph& graph, const Plan& plan) {
  ExplainReport report =
      build_report(graph, plan, graph.input_bytes(), graph_keeps_text);
  for (ExplainStage& row : report.stages) {
    row.reads = graph.inputs(row.stage);
  }
  report.graph = true;
  return report;
}

std::string to_text(const ExplainReport& report) {
  std::ostringstream out;
  if (!report.valid) {
    out << "invalid plan: " << report.error << "\n";
    return out.str();
  }
  print_stages(out, report);
  out << "\n";
  print_ops(out, report);
  out << "\npredicted peak " << format_bytes(report.peak_bytes) << " ("
      << report.peak_bytes << " bytes, "
      << fixed(
             100.0 * static_cast<double>(report.peak_bytes) /
                 static_cast<double>(report.store_all_peak_bytes),
             2)
      << "% of store-all " << format_bytes(report.store_all_peak_bytes)
      << "), predicted time " << fixed(report.step_ms, 3) << " ms (store-all "
      << fixed(report.store_all_step_ms, 3) << " ms), "
      << report.recomputed_forwards << " recomputed stage forwards\n";
  if (report.counts_parameters) {
    const int64_t parameters =
        report.resident_bytes + report.peak_gathered_bytes;
    out << "parameters at the peak (" << report.peak_at << ") "
        << format_bytes(parameters) << ": resident "
        << format_bytes(report.resident_bytes)
        << " (this rank's shards and their gradients) + gathered "
        << format_bytes(report.peak_gathered_bytes)
        << "; activations, gradients in flight and the input "
        << format_bytes(report.peak_bytes - parameters) << "\n";
  }
  return out.str();
}

void explain(std::ostream& out, const Chain& chain, const Plan& plan) {
  out << to_text(explain_report(chain, plan));
}

std::string explain(const Chain& chain, const Plan& plan) {
  return to_text(explain_report(chain, plan));
}

std::string explain(const Graph& graph, const Plan& plan) {
  return to_text(explain_report(graph, plan));
}

double StepMemory::max_saving_fraction() const {
  const int64_t total = total_store_all_bytes();
  return total > 0 ? static_cast<double>(max_saving_bytes()) /
                         static_cast<double>(total)
                   : 0.0;
}

StepMemory step_memory(const Chain& chain) {
  StepMemory memory;
  memory.model_state = chain.model_state();
  memory.input_bytes = chain.input_bytes();
  memory.store_all_peak_bytes =
      simulate(chain, solve_store_all(chain)).peak_bytes;
  if (chain.size() <= kMaxExactStages) {
    memory.least_peak_bytes = min_feasible_budget_bytes(chain);
  }
  return memory;
}

StepMemory step_memory(const Graph& graph) {
  StepMemory memory;
  memory.model_state = graph.model_state();
  memory.input_bytes = graph.input_bytes();
  memory.store_all_peak_bytes =
      simulate(graph, solve_store_all(graph)).peak_bytes;
  memory.least_peak_bytes = min_feasible_budget_bytes(graph);
  return memory;
}

std::string to_text(const StepMemory& memory, const std::string& optimizer) {
  std::ostringstream out;
  auto row = [&out](const std::string& label, int64_t bytes) {
    char line[128];
    std::snprintf(
        line,
        sizeof(line),
        "  %-46s %10s\n",
        label.c_str(),
        format_bytes(bytes).c_str());
    out << line;
  };
  row("parameters and buffers", memory.model_state.parameter_bytes);
  row("gradients", memory.model_state.gradient_bytes);
  row("optimizer state (" + optimizer + ")",
      memory.model_state.optimizer_bytes);
  row("activations + input, no checkpointing", memory.store_all_peak_bytes);
  if (memory.least_peak_bytes) {
    row("activations + input, least with checkpointing",
        *memory.least_peak_bytes);
  }
  row("total, no checkpointing", memory.total_store_all_bytes());
  if (!memory.least_peak_bytes) {
    out << "  (the least with checkpointing is not computed for chains over "
        << kMaxExactStages << " stages)\n";
    return out.str();
  }
  row("total, least with checkpointing",
      memory.total_store_all_bytes() - memory.max_saving_bytes());
  const double fraction = memory.max_saving_fraction();
  char percent[32];
  std::snprintf(percent, sizeof(percent), "%.0f%%", 100.0 * fraction);
  out << "checkpointing can save at most "
      << format_bytes(memory.max_saving_bytes()) << " of the "
      << format_bytes(memory.total_store_all_bytes()) << " step (" << percent
      << "): "
      << (fraction >= 0.25 ? "activations dominate, checkpointing helps"
          : fraction < 0.10
              ? "the model state dominates, checkpointing cannot help much"
              : "activations and model state are both large; checkpointing "
                "helps some")
      << '\n';
  return out.str();
}

}  // namespace remat::planner
