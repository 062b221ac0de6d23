// e2_variants.cpp — scenario E2-variants: E2's comparison by prediction alone
// on finer and deeper versions of its chains, and what the planner's memory
// resolution costs.
//
// No training steps: each chain is profiled, then per budget of 10% ... 100%
// of the store-all peak (where some plan fits) the optimal plan's predicted
// time (simulate()) is compared with the fastest solve_uniform(k) (the
// schedule of checkpoint_sequential(k)) whose predicted peak fits; and the
// optimal plan's predicted time at 500 memory slots with that at 5000.
// "Split" chains have every ConvBnRelu / LinearRelu child replaced by its
// layers: the same computation as a finer chain, which gives the planner
// more places to cut.
#include <algorithm>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "chain_plans.h"
#include "harness/scenario.h"
#include "models/models.h"

namespace remat::bench {
namespace {

torch::nn::Sequential split_children(const torch::nn::Sequential& model) {
  torch::nn::Sequential split;
  for (const auto& child : *model) {
    if (auto conv = std::dynamic_pointer_cast<remat::models::ConvBnReluImpl>(
            child.ptr())) {
      split->push_back(conv->conv);
      split->push_back(conv->bn);
      split->push_back(torch::nn::ReLU());
    } else if (
        auto linear = std::dynamic_pointer_cast<remat::models::LinearReluImpl>(
            child.ptr())) {
      split->push_back(linear->linear);
      split->push_back(torch::nn::ReLU());
      if (!linear->dropout.is_empty()) {
        split->push_back(linear->dropout);
      }
    } else {
      split->push_back(child);
    }
  }
  return split;
}

std::vector<Cell> predict_variant(
    const std::string& name,
    torch::nn::Sequential model,
    const torch::Tensor& input) {
  const planner::Chain chain = profile_for_planning(model, input);
  const planner::Simulation store_all =
      planner::simulate(chain, planner::solve_store_all(chain));
  const int64_t minimum = planner::min_feasible_budget_bytes(chain);
  std::vector<planner::Simulation> uniform;
  for (int64_t k = 1; k <= chain.size(); ++k) {
    uniform.push_back(
        planner::simulate(chain, planner::solve_uniform(chain, k)));
  }
  std::vector<double> ratios;
  double worst_slots = 1;
  for (int percent = 10; percent <= 100; percent += 10) {
    const int64_t budget = store_all.peak_bytes * percent / 100;
    if (budget < minimum) {
      continue;
    }
    const double optimal_ms =
        planner::simulate(chain, *planner::solve_optimal(chain, budget))
            .time_ms;
    const double fine_ms =
        planner::simulate(chain, *planner::solve_optimal(chain, budget, {5000}))
            .time_ms;
    worst_slots = std::max(worst_slots, optimal_ms / fine_ms);
    std::optional<double> best_uniform_ms;
    for (const planner::Simulation& simulation : uniform) {
      if (simulation.peak_bytes <= budget &&
          (!best_uniform_ms || simulation.time_ms < *best_uniform_ms)) {
        best_uniform_ms = simulation.time_ms;
      }
    }
    if (best_uniform_ms) {
      ratios.push_back(optimal_ms / *best_uniform_ms);
    }
  }
  return {
      Cell::text(name),
      Cell::integer(chain.size()),
      Cell::integer(static_cast<int64_t>(ratios.size())),
      ratios.empty() ? Cell::empty() : Cell::ratio(geometric_mean(ratios)),
      ratios.empty()
          ? Cell::empty()
          : Cell::ratio(*std::max_element(ratios.begin(), ratios.end())),
      Cell::number(worst_slots, 4)};
}

Section run_variants(const E2Sizes& sizes, const Context& context) {
  Section section;
  section.title = "E2 variants — prediction on finer and deeper chains";
  section.add_text(
      "Prediction only (simulate() on profiled chains, no training steps): "
      "the optimal plan against the fastest checkpoint_sequential(k) by "
      "predicted peak and time, at the budgets 10% … 100% of store-all where "
      "both fit. `500 / 5000 slots`: the optimal plan's predicted time at the "
      "default 500 memory slots over that at 5000, worst budget.");
  Table table;
  table.name = "predicted";
  table.columns = {
      "chain",
      "stages",
      "budgets",
      "geometric mean ratio",
      "worst ratio",
      "500 / 5000 slots"};
  const int64_t resnet_batch = sizes.resnet(context);
  const auto images = [&](int64_t side) {
    return torch::randn({resnet_batch, 3, side, side});
  };
  const auto resnet = [](int64_t blocks) {
    torch::manual_seed(11);
    return remat::models::resnet_chain(
        remat::models::ResNetChainOptions().blocks_per_stage(blocks));
  };
  table.add_row(predict_variant("ResNet (E2's)", resnet(2), images(32)));
  table.add_row(
      predict_variant("ResNet, split", split_children(resnet(2)), images(32)));
  table.add_row(predict_variant(
      "ResNet, split, 3 blocks per stage",
      split_children(resnet(3)),
      images(32)));
  table.add_row(predict_variant(
      "ResNet, split, 64×64 images", split_children(resnet(2)), images(64)));
  const int64_t mlp_batch = sizes.mlp(context);
  const auto widths = remat::models::varying_mlp_widths(16);
  const auto mlp = [&](double dropout) {
    torch::manual_seed(12);
    return remat::models::mlp_chain(
        remat::models::MlpChainOptions(widths).dropout(dropout));
  };
  const auto rows = torch::randn({mlp_batch, widths[0]});
  table.add_row(predict_variant("MLP (E2's)", mlp(0), rows));
  table.add_row(predict_variant(
      "MLP, Linear and ReLU split", split_children(mlp(0)), rows));
  table.add_row(predict_variant(
      "MLP, split, dropout 0.1", split_children(mlp(0.1)), rows));
  section.add_table(std::move(table));
  return section;
}

}  // namespace

const bool kE2VariantsRegistered = register_scenario(
    {"E2-variants",
     "E2 by prediction only, on finer and deeper chains; 500 vs 5000 slots",
     25,
     [](CLI::App& command) -> ScenarioRun {
       auto sizes = std::make_shared<E2Sizes>();
       sizes->add_flags(command);
       return [sizes](const Context& context) {
         return run_variants(*sizes, context);
       };
     }});

}  // namespace remat::bench
