// plan_a_chain: the torch-free planner on its own (links remat::planner only).
// Builds a chain of 12 identical stages, asks for the fastest schedule that
// fits in half of the store-everything peak, and prints it with explain():
// what each stage keeps and the predicted memory op by op.
#include <iostream>

#include <remat/planner.h>

int main() {
  using namespace remat::planner;
  std::vector<StageCost> stages(12);
  for (auto& stage : stages) {
    stage.forward_ms = 1.0;
    stage.backward_ms = 2.0;
    stage.output_bytes = 4 << 20;
    stage.saved_bytes = 12 << 20;
  }
  Chain chain(stages, /*input_bytes=*/4 << 20);
  const int64_t store_all = simulate(chain, solve_store_all(chain)).peak_bytes;
  auto plan = solve_optimal(chain, store_all / 2);
  if (!plan) {
    std::cerr << "no plan fits; minimum is " << min_feasible_budget_bytes(chain)
              << " bytes\n";
    return 2;
  }
  Simulation sim = simulate(chain, *plan);
  std::cout << "plan: " << plan->to_string() << "\n"
            << "predicted peak " << sim.peak_bytes << " B of " << store_all
            << " B, predicted time " << sim.time_ms << " ms\n\n"
            << explain(chain, *plan);
  return sim.valid ? 0 : 1;
}
