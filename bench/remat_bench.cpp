// remat_bench: every benchmark of remat as a named scenario (E1, E2, E5, E6,
// ...); `remat_bench --help` lists them, `remat_bench SCENARIO --help` gives a
// scenario's flags. The scenarios live in bench/scenarios/, the driver in
// bench/harness/ (scenario.h); they measure with remat::measure
// (remat/measure/) and report with src/report.
#include "harness/scenario.h"

int main(int argc, char** argv) {
  return remat::bench::run_main(argc, argv);
}
