// strategy.cpp: plan summaries for the tool's reports (strategy.h).
#include "strategy.h"

#include <set>

namespace remat::cli {

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

}  // namespace remat::cli
