// e5_planner.cpp — scenario E5: how long the planner's solvers take.
//
// Chains: seeded random heterogeneous chains (per stage: output 1-4 MiB,
// saved 1-3x the output, a forward and a backward transient each with
// probability 0.2, forward 0.5-2 ms, backward 1-4 ms) of each length of
// --stages. Budget = min feasible + --fraction * (store-all peak - min
// feasible). Per chain length and SolverOptions::threads value: solve_optimal
// run --runs times, its wall time (median, min) and the process's CPU time
// (median; all threads: on a loaded machine wall time includes waiting for a
// core, CPU time does not), solve_chen_greedy's time, and the optimal plan's
// simulated time and peak relative to store-all and to the budget. The plan
// must not depend on the thread count (checked; the scenario fails if it
// does). Graphs (second table): seeded U-Net-shaped graphs (4 levels of
// 4 or 8 stages, decoder levels reading the skip of their encoder level) and
// seeded random DAGs (each stage reads the one before and, with probability
// 0.3, one random earlier value) of 100, 200, 1,600 and 10,000 stages: the time
// of min_feasible_budget_bytes and of solve_optimal at the middle of the
// feasible range, one thread. No LibTorch work: the Runner is not used, only
// the Timer.
#include <algorithm>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "harness/scenario.h"
#include "remat/measure/timer.h"
#include "remat/planner.h"

