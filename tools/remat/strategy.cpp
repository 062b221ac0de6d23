// strategy.cpp: plan summaries for the tool's reports (strategy.h).
#include "strategy.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <iomanip>
#include <set>
#include <sstream>
#include <vector>

#include <remat/planner/units.h>

#include "cli_error.h"

namespace remat::cli {

GraphStrategy parse_graph_strategy(const std::string& text) {
  if (text == "optimal") {
    return GraphStrategy::kOptimal;
  }
  if (text == "none") {
    return GraphStrategy::kNone;
  }
  if (text == "per-block") {
    return GraphStrategy::kPerBlock;
  }
  if (text == "encoder") {
    return GraphStrategy::kEncoder;
  }
  throw UsageError(
      "--strategy: a U-Net is planned with optimal, none, per-block or "
      "encoder, got '" +
      text + "'");
}

std::string to_string(GraphStrategy strategy) {
  switch (strategy) {
    case GraphStrategy::kOptimal:
      return "optimal";
    case GraphStrategy::kNone:
      return "none";
    case GraphStrategy::kPerBlock:
      return "per-block";
    case GraphStrategy::kEncoder:
      return "encoder";
  }
  TORCH_INTERNAL_ASSERT(false, "unknown GraphStrategy");
}

std::vector<planner::StageMode> stage_modes(
    GraphStrategy strategy, int64_t stages, int64_t encoder_stages) {
  TORCH_INTERNAL_ASSERT(strategy != GraphStrategy::kOptimal);
  std::vector<planner::StageMode> modes(
      static_cast<size_t>(stages), planner::StageMode::kRecord);
  for (int64_t stage = 0; stage < stages; ++stage) {
    if (strategy == GraphStrategy::kPerBlock ||
        (strategy == GraphStrategy::kEncoder && stage < encoder_stages)) {
      modes[static_cast<size_t>(stage)] = planner::StageMode::kCheckpoint;
    }
  }
  return modes;
}

PlanChoice choose_graph_plan(
    const planner::Graph& graph,
    GraphStrategy strategy,
    int64_t encoder_stages,
    const Budget& budget,
    BudgetOrigin origin,
    const planner::SolverOptions& solver) {
  if (strategy == GraphStrategy::kOptimal) {
    return choose_plan(graph, budget, origin, solver);
  }
  return choose_plan(
      graph,
      stage_modes(strategy, graph.size(), encoder_stages),
      budget,
      origin);
}

int64_t extra_forwards(const planner::Plan& plan) {
  int64_t forwards = 0;
  std::set<int64_t> stages;
  for (const planner::Op& op : plan.ops) {
    if (op.kind != planner::OpKind::kBackward) {
      ++forwards;
      stages.insert(op.stage);
    }
  }
  return forwards - static_cast<int64_t>(stages.size());
}

std::string plan_brief(const planner::Plan& plan, size_t max_chars) {
  int64_t recorded = 0, selective = 0, checkpointed = 0, no_save = 0;
  std::set<int64_t> stages;
  for (const planner::Op& op : plan.ops) {
    switch (op.kind) {
      case planner::OpKind::kForwardRecord:
        ++recorded;
        break;
      case planner::OpKind::kForwardSelective:
        ++selective;
        break;
      case planner::OpKind::kForwardCheckpoint:
        ++checkpointed;
        break;
      case planner::OpKind::kForwardNoSave:
        ++no_save;
        break;
      case planner::OpKind::kBackward:
        stages.insert(op.stage);
        break;
    }
  }
  std::string text = plan.to_string();
  if (text.size() > max_chars) {
    const size_t cut = text.rfind(' ', max_chars);
    text = text.substr(0, cut == std::string::npos ? max_chars : cut) + " ...";
  }
  const std::string selective_part =
      selective > 0 ? std::to_string(selective) + " selective, " : "";
  return std::to_string(stages.size()) + " stages, " +
         std::to_string(recorded + selective + checkpointed + no_save) +
         " forwards (" + std::to_string(recorded) + " record, " +
         selective_part + std::to_string(checkpointed) + " checkpoint, " +
         std::to_string(no_save) + " no-save), " +
         std::to_string(extra_forwards(plan)) + " recomputed: " + text;
}

std::optional<std::string> budget_note(const PlanChoice& choice) {
  if (!choice.budget_bytes ||
      *choice.budget_bytes <= choice.store_all_peak_bytes) {
    return std::nullopt;
  }
  std::ostringstream note;
  note << "note: the budget is " << std::fixed << std::setprecision(2)
       << static_cast<double>(*choice.budget_bytes) /
              static_cast<double>(
                  std::max<int64_t>(1, choice.store_all_peak_bytes))
       << "x the no-checkpoint peak "
       << planner::format_bytes(choice.store_all_peak_bytes)
       << ": nothing is recomputed, checkpointing is not needed at this size";
  return note.str();
}

std::optional<std::string> bare_number_hint(
    const std::string& text, bool percentages) {
  // The blanks Budget::parse trims: a unit-less number followed by a
  // newline (or after "total: ") is as unit-less as without it.
  const char* const blanks = " \t\r\n";
  const size_t first = text.find_first_not_of(blanks);
  if (first == std::string::npos) {
    return std::nullopt;
  }
  std::string number =
      text.substr(first, text.find_last_not_of(blanks) - first + 1);
  const std::string total = "total:";
  std::string prefix;
  if (number.size() > total.size() &&
      std::equal(
          total.begin(), total.end(), number.begin(), [](char a, char b) {
            return a == std::tolower(static_cast<unsigned char>(b));
          })) {
    prefix = number.substr(0, total.size());
    number = number.substr(total.size());
    const size_t start = number.find_first_not_of(blanks);
    number = start == std::string::npos ? "" : number.substr(start);
  }
  if (number.empty() ||
      number.find_first_not_of("0123456789.") != std::string::npos) {
    return std::nullopt;
  }
  // Only what could be meant: a percentage up to 100, whole bytes; zero is
  // no budget in any unit.
  const double value = std::strtod(number.c_str(), nullptr);
  if (value == 0) {
    return "'" + text + "': a budget must be at least 1 byte";
  }
  const bool whole = number.find('.') == std::string::npos;
  std::vector<std::string> meant;
  if (prefix.empty() && percentages && value > 0 && value <= 100) {
    meant.push_back(number + "% (of the no-checkpoint peak)");
  }
  meant.push_back(prefix + number + "MiB");
  if (whole) {
    meant.push_back(prefix + number + "B (bytes)");
  }
  // Suggest only what Budget::parse takes ("1..2MiB", "99999999999999999999B"
  // and "1.0000001MiB" are not budgets).
  meant.erase(
      std::remove_if(
          meant.begin(),
          meant.end(),
          [](const std::string& form) {
            try {
              Budget::parse(form.substr(0, form.find(' ')));
              return false;
            } catch (const c10::Error&) {
              return true;
            }
          }),
      meant.end());
  if (meant.empty()) {
    return "'" + text +
           "' has no unit and is not a number of bytes or a "
           "percentage; expected e.g. 512MiB, 1GiB or 50%";
  }
  std::string hint = "'" + text + "' has no unit; did you mean ";
  for (size_t k = 0; k < meant.size(); ++k) {
    hint += (k == 0 ? "" : k + 1 == meant.size() ? " or " : ", ") + meant[k];
  }
  return hint + "?";
}

CLI::Validator budget_validator(bool percentages) {
  return CLI::Validator(
      [percentages](std::string& value) -> std::string {
        if (const std::optional<std::string> hint =
                bare_number_hint(value, percentages)) {
          return *hint;
        }
        try {
          Budget::parse(value);
          return "";
        } catch (const c10::Error& error) {
          return error.what_without_backtrace();
        }
      },
      "BUDGET");
}

}  // namespace remat::cli
