// Plan: equality, the one-line text form and its parser (grammar in plan.h).
#include "remat/planner/plan.h"

#include <limits>
#include <stdexcept>
#include <string>

namespace remat::planner {

bool operator==(const Op& lhs, const Op& rhs) {
  return lhs.kind == rhs.kind && lhs.stage == rhs.stage;
}

bool operator!=(const Op& lhs, const Op& rhs) {
  return !(lhs == rhs);
}

bool operator==(const Plan& lhs, const Plan& rhs) {
  return lhs.ops == rhs.ops;
}

bool operator!=(const Plan& lhs, const Plan& rhs) {
  return !(lhs == rhs);
}

char op_kind_letter(OpKind kind) {
  switch (kind) {
    case OpKind::kForwardNoSave:
      return 'N';
    case OpKind::kForwardCheckpoint:
      return 'C';
    case OpKind::kForwardRecord:
      return 'R';
    case OpKind::kForwardSelective:
      return 'S';
    case OpKind::kBackward:
      return 'B';
  }
  return '?';
}

const char* op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::kForwardNoSave:
      return "forward_no_save";
    case OpKind::kForwardCheckpoint:
      return "forward_checkpoint";
    case OpKind::kForwardRecord:
      return "forward_record";
    case OpKind::kForwardSelective:
      return "forward_selective";
    case OpKind::kBackward:
      return "backward";
  }
  return "unknown";
}

std::string Plan::to_string() const {
  std::string text;
  for (const Op& op : ops) {
    if (!text.empty()) {
      text += ' ';
    }
    text += op_kind_letter(op.kind);
    text += std::to_string(op.stage);
  }
  return text;
}

Plan plan_from_string(std::string_view text) {
  auto fail = [&](size_t offset, const std::string& what) {
    throw std::invalid_argument(
        "remat::planner::plan_from_string: at offset " +
        std::to_string(offset) + ": " + what + " in \"" + std::string(text) +
        "\"");
  };
  Plan plan;
  size_t pos = 0;
  while (pos < text.size()) {
    if (!plan.ops.empty()) {
      if (text[pos] != ' ') {
        fail(pos, std::string("expected ' ', got '") + text[pos] + "'");
      }
      ++pos;
    }
    if (pos >= text.size()) {
      fail(pos, "expected an op after ' ', got the end of the text");
    }
    Op op;
    switch (text[pos]) {
      case 'N':
        op.kind = OpKind::kForwardNoSave;
        break;
      case 'C':
        op.kind = OpKind::kForwardCheckpoint;
        break;
      case 'R':
        op.kind = OpKind::kForwardRecord;
        break;
      case 'S':
        op.kind = OpKind::kForwardSelective;
        break;
      case 'B':
        op.kind = OpKind::kBackward;
        break;
      default:
        fail(
            pos,
            std::string("expected an op kind N, C, R, S or B, got '") +
                text[pos] + "'");
    }
    ++pos;
    size_t digits_begin = pos;
    int64_t stage = 0;
    while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') {
      int digit = text[pos] - '0';
      if (stage > (std::numeric_limits<int64_t>::max() - digit) / 10) {
        fail(digits_begin, "stage index does not fit int64");
      }
      stage = stage * 10 + digit;
      ++pos;
    }
    if (pos == digits_begin) {
      fail(pos, "expected a stage index after the op kind");
    }
    if (text[digits_begin] == '0' && pos - digits_begin > 1) {
      fail(digits_begin, "stage index with a leading zero");
    }
    op.stage = stage;
    plan.ops.push_back(op);
  }
  return plan;
}

}  // namespace remat::planner