namespace remat::bench {
namespace {

struct E5Options {
  std::vector<int64_t> stages{50, 100, 200, 500};  // chain lengths
  std::vector<int64_t> threads{1, 0};  // SolverOptions::threads; 0: automatic
  int64_t slots = planner::SolverOptions{}.memory_slots;  // default 500
  double fraction = 0.25;  // budget position, min .. store-all
  int runs = 5;            // solves per row
};

planner::Chain random_chain(int64_t stages, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> output_bytes(1 << 20, 4 << 20);
  std::uniform_real_distribution<double> saved_factor(1.0, 3.0);
  std::uniform_real_distribution<double> forward_ms(0.5, 2.0);
  std::uniform_real_distribution<double> backward_ms(1.0, 4.0);
  std::bernoulli_distribution has_transient(0.2);
  std::vector<planner::StageCost> costs(static_cast<size_t>(stages));
  for (planner::StageCost& cost : costs) {
    cost.forward_ms = forward_ms(rng);
    cost.backward_ms = backward_ms(rng);
    cost.output_bytes = output_bytes(rng);
    cost.saved_bytes = static_cast<int64_t>(
        static_cast<double>(cost.output_bytes) * saved_factor(rng));
    cost.forward_tmp_bytes = has_transient(rng) ? output_bytes(rng) : 0;
    cost.backward_tmp_bytes = has_transient(rng) ? output_bytes(rng) : 0;
  }
  return planner::Chain(std::move(costs), output_bytes(rng));
}

/// A U-Net-shaped graph: `levels` encoder levels of `per_level` stages (the
/// bytes halving per level), a bottleneck level, `levels` decoder levels whose
/// first stage reads the level below and the encoder level's last stage,
/// and a head.
planner::Graph unet_graph(int64_t levels, int64_t per_level, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> jitter(0.8, 1.2);
  std::vector<planner::StageCost> costs;
  std::vector<std::vector<int64_t>> inputs;
  const auto add =
      [&](int64_t bytes, double saved, double ms, std::vector<int64_t> reads) {
        planner::StageCost cost;
        cost.forward_ms = ms * jitter(rng);
        cost.backward_ms = 2 * ms * jitter(rng);
        cost.output_bytes = bytes;
        cost.saved_bytes =
            static_cast<int64_t>(saved * static_cast<double>(bytes));
        cost.forward_tmp_bytes = bytes;
        cost.backward_tmp_bytes = bytes;
        costs.push_back(cost);
        inputs.push_back(std::move(reads));
        return static_cast<int64_t>(costs.size()) - 1;
      };
  std::vector<int64_t> skips;
  int64_t last = planner::kGraphInput;
  int64_t bytes = int64_t{4} << 20;
  for (int64_t level = 0; level < levels; ++level, bytes /= 2) {
    for (int64_t k = 0; k < per_level; ++k) {
      last = add(bytes, 3, 1.0, {last});
    }
    skips.push_back(last);
  }
  for (int64_t k = 0; k < per_level; ++k) {
    last = add(bytes, 3, 1.0, {last});
  }
  for (int64_t level = levels - 1; level >= 0; --level) {
    bytes *= 2;
    last = add(bytes, 4, 1.5, {last, skips[level]});
    for (int64_t k = 1; k < per_level; ++k) {
      last = add(bytes, 3, 1.0, {last});
    }
  }
  add(bytes / 4, 1, 0.2, {last});
  return planner::Graph(std::move(costs), std::move(inputs), int64_t{1} << 20);
}

/// A random DAG: stage i reads stage i - 1 and, with probability 0.3, one
/// random earlier value.
planner::Graph random_dag(int64_t stages, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> output_bytes(1 << 20, 4 << 20);
  std::uniform_real_distribution<double> saved_factor(1.0, 3.0);
  std::uniform_real_distribution<double> forward_ms(0.5, 2.0);
  std::bernoulli_distribution extra(0.3);
  std::vector<planner::StageCost> costs;
  std::vector<std::vector<int64_t>> inputs;
  for (int64_t i = 0; i < stages; ++i) {
    planner::StageCost cost;
    cost.forward_ms = forward_ms(rng);
    cost.backward_ms = 2 * forward_ms(rng);
    cost.output_bytes = output_bytes(rng);
    cost.saved_bytes = static_cast<int64_t>(
        static_cast<double>(cost.output_bytes) * saved_factor(rng));
    costs.push_back(cost);
    std::vector<int64_t> reads{i - 1};
    if (i > 1 && extra(rng)) {
      reads.push_back(std::uniform_int_distribution<int64_t>(-1, i - 2)(rng));
    }
    inputs.push_back(std::move(reads));
  }
  return planner::Graph(std::move(costs), std::move(inputs), 1 << 20);
}

/// The graph solvers' times (the second table; see the top of this file).
Table graph_solve_table(int runs, bool quick) {
  Table table;
  table.name = "graph solve";
  table.columns = {
      "graph",
      "stages",
      "min feasible / store-all",
      "min feasible ms (median)",
      "optimal ms (median)",
      "slowdown",
      "peak / budget"};
  struct Case {
    std::string name;
    planner::Graph graph;
  };
  const std::vector<Case> cases = {
      {"U-Net, 4 levels of 4", unet_graph(4, 4, 41)},
      {"U-Net, 4 levels of 8", unet_graph(4, 8, 42)},
      {"random DAG", random_dag(100, 43)},
      {"random DAG", random_dag(200, 44)},
      // Where the local search's work limit decides (NOTE: [A bounded local
      // search] in src/planner/graph_solvers.cpp).
      {"random DAG", random_dag(1600, 45)},
      {"random DAG", random_dag(10000, 46)}};
  for (const Case& c : cases) {
    if (quick && c.graph.size() > 200) {
      continue;
    }
    std::vector<double> minimum_ms;
    std::vector<double> optimal_ms;
    int64_t minimum = 0;
    std::optional<planner::Plan> plan;
    const planner::Simulation store_all =
        planner::simulate(c.graph, planner::solve_store_all(c.graph));
    int64_t budget = 0;
    for (int run = 0; run < runs; ++run) {
      Timer minimum_timer;
      minimum = planner::min_feasible_budget_bytes(c.graph);
      minimum_ms.push_back(minimum_timer.elapsed_ms());
      budget = (minimum + store_all.peak_bytes) / 2;
      Timer optimal_timer;
      plan = planner::solve_optimal(c.graph, budget);
      optimal_ms.push_back(optimal_timer.elapsed_ms());
    }
    TORCH_CHECK(plan.has_value(), "E5: no plan for the graph ", c.name);
    const planner::Simulation simulation = planner::simulate(c.graph, *plan);
    table.add_row(
        {Cell::text(c.name),
         Cell::integer(c.graph.size()),
         Cell::ratio(
             static_cast<double>(minimum) /
             static_cast<double>(store_all.peak_bytes)),
         Cell::number(summarize(minimum_ms).median, 1),
         Cell::number(summarize(optimal_ms).median, 1),
         Cell::ratio(simulation.time_ms / store_all.time_ms),
         Cell::ratio(
             static_cast<double>(simulation.peak_bytes) /
             static_cast<double>(budget))});
  }
  return table;
}

Section run_e5(const E5Options& options, const Context& context) {
  Section section;
  section.title = "E5 — the planner itself";
  const int runs = context.quick ? 1 : std::max(1, options.runs);
  std::ostringstream about;
  about << "`solve_optimal` (" << options.slots
        << " memory slots) on seeded random heterogeneous chains (per stage: "
           "output 1–4 MiB, saved 1–3× the output, transients on 20% of the "
           "stages, forward 0.5–2 ms, backward 1–4 ms); budget = min feasible "
           "+ "
        << options.fraction << " × (store-all peak − min feasible). " << runs
        << " solves per row: wall time median and min, the process's CPU "
           "time (all threads) median. `threads` is SolverOptions::threads "
           "(0: chosen by the solver; this machine has "
        << std::thread::hardware_concurrency()
        << " hardware threads); the plan is checked to be the same for every "
           "thread count. `slowdown`: the plan's simulated time over "
           "store-all's. Targets, one thread: ≤ 50 ms at 200 stages, ≤ 500 ms "
           "at 500.";
  section.add_text(about.str());
  Table table;
  table.name = "solve";
  table.columns = {
      "stages",
      "threads",
      "budget",
      "optimal ms (median)",
      "optimal ms (min)",
      "cpu ms (median)",
      "chen greedy ms",
      "slowdown",
      "peak / budget"};
  for (const int64_t stages : options.stages) {
    if (context.quick && stages > 100) {
      continue;
    }
    const planner::Chain chain = random_chain(stages, 1000 + stages);
    const int64_t minimum = planner::min_feasible_budget_bytes(chain);
    const planner::Simulation store_all =
        planner::simulate(chain, planner::solve_store_all(chain));
    const int64_t budget =
        minimum + static_cast<int64_t>(
                      options.fraction *
                      static_cast<double>(store_all.peak_bytes - minimum));
    std::optional<std::string> first_plan;
    for (const int64_t threads : options.threads) {
      std::vector<double> wall_ms;
      std::vector<double> cpu_ms;
      std::optional<planner::Plan> plan;
      for (int run = 0; run < runs; ++run) {
        const double cpu_start_ms = process_cpu_ms();
        Timer timer;
        plan = planner::solve_optimal(chain, budget, {options.slots, threads});
        wall_ms.push_back(timer.elapsed_ms());
        cpu_ms.push_back(process_cpu_ms() - cpu_start_ms);
      }
      TORCH_CHECK(
          plan.has_value(),
          "E5: no plan for ",
          stages,
          " stages at ",
          budget,
          " bytes");
      if (!first_plan) {
        first_plan = plan->to_string();
      }
      TORCH_CHECK(
          plan->to_string() == *first_plan,
          "E5: the plan with ",
          threads,
          " threads differs from the one with ",
          options.threads.front(),
          " (",
          stages,
          " stages)");
      Timer chen_timer;
      (void)planner::solve_chen_greedy(chain, budget);
      const double chen_ms = chen_timer.elapsed_ms();
      const planner::Simulation simulation = planner::simulate(chain, *plan);
      const Summary wall = summarize(wall_ms);
      table.add_row(
          {Cell::integer(stages),
           Cell::integer(threads),
           Cell::bytes(budget),
           Cell::number(wall.median, 2),
           Cell::number(wall.min, 2),
           Cell::number(summarize(cpu_ms).median, 2),
           Cell::number(chen_ms, 2),
           Cell::ratio(simulation.time_ms / store_all.time_ms),
           Cell::ratio(
               static_cast<double>(simulation.peak_bytes) /
               static_cast<double>(budget))});
    }
  }
  section.add_table(std::move(table));
  section.add_text(
      "Graph solvers (`remat/planner/graph.h`, one thread): seeded U-Net "
      "shapes and random DAGs (see `bench/scenarios/e5_planner.cpp`); "
      "`optimal` at the middle between the minimum feasible budget and the "
      "store-all peak. Targets: a ~40-stage U-Net under 100 ms, a 200-stage "
      "graph under 1 s. The DAGs of 1,600 and 10,000 stages show the local "
      "search stopping at its work limit (larger of "
      "SolverOptions::graph_search_work and 10^8) instead of growing as "
      "L^3.");
  section.add_table(graph_solve_table(runs, context.quick));
  return section;
}

}  // namespace

const bool kE5Registered = register_scenario(
    {"E5",
     "planner solve times on synthetic chains of 50 ... 500 stages",
     50,
     [](CLI::App& command) -> ScenarioRun {
       auto options = std::make_shared<E5Options>();
       command.add_option("--stages", options->stages, "Chain lengths")
           ->capture_default_str()
           ->delimiter(',');
       command
           .add_option(
               "--solver-threads",
               options->threads,
               "SolverOptions::threads values (0: automatic)")
           ->capture_default_str()
           ->delimiter(',');
       command.add_option("--slots", options->slots, "Memory slots")
           ->capture_default_str();
       command
           .add_option(
               "--fraction",
               options->fraction,
               "Budget: min feasible + F x (store-all - min feasible)")
           ->capture_default_str()
           ->check(CLI::Range(0.0, 1.0));
       command.add_option("--runs", options->runs, "Solves per row")
           ->capture_default_str()
           ->check(CLI::PositiveNumber);
       return [options](const Context& context) {
         return run_e5(*options, context);
       };
     }});

}  // namespace remat::bench
