// Chain validation: every rejected input names the stage and the field.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "remat/planner.h"

namespace remat::planner {
namespace {

std::string error_of(std::vector<StageCost> stages, int64_t input_bytes) {
  try {
    Chain chain(std::move(stages), input_bytes);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(Chain, KeepsWhatItIsGiven) {
  Chain chain({StageCost{1, 2, 30, 40, 5, 6}, StageCost{3, 4, 50, 60}}, 20);
  EXPECT_EQ(chain.size(), 2);
  EXPECT_EQ(chain.input_bytes(), 20);
  EXPECT_EQ(chain.stage(1).saved_bytes, 60);
  EXPECT_EQ(chain.value_bytes(0), 20);
  EXPECT_EQ(chain.value_bytes(2), 50);
  EXPECT_THROW(chain.stage(2), std::out_of_range);
}

TEST(Chain, KeepsItsColdWriteCostThroughCopiesAndRejectsABadOne) {
  const Chain plain({StageCost{1, 2, 10, 10}}, 4);
  EXPECT_EQ(plain.cold_write_ms_per_mib(), 0);
  const Chain chain = plain.with_cold_write_ms_per_mib(0.06);
  EXPECT_EQ(chain.cold_write_ms_per_mib(), 0.06);
  EXPECT_NE(chain, plain);
  EXPECT_EQ(
      chain.with_model_state(ModelState{1, 2, 3}).cold_write_ms_per_mib(),
      0.06);
  EXPECT_EQ(graph_of(chain).cold_write_ms_per_mib(), 0.06);
  EXPECT_EQ(graph_of(chain).as_chain(), chain);
  for (double bad : {-0.5, std::nan(""), HUGE_VAL, 1.7e308}) {
    try {
      (void)chain.with_cold_write_ms_per_mib(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(
          std::string(e.what()).find("cold_write_ms_per_mib: expected >= 0 "
                                     "and finite for any peak"),
          std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(chain.cold_write_ms_per_mib(), 0.06);  // unchanged by a refusal
  const Graph graph = graph_of(plain);
  EXPECT_THROW(
      (void)graph.with_cold_write_ms_per_mib(-1), std::invalid_argument);
}

TEST(Chain, RejectsAnEmptyChain) {
  EXPECT_NE(error_of({}, 1).find("empty"), std::string::npos);
}

TEST(Chain, RejectsNegativeSizesNamingStageAndField) {
  StageCost bad{1, 1, 10, 10};
  bad.forward_tmp_bytes = -3;
  const std::string error = error_of({StageCost{}, bad}, 1);
  EXPECT_NE(error.find("stage 1"), std::string::npos) << error;
  EXPECT_NE(error.find("forward_tmp_bytes"), std::string::npos) << error;
  EXPECT_NE(error.find("-3"), std::string::npos) << error;
  EXPECT_NE(error_of({StageCost{}}, -1).find("input_bytes"), std::string::npos);
}

TEST(Chain, RejectsANegativeRecordTransient) {
  StageCost bad{1, 1, 10, 10};
  bad.record_tmp_bytes = -5;
  const std::string error = error_of({bad}, 1);
  EXPECT_NE(error.find("stage 0"), std::string::npos) << error;
  EXPECT_NE(error.find("record_tmp_bytes"), std::string::npos) << error;
  EXPECT_NE(error.find("-5"), std::string::npos) << error;
}

TEST(Chain, ChecksSelectiveCostsAsTheFieldsOfTheSameName) {
  StageCost stage{1, 1, 10, 10};
  stage.selective = SelectiveCost{4, 0, -3, 0.25};
  EXPECT_EQ(error_of({stage}, 3), "");  // backward tmp down to -|x_0| = -3
  stage.selective->backward_tmp_bytes = -4;
  std::string error = error_of({stage}, 3);
  EXPECT_NE(error.find("selective.backward_tmp_bytes"), std::string::npos)
      << error;
  EXPECT_NE(error.find("-4"), std::string::npos) << error;
  stage.selective = SelectiveCost{-1, 0, 0, 0};
  error = error_of({stage}, 3);
  EXPECT_NE(error.find("stage 0 selective.saved_bytes"), std::string::npos)
      << error;
  stage.selective = SelectiveCost{1, 0, 0, -0.5};
  error = error_of({stage}, 3);
  EXPECT_NE(error.find("selective.recompute_ms"), std::string::npos) << error;
}

TEST(Chain, AcceptsANegativeBackwardTransientDownToMinusTheGradient) {
  // Stage 1's backward produces g_1, of |x_1| = 10 bytes.
  StageCost first{1, 1, 10, 10};
  StageCost second{1, 1, 10, 10};
  second.backward_tmp_bytes = -10;
  EXPECT_NO_THROW(Chain({first, second}, 4));
  second.backward_tmp_bytes = -11;
  const std::string error = error_of({first, second}, 4);
  EXPECT_NE(error.find("stage 1 backward_tmp_bytes"), std::string::npos)
      << error;
  EXPECT_NE(error.find(">= -10"), std::string::npos) << error;
  EXPECT_NE(error.find("-11"), std::string::npos) << error;
  // Stage 0's gradient is the chain input's.
  first.backward_tmp_bytes = -5;
  EXPECT_NE(error_of({first}, 4).find(">= -4"), std::string::npos);
}

TEST(Chain, RecordTransientDefaultsToTheForwardTransient) {
  StageCost cost{1, 1, 10, 10};
  cost.forward_tmp_bytes = 6;
  EXPECT_EQ(cost.record_transient(), 6);
  cost.record_tmp_bytes = 2;
  EXPECT_EQ(cost.record_transient(), 2);
  StageCost same = cost;
  same.record_tmp_bytes.reset();
  EXPECT_NE(Chain({cost}, 1), Chain({same}, 1));
}

TEST(Chain, RejectsNegativeOrNonFiniteTimes) {
  StageCost nan_stage;
  nan_stage.backward_ms = std::nan("");
  std::string error = error_of({nan_stage}, 0);
  EXPECT_NE(error.find("stage 0 backward_ms"), std::string::npos) << error;
  StageCost negative;
  negative.forward_ms = -1;
  error = error_of({StageCost{}, StageCost{}, negative}, 0);
  EXPECT_NE(error.find("stage 2 forward_ms"), std::string::npos) << error;
  StageCost infinite;
  infinite.forward_ms = std::numeric_limits<double>::infinity();
  EXPECT_NE(error_of({infinite}, 0).find("forward_ms"), std::string::npos);
}

TEST(Chain, RejectsByteTotalsThatWouldOverflow) {
  StageCost big;
  big.saved_bytes = std::numeric_limits<int64_t>::max() / 8;
  const std::string error = error_of({big, big, big}, 0);
  EXPECT_NE(error.find("stage 2 saved_bytes"), std::string::npos) << error;
  EXPECT_NE(error.find("exceed"), std::string::npos) << error;
}

}  // namespace
}  // namespace remat::planner
