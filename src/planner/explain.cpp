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

/// What the plan keeps of each stage and how often it runs forward.
struct StageUse {
  int64_t forwards = 0;
  int64_t checkpoints = 0;
  int64_t records = 0;
  int64_t selectives = 0;  ///< kForwardSelective
};

std::vector<StageUse> stage_uses(const Chain& chain, const Plan& plan) {
  std::vector<StageUse> uses(chain.size());
  for (const Op& op : plan.ops) {
    if (op.kind == OpKind::kBackward) {
      continue;
    }
    StageUse& use = uses[op.stage];
    ++use.forwards;
    use.checkpoints += op.kind == OpKind::kForwardCheckpoint;
    use.records += op.kind == OpKind::kForwardRecord;
    use.selectives += op.kind == OpKind::kForwardSelective;
  }
  return uses;
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

void print_stages(
    std::ostream& out, const Chain& chain, const std::vector<StageUse>& uses) {
  using Align = TextTable::Align;
  const bool parameters = counts_parameters(chain);
  std::vector<TextTable::Column> columns{
      {"stage", Align::kRight},
      {"fwd ms", Align::kRight},
      {"bwd ms", Align::kRight},
      {"output", Align::kRight},
      {"saved", Align::kRight}};
  if (parameters) {
    columns.push_back({"gathered", Align::kRight});
  }
  columns.push_back({"forwards", Align::kRight});
  columns.push_back({"keeps", Align::kLeft});
  TextTable table(std::move(columns));
  for (int64_t i = 0; i < chain.size(); ++i) {
    const StageCost& cost = chain.stage(i);
    const StageUse& use = uses[i];
    std::string keeps;
    if (use.forwards == use.records && use.checkpoints == 0) {
      keeps = "record (stored from the first forward)";
    } else if (use.forwards == use.selectives && use.checkpoints == 0) {
      keeps = "what its policy saves (selective, " +
              format_bytes(cost.selective->saved_bytes) + ")";
    } else if (use.checkpoints > 0) {
      keeps = "input x_" + std::to_string(i) + " (checkpoint, " +
              format_bytes(chain.value_bytes(i)) + ")";
    } else {
      keeps = "recomputed from an earlier checkpoint";
    }
    if (use.selectives > 0 && use.forwards > use.selectives) {
      keeps += "; recorded selectively";
    }
    std::vector<std::string> row{
        std::to_string(i),
        fixed(cost.forward_ms, 3),
        fixed(cost.backward_ms, 3),
        format_bytes(cost.output_bytes),
        format_bytes(cost.saved_bytes)};
    if (parameters) {
      row.push_back(format_bytes(cost.gathered_bytes));
    }
    row.push_back(std::to_string(use.forwards));
    row.push_back(keeps);
    table.add_row(std::move(row));
  }
  table.print(out);
}

void print_ops(
    std::ostream& out, const Plan& plan, const Simulation& simulation) {
  using Align = TextTable::Align;
  TextTable table({
      {"#", Align::kRight},
      {"op", Align::kLeft},
      {"kind", Align::kLeft},
      {"live after", Align::kRight},
      {"peak in op", Align::kRight},
  });
  for (size_t k = 0; k < simulation.op_peak_bytes.size(); ++k) {
    const Op& op = plan.ops[k];
    table.add_row(
        {std::to_string(k),
         op_kind_letter(op.kind) + std::to_string(op.stage),
         op_kind_name(op.kind),
         exact_bytes(simulation.live_after_bytes[k]),
         exact_bytes(simulation.op_peak_bytes[k])});
  }
  table.print(out);
}

/// Splits the peak into parameters (resident shards and what the peak op
/// gathers) and the rest (activations, gradients in flight, the input).
void print_parameter_share(
    std::ostream& out,
    const Chain& chain,
    const Plan& plan,
    const Simulation& simulation) {
  const auto peak_op = std::max_element(
      simulation.op_peak_bytes.begin(), simulation.op_peak_bytes.end());
  int64_t gathered = 0;
  std::string at = "before any op";
  if (peak_op != simulation.op_peak_bytes.end() &&
      *peak_op == simulation.peak_bytes) {
    const Op& op = plan.ops[peak_op - simulation.op_peak_bytes.begin()];
    const StageCost& cost = chain.stage(op.stage);
    gathered = (op.kind == OpKind::kBackward ? 2 : 1) * cost.gathered_bytes;
    at = std::string("in op ") + op_kind_letter(op.kind) +
         std::to_string(op.stage);
  }
  const int64_t parameters = chain.resident_bytes() + gathered;
  out << "parameters at the peak (" << at << ") " << format_bytes(parameters)
      << ": resident " << format_bytes(chain.resident_bytes())
      << " (this rank's shards and their gradients) + gathered "
      << format_bytes(gathered)
      << "; activations, gradients in flight and the input "
      << format_bytes(simulation.peak_bytes - parameters) << "\n";
}

}  // namespace

void explain(std::ostream& out, const Chain& chain, const Plan& plan) {
  const Simulation simulation = simulate(chain, plan);
  if (!simulation.valid) {
    out << "invalid plan: " << simulation.error << "\n";
    return;
  }
  const Simulation store_all = simulate(chain, solve_store_all(chain));
  const std::vector<StageUse> uses = stage_uses(chain, plan);
  print_stages(out, chain, uses);
  out << "\n";
  print_ops(out, plan, simulation);

  int64_t recomputed = 0;
  for (const StageUse& use : uses) {
    recomputed += use.forwards - 1;
  }
  out << "\npredicted peak " << format_bytes(simulation.peak_bytes) << " ("
      << simulation.peak_bytes << " bytes, "
      << fixed(
             100.0 * static_cast<double>(simulation.peak_bytes) /
                 static_cast<double>(store_all.peak_bytes),
             2)
      << "% of store-all " << format_bytes(store_all.peak_bytes)
      << "), predicted time " << fixed(simulation.time_ms, 3)
      << " ms (store-all " << fixed(store_all.time_ms, 3) << " ms), "
      << recomputed << " recomputed stage forwards\n";
  if (counts_parameters(chain)) {
    print_parameter_share(out, chain, plan, simulation);
  }
}

std::string explain(const Chain& chain, const Plan& plan) {
  std::ostringstream out;
  explain(out, chain, plan);
  return out.str();
}

}  // namespace remat::planner
