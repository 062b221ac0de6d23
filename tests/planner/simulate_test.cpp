// simulate(): peaks and times computed by hand from the memory model, and one
// test per broken rule.
#include <gtest/gtest.h>

#include "remat/planner.h"

namespace remat::planner {
namespace {

// Stage i: output 10 * (i + 1), saved output + 5, forward tmp 3, backward 7.
Chain three_stages() {
  std::vector<StageCost> stages;
  for (int64_t i = 0; i < 3; ++i) {
    stages.push_back(
        StageCost{1.0 + i, 2.0 + i, 10 * (i + 1), 10 * (i + 1) + 5, 3, 7});
  }
  return Chain(stages, 4);
}

TEST(Simulate, CountsStoreAllByTheMemoryModel) {
  const Chain chain = three_stages();
  const Simulation sim = simulate(chain, plan_from_string("R0 R1 R2 B2 B1 B0"));
  ASSERT_TRUE(sim.valid) << sim.error;
  // Records 15 + 25 + 35 on top of x_0 = 4 -> 79. B2: + g_3 (30) + g_2 (20)
  // + tmp 7 = 136 is the peak.
  EXPECT_EQ(sim.peak_bytes, 4 + 15 + 25 + 35 + 30 + 20 + 7);
  EXPECT_DOUBLE_EQ(sim.time_ms, (1 + 2 + 3) + (2 + 3 + 4));
}

TEST(Simulate, StepTimeChargesColdWritesOncePerByteOfThePeak) {
  const Plan store_all = plan_from_string("R0 R1 R2 B2 B1 B0");
  const Plan segment = plan_from_string("C0 N1 R2 B2 R0 R1 B1 B0");
  const Chain plain = three_stages();
  const Simulation before = simulate(plain, segment);
  ASSERT_TRUE(before.valid) << before.error;
  EXPECT_EQ(before.step_ms, before.time_ms);  // default: no cold writes
  const Chain chain = plain.with_cold_write_ms_per_mib(0.25);
  for (const Plan& plan : {store_all, segment}) {
    const Simulation sim = simulate(chain, plan);
    ASSERT_TRUE(sim.valid) << sim.error;
    EXPECT_EQ(sim.time_ms, simulate(plain, plan).time_ms);  // what solvers see
    EXPECT_EQ(sim.peak_bytes, simulate(plain, plan).peak_bytes);
    EXPECT_DOUBLE_EQ(
        sim.step_ms,
        sim.time_ms + 0.25 * static_cast<double>(sim.peak_bytes) / (1 << 20));
    // One model for chains and graphs.
    const Simulation as_graph = simulate(graph_of(chain), plan);
    EXPECT_DOUBLE_EQ(as_graph.step_ms, sim.step_ms);
  }
  // A plan of lower peak is charged less.
  EXPECT_LT(
      simulate(chain, segment).step_ms - simulate(chain, segment).time_ms,
      simulate(chain, store_all).step_ms - simulate(chain, store_all).time_ms);
}

TEST(Simulate, CountsACheckpointedSegment) {
  const Chain chain = three_stages();
  const Simulation sim =
      simulate(chain, plan_from_string("C0 N1 R2 B2 R0 R1 B1 B0"));
  ASSERT_TRUE(sim.valid) << sim.error;
  // N1: x_0 4 + x_1 10 + x_2 20 + tmp 3 = 37. After: 4 + 20.
  // R2: 24 + 35 + 3 = 62. B2: 4 + 20 + 35 + g_3 30 + g_2 20 + 7 = 116, then
  // R_2, g_3 and the kept x_2 go: 4 + g_2 20 = 24. R0: 24 + 15 + 3; R1: 24 +
  // 15 + 25 + 3 = 67; B1: 4 + 15 + 25 + 20 + g_1 10 + 7 = 81.
  EXPECT_EQ(sim.peak_bytes, 116);
  EXPECT_DOUBLE_EQ(sim.time_ms, (1 + 2) + 3 + (2 + 3 + 4) + (1 + 2));
}

TEST(Simulate, CountsResidentAndGatheredParameters) {
  // three_stages() with 100 resident bytes and stage 1 gathering 6.
  std::vector<StageCost> stages = three_stages().stages();
  stages[1].gathered_bytes = 6;
  const Chain chain(stages, 4, 100);
  EXPECT_EQ(chain.base_bytes(), 104);
  const Simulation sim = simulate(chain, plan_from_string("R0 R1 R2 B2 B1 B0"));
  ASSERT_TRUE(sim.valid) << sim.error;
  // As CountsStoreAllByTheMemoryModel, plus 100 in every op; R1 peaks at
  // 104 + 15 + 25 + 3 + 6; B1 holds its parameters and their gradients:
  // 104 + 15 + 25 + g_2 20 + g_1 10 + 7 + 2 * 6.
  EXPECT_EQ(sim.op_peak_bytes[1], 104 + 15 + 25 + 3 + 6);
  EXPECT_EQ(sim.op_peak_bytes[4], 104 + 15 + 25 + 20 + 10 + 7 + 12);
  EXPECT_EQ(sim.peak_bytes, 100 + 4 + 15 + 25 + 35 + 30 + 20 + 7);
  // The minimum any plan needs includes the resident bytes.
  EXPECT_GE(min_feasible_budget_bytes(chain), 104);
  EXPECT_EQ(
      min_feasible_budget_bytes(chain),
      min_feasible_budget_bytes(Chain(stages, 4)) + 100);
}

TEST(Simulate, UsesTheRecordTransientForRecordedForwardsOnly) {
  // One stage kind whose no-grad forward needs 40 extra bytes and whose
  // recorded forward needs 1: the peaks of R and of C/N follow their own.
  std::vector<StageCost> stages(3, StageCost{1, 2, 10, 15, 40, 0});
  for (StageCost& s : stages) {
    s.record_tmp_bytes = 1;
  }
  const Chain chain(stages, 10);
  // Store-all: x_0 10 + R0 15 + R1 15 + R2 15 (+1 inside R2) = 56; B2: 55 +
  // g_3 10 + g_2 10 = 75.
  EXPECT_EQ(
      simulate(chain, plan_from_string("R0 R1 R2 B2 B1 B0")).peak_bytes, 75);
  // C0 N1: x_0 10 + x_1 10 + x_2 10 + 40 = 70 inside N1, still below B2's
  // 10 + x_2 10 + R2 15 + g_3 10 + g_2 10 = 55; so the peak is N1's 70.
  EXPECT_EQ(
      simulate(chain, plan_from_string("C0 N1 R2 B2 R0 R1 B1 B0")).peak_bytes,
      70);
}

TEST(Simulate, ANegativeBackwardTransientLowersTheBackwardPeak) {
  // Two stages of output 10, saved 10; input 10.
  std::vector<StageCost> stages(2, StageCost{1, 1, 10, 10});
  const Plan plan = plan_from_string("R0 R1 B1 B0");
  // B1: x_0 10 + R0 10 + R1 10 + g_2 10 + g_1 10 = 50 is the peak.
  EXPECT_EQ(simulate(Chain(stages, 10), plan).peak_bytes, 50);
  // Freeing 6 bytes before g_1 exists: 44; the other ops stay below.
  stages[1].backward_tmp_bytes = -6;
  EXPECT_EQ(simulate(Chain(stages, 10), plan).peak_bytes, 44);
  // At -|g_1| the backward adds nothing: the peak is before B1, 40.
  stages[1].backward_tmp_bytes = -10;
  EXPECT_EQ(simulate(Chain(stages, 10), plan).peak_bytes, 40);
}

struct BrokenPlan {
  const char* plan;
  const char* error;
};

TEST(Simulate, NamesTheFirstBrokenRule) {
  const Chain chain = three_stages();
  for (const BrokenPlan& broken : std::vector<BrokenPlan>{
           {"R0 R1 R2 B2 B0 B1", "op 4 (B0): backward of stage 0 out of order"},
           {"R0 N1 R2 B2 B1 B0",
            "op 4 (B1): backward of stage 1, which is not"},
           {"N0 N1 R2 B2 R1", "op 4 (R1): forward of stage 1 needs x_1"},
           {"R0 R1 R2 B2 B1", "the plan ends before the backward of stage 0"},
           {"R0 R1", "the plan ends before the backward of stage 2"},
           {"R0 R3", "op 1 (R3): stage 3 out of range [0, 3)"},
           {"R0 R1 N2", "must be kForwardRecord"},
           {"R0 R0", "op 1 (R0): forward of stage 0 would compute x_1, which"},
           {"R0 R1 R2 B2 R2", "forward of stage 2 after its backward"},
           {"R0 R1 R2 B2 B1 B0 B0", "after every backward has run"},
       }) {
    const Simulation sim = simulate(chain, plan_from_string(broken.plan));
    EXPECT_FALSE(sim.valid) << broken.plan;
    EXPECT_NE(sim.error.find(broken.error), std::string::npos)
        << broken.plan << ": " << sim.error;
  }
}

// three_stages() with a selective way for stages 1 and 2: saved 12 and 22
// (output + 2), forward tmp 1, backward tmp 9, recompute 0.5 ms.
Chain three_stages_selective() {
  std::vector<StageCost> stages = three_stages().stages();
  for (int64_t i = 1; i < 3; ++i) {
    stages[i].selective = SelectiveCost{10 * (i + 1) + 2, 1, 9, 0.5};
  }
  return Chain(stages, 4);
}

TEST(Simulate, CountsSelectiveForwardsWithTheirOwnCosts) {
  const Chain chain = three_stages_selective();
  const Simulation sim = simulate(chain, plan_from_string("R0 S1 S2 B2 B1 B0"));
  ASSERT_TRUE(sim.valid) << sim.error;
  // R0: 4 + 15 + 3 = 22. S1: 19 + 22 + 1 = 42. S2: 41 + 32 + 1 = 74.
  // B2: 4 + 15 + 22 + 32 + g_3 30 + g_2 20 + 9 = 132; then R_2, g_3 go:
  // 4 + 15 + 22 + 20 = 61. B1: 61 + g_1 10 + 9 = 80; then 4 + 15 + 10.
  // B0: 29 + g_0 4 + 7 = 40.
  EXPECT_EQ(sim.peak_bytes, 132);
  EXPECT_EQ(sim.op_peak_bytes[4], 80);
  EXPECT_EQ(sim.live_after_bytes[4], 4 + 15 + 10);
  EXPECT_DOUBLE_EQ(sim.time_ms, (1 + 2 + 3) + (2 + 3.5 + 4.5));
}

TEST(Simulate, RefusesASelectiveForwardOfAStageWithoutSelectiveCost) {
  const Chain chain = three_stages_selective();
  const Simulation sim = simulate(chain, plan_from_string("S0 R1 R2"));
  EXPECT_FALSE(sim.valid);
  EXPECT_NE(
      sim.error.find("op 0 (S0): selective forward of stage 0, which "
                     "has no selective cost"),
      std::string::npos)
      << sim.error;
  // The last stage may be run selectively; any other forward is refused.
  EXPECT_TRUE(simulate(chain, plan_from_string("R0 R1 S2 B2 B1 B0")).valid);
  EXPECT_NE(
      simulate(chain, plan_from_string("R0 R1 C2"))
          .error.find("must be kForwardRecord or kForwardSelective"),
      std::string::npos);
}

TEST(Replay, LeavesTheStateUnchangedOnABadOp) {
  const Chain chain = three_stages();
  Replay replay(chain);
  EXPECT_FALSE(replay.apply({OpKind::kBackward, 2}).empty());
  EXPECT_EQ(replay.current_bytes(), 4);
  EXPECT_EQ(replay.holding(0), Replay::Holding::kKept);
  EXPECT_TRUE(replay.apply({OpKind::kForwardRecord, 0}).empty());
  EXPECT_EQ(replay.holding(1), Replay::Holding::kInRecord);
  EXPECT_TRUE(replay.recorded(0));
  EXPECT_FALSE(replay.recorded_selectively(0));
  try {
    (void)replay.recorded_selectively(-1);
    ADD_FAILURE() << "no error";
  } catch (const std::out_of_range& error) {
    EXPECT_NE(
        std::string(error.what())
            .find("Replay::recorded_selectively: stage -1"),
        std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace remat::planner
