// planner_bench: how long the planner's solvers take (not a test).
//
// Scenario: a seeded random heterogeneous chain (per stage: output 1-4 MiB,
// saved 1-3x the output, occasional transients, forward 0.5-2 ms, backward
// 1-4 ms), budget = min feasible + --fraction * (store-all peak - min
// feasible). One row per chain length and thread count: median (and min)
// wall time of solve_optimal over --runs runs, the median CPU time of the
// process over the same runs (all threads; on a shared, loaded machine wall
// time includes waiting for a core, CPU time does not), the Chen greedy time,
// and the simulated slowdown of the optimal plan relative to store-all. The
// plan must be the same for every thread count (checked; exit 1 if not).
//
// Usage: planner_bench [--help] [--runs N] [--slots S] [--fraction F]
//                      [--stages a,b,..] [--threads t,u,..]
// Defaults: --runs 5 --slots 500 --fraction 0.25 --stages 50,100,200,500
//           --threads 1,0 (0: one per hardware thread).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "remat/planner.h"

namespace {

using remat::planner::Chain;
using remat::planner::StageCost;

Chain bench_chain(int64_t stages, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> output(1 << 20, 4 << 20);
  std::uniform_real_distribution<double> factor(1.0, 3.0);
  std::uniform_real_distribution<double> forward(0.5, 2.0);
  std::uniform_real_distribution<double> backward(1.0, 4.0);
  std::bernoulli_distribution has_tmp(0.2);
  std::vector<StageCost> costs(stages);
  for (StageCost& s : costs) {
    s.forward_ms = forward(rng);
    s.backward_ms = backward(rng);
    s.output_bytes = output(rng);
    s.saved_bytes = static_cast<int64_t>(s.output_bytes * factor(rng));
    s.forward_tmp_bytes = has_tmp(rng) ? output(rng) : 0;
    s.backward_tmp_bytes = has_tmp(rng) ? output(rng) : 0;
  }
  return Chain(std::move(costs), output(rng));
}

template <typename F>
double time_ms(F&& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  const auto stop = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::milli>(stop - start).count();
}

// CPU time of the process (all threads) in ms (POSIX).
double process_cpu_ms() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) * 1e3 +
         static_cast<double>(now.tv_nsec) / 1e6;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

[[noreturn]] void usage(const char* why) {
  std::fprintf(
      stderr,
      "planner_bench: %s\nusage: planner_bench [--runs N] [--slots S] "
      "[--fraction F] [--stages a,b,...] [--threads t,u,...]\n",
      why);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 5;
  int64_t slots = 500;
  double fraction = 0.25;
  std::vector<int64_t> lengths = {50, 100, 200, 500};
  std::vector<int64_t> thread_counts = {1, 0};
  const auto parse_list = [](const std::string& value, int64_t least) {
    std::vector<int64_t> items;
    std::stringstream list(value);
    for (std::string item; std::getline(list, item, ',');) {
      items.push_back(std::max<int64_t>(least, std::atoll(item.c_str())));
    }
    return items;
  };
  for (int k = 1; k < argc; ++k) {
    const std::string flag = argv[k];
    if (flag == "--help" || flag == "-h") {
      std::printf(
          "usage: planner_bench [--runs N] [--slots S] [--fraction F] "
          "[--stages a,b,...] [--threads t,u,...]\n"
          "  --runs N       solves per chain length; median, min and median "
          "CPU time reported (default 5)\n"
          "  --slots S      memory slots of solve_optimal (default 500)\n"
          "  --fraction F   budget = min feasible + F * (store-all peak - min "
          "feasible) (default 0.25)\n"
          "  --stages a,b   chain lengths (default 50,100,200,500)\n"
          "  --threads t,u  SolverOptions::threads values, 0 = one per "
          "hardware thread (default 1,0)\n");
      return 0;
    }
    if (k + 1 >= argc) {
      usage(("missing value for " + flag).c_str());
    }
    const std::string value = argv[++k];
    if (flag == "--runs") {
      runs = std::max(1, std::atoi(value.c_str()));
    } else if (flag == "--slots") {
      slots = std::max<int64_t>(1, std::atoll(value.c_str()));
    } else if (flag == "--fraction") {
      fraction = std::atof(value.c_str());
    } else if (flag == "--stages") {
      lengths = parse_list(value, 1);
    } else if (flag == "--threads") {
      thread_counts = parse_list(value, 0);
    } else {
      usage(("unknown flag " + flag).c_str());
    }
  }

  std::printf(
      "hardware threads: %u\n%7s %7s %6s %12s %12s %12s %12s %12s %10s "
      "%10s\n",
      std::thread::hardware_concurrency(),
      "stages",
      "threads",
      "slots",
      "budget_MiB",
      "optimal_ms",
      "(min_ms)",
      "cpu_ms",
      "chen_ms",
      "slowdown",
      "peak/bud");
  for (int64_t stages : lengths) {
    const Chain chain = bench_chain(stages, 1000 + stages);
    const int64_t low = remat::planner::min_feasible_budget_bytes(chain);
    const int64_t high =
        remat::planner::simulate(chain, remat::planner::solve_store_all(chain))
            .peak_bytes;
    const int64_t budget =
        low + static_cast<int64_t>(fraction * static_cast<double>(high - low));
    std::optional<std::string> first_plan;
    for (int64_t threads : thread_counts) {
      std::vector<double> optimal_ms;
      std::vector<double> cpu_ms;
      std::optional<remat::planner::Plan> plan;
      for (int r = 0; r < runs; ++r) {
        const double cpu_start = process_cpu_ms();
        optimal_ms.push_back(time_ms([&] {
          plan = remat::planner::solve_optimal(chain, budget, {slots, threads});
        }));
        cpu_ms.push_back(process_cpu_ms() - cpu_start);
      }
      if (!first_plan) {
        first_plan = plan->to_string();
      } else if (plan->to_string() != *first_plan) {
        std::fprintf(
            stderr,
            "planner_bench: the plan with %lld threads differs from the "
            "first one\n",
            static_cast<long long>(threads));
        return 1;
      }
      const double chen_ms = time_ms(
          [&] { (void)remat::planner::solve_chen_greedy(chain, budget); });
      const remat::planner::Simulation sim =
          remat::planner::simulate(chain, *plan);
      const double store_all_ms =
          remat::planner::simulate(
              chain, remat::planner::solve_store_all(chain))
              .time_ms;
      std::printf(
          "%7lld %7lld %6lld %12.1f %12.2f %12.2f %12.2f %12.2f %10.3f "
          "%10.3f\n",
          static_cast<long long>(stages),
          static_cast<long long>(threads),
          static_cast<long long>(slots),
          static_cast<double>(budget) / (1 << 20),
          median(optimal_ms),
          *std::min_element(optimal_ms.begin(), optimal_ms.end()),
          median(cpu_ms),
          chen_ms,
          sim.time_ms / store_all_ms,
          static_cast<double>(sim.peak_bytes) / static_cast<double>(budget));
    }
  }
  return 0;
}
