// Chain: validation of the cost model at construction.
//
// Invariant after construction: at least one stage; every byte field and the
// input size >= 0 (backward transients >= -|g_i|); every time finite and >= 0;
// the byte total (see chain.h)
// <= INT64_MAX / 4 so that simulate() and the solvers can add any handful of
// sizes without overflow; the total time is finite.
#include "remat/planner/chain.h"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

#include "check.h"

namespace remat::planner {
namespace {

constexpr int64_t kByteTotalLimit = std::numeric_limits<int64_t>::max() / 4;

[[noreturn]] void fail(const std::string& what) {
  throw std::invalid_argument("remat::planner::Chain: " + what);
}

void check_bytes(int64_t stage, const char* field, int64_t value) {
  if (value < 0) {
    fail(
        "stage " + std::to_string(stage) + " " + field +
        ": expected >= 0, got " + std::to_string(value));
  }
}

void check_ms(int64_t stage, const char* field, double value) {
  if (!std::isfinite(value) || value < 0) {
    fail(
        "stage " + std::to_string(stage) + " " + field +
        ": expected a finite value >= 0, got " + std::to_string(value));
  }
}

// A backward transient may be negative, but never below -|g_i|.
void check_backward_tmp(
    int64_t stage, const char* field, int64_t value, int64_t gradient_bytes) {
  if (value < -gradient_bytes) {
    fail(
        "stage " + std::to_string(stage) + " " + field + ": expected >= -" +
        std::to_string(gradient_bytes) +
        " (minus the size of the gradient the backward produces; a "
        "backward never peaks below the bytes held before it), got " +
        std::to_string(value));
  }
}

// Adds `weight * value` to `total`, failing (naming stage and field) if the
// total passes kByteTotalLimit. REQUIRES: total, value >= 0; weight 1 or 2.
void add_bytes(
    int64_t& total,
    int64_t stage,
    const char* field,
    int64_t value,
    int64_t weight) {
  if (value > (kByteTotalLimit - total) / weight) {
    fail(
        "stage " + std::to_string(stage) + " " + field + ": " +
        std::to_string(value) +
        " makes the chain's byte total exceed INT64_MAX / 4");
  }
  total += weight * value;
}

// Each field of a model state >= 0 and their sum within the byte limit
// (the state is added to peaks in reports and subtracted from total budgets).
void check_model_state(const ModelState& state) {
  int64_t total = 0;
  for (const auto& [field, value] :
       {std::pair<const char*, int64_t>{
            "parameter_bytes", state.parameter_bytes},
        {"gradient_bytes", state.gradient_bytes},
        {"optimizer_bytes", state.optimizer_bytes}}) {
    if (value < 0) {
      fail(
          std::string("model_state.") + field + ": expected >= 0, got " +
          std::to_string(value));
    }
    if (value > kByteTotalLimit - total) {
      fail(
          std::string("model_state.") + field + ": " + std::to_string(value) +
          " makes the model state exceed INT64_MAX / 4");
    }
    total += value;
  }
}

}  // namespace

Chain::Chain(
    std::vector<StageCost> stages,
    int64_t input_bytes,
    int64_t resident_bytes,
    ModelState model_state)
    : stages_(std::move(stages)),
      input_bytes_(input_bytes),
      resident_bytes_(resident_bytes),
      model_state_(model_state) {
  if (stages_.empty()) {
    fail("expected at least one stage, got an empty chain");
  }
  if (input_bytes_ < 0) {
    fail("input_bytes: expected >= 0, got " + std::to_string(input_bytes_));
  }
  int64_t byte_total = 0;
  if (input_bytes_ > kByteTotalLimit / 2) {
    fail(
        "input_bytes: " + std::to_string(input_bytes_) +
        " makes the chain's byte total exceed INT64_MAX / 4");
  }
  byte_total = 2 * input_bytes_;
  if (resident_bytes_ < 0) {
    fail(
        "resident_bytes: expected >= 0, got " +
        std::to_string(resident_bytes_));
  }
  if (resident_bytes_ > kByteTotalLimit - byte_total) {
    fail(
        "resident_bytes: " + std::to_string(resident_bytes_) +
        " makes the chain's byte total exceed INT64_MAX / 4");
  }
  byte_total += resident_bytes_;
  check_model_state(model_state_);
  double total_ms = 0;
  for (int64_t i = 0; i < size(); ++i) {
    const StageCost& s = stages_[i];
    check_ms(i, "forward_ms", s.forward_ms);
    check_ms(i, "backward_ms", s.backward_ms);
    check_bytes(i, "output_bytes", s.output_bytes);
    check_bytes(i, "saved_bytes", s.saved_bytes);
    check_bytes(i, "forward_tmp_bytes", s.forward_tmp_bytes);
    check_bytes(i, "gathered_bytes", s.gathered_bytes);
    const int64_t gradient_bytes =
        i == 0 ? input_bytes_ : stages_[i - 1].output_bytes;
    check_backward_tmp(
        i, "backward_tmp_bytes", s.backward_tmp_bytes, gradient_bytes);
    add_bytes(byte_total, i, "output_bytes", s.output_bytes, 2);
    add_bytes(byte_total, i, "saved_bytes", s.saved_bytes, 1);
    add_bytes(byte_total, i, "forward_tmp_bytes", s.forward_tmp_bytes, 1);
    add_bytes(byte_total, i, "gathered_bytes", s.gathered_bytes, 1);
    add_bytes(byte_total, i, "gathered_bytes", s.gathered_bytes, 2);
    add_bytes(
        byte_total,
        i,
        "backward_tmp_bytes",
        std::max<int64_t>(0, s.backward_tmp_bytes),
        1);
    if (s.record_tmp_bytes) {
      check_bytes(i, "record_tmp_bytes", *s.record_tmp_bytes);
      add_bytes(byte_total, i, "record_tmp_bytes", *s.record_tmp_bytes, 1);
    }
    double selective_ms = 0;
    if (s.selective) {
      const SelectiveCost& c = *s.selective;
      check_bytes(i, "selective.saved_bytes", c.saved_bytes);
      check_bytes(i, "selective.forward_tmp_bytes", c.forward_tmp_bytes);
      check_backward_tmp(
          i,
          "selective.backward_tmp_bytes",
          c.backward_tmp_bytes,
          gradient_bytes);
      check_ms(i, "selective.recompute_ms", c.recompute_ms);
      add_bytes(byte_total, i, "selective.saved_bytes", c.saved_bytes, 1);
      add_bytes(
          byte_total, i, "selective.forward_tmp_bytes", c.forward_tmp_bytes, 1);
      add_bytes(
          byte_total,
          i,
          "selective.backward_tmp_bytes",
          std::max<int64_t>(0, c.backward_tmp_bytes),
          1);
      selective_ms = c.recompute_ms;
    }
    total_ms += s.forward_ms + s.backward_ms + selective_ms;
    if (!std::isfinite(total_ms * static_cast<double>(size() + 1))) {
      fail(
          "stage " + std::to_string(i) +
          " forward_ms/backward_ms: the chain's total time (times the "
          "number of stages) is not finite");
    }
  }
}

const StageCost& Chain::stage(int64_t index) const {
  if (index < 0 || index >= size()) {
    throw std::out_of_range(
        "remat::planner::Chain::stage: index " + std::to_string(index) +
        " out of range [0, " + std::to_string(size()) + ")");
  }
  return stages_[index];
}

int64_t Chain::value_bytes(int64_t index) const {
  if (index < 0 || index > size()) {
    throw std::out_of_range(
        "remat::planner::Chain::value_bytes: index " + std::to_string(index) +
        " out of range [0, " + std::to_string(size()) + "]");
  }
  return index == 0 ? input_bytes_ : stages_[index - 1].output_bytes;
}

bool operator==(const SelectiveCost& lhs, const SelectiveCost& rhs) {
  return lhs.saved_bytes == rhs.saved_bytes &&
         lhs.forward_tmp_bytes == rhs.forward_tmp_bytes &&
         lhs.backward_tmp_bytes == rhs.backward_tmp_bytes &&
         lhs.recompute_ms == rhs.recompute_ms;
}

bool operator!=(const SelectiveCost& lhs, const SelectiveCost& rhs) {
  return !(lhs == rhs);
}

bool operator==(const StageCost& lhs, const StageCost& rhs) {
  return lhs.forward_ms == rhs.forward_ms &&
         lhs.backward_ms == rhs.backward_ms &&
         lhs.output_bytes == rhs.output_bytes &&
         lhs.saved_bytes == rhs.saved_bytes &&
         lhs.forward_tmp_bytes == rhs.forward_tmp_bytes &&
         lhs.backward_tmp_bytes == rhs.backward_tmp_bytes &&
         lhs.record_tmp_bytes == rhs.record_tmp_bytes &&
         lhs.selective == rhs.selective &&
         lhs.gathered_bytes == rhs.gathered_bytes;
}

bool operator!=(const StageCost& lhs, const StageCost& rhs) {
  return !(lhs == rhs);
}

bool operator==(const ModelState& lhs, const ModelState& rhs) {
  return lhs.parameter_bytes == rhs.parameter_bytes &&
         lhs.gradient_bytes == rhs.gradient_bytes &&
         lhs.optimizer_bytes == rhs.optimizer_bytes;
}

bool operator!=(const ModelState& lhs, const ModelState& rhs) {
  return !(lhs == rhs);
}

Chain Chain::with_model_state(const ModelState& state) const {
  return Chain(stages_, input_bytes_, resident_bytes_, state)
      .with_cold_write_ms_per_mib(cold_write_ms_per_mib_);
}

Chain Chain::with_cold_write_ms_per_mib(double ms_per_mib) const {
  // Its cost is charged for every MiB of a peak (at most 2^43 MiB): that
  // product must be finite too.
  if (!std::isfinite(ms_per_mib * 0x1p43) || ms_per_mib < 0) {
    fail(
        "cold_write_ms_per_mib: expected >= 0 and finite for any peak (at "
        "most 1e295), got " +
        detail::number_text(ms_per_mib));
  }
  Chain copy = *this;
  copy.cold_write_ms_per_mib_ = ms_per_mib;
  return copy;
}

bool operator==(const Chain& lhs, const Chain& rhs) {
  return lhs.input_bytes() == rhs.input_bytes() &&
         lhs.resident_bytes() == rhs.resident_bytes() &&
         lhs.model_state() == rhs.model_state() &&
         lhs.cold_write_ms_per_mib() == rhs.cold_write_ms_per_mib() &&
         lhs.stages() == rhs.stages();
}

bool operator!=(const Chain& lhs, const Chain& rhs) {
  return !(lhs == rhs);
}

}  // namespace remat::planner
