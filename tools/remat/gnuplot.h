// gnuplot.h: drawing PNG plots by running Debian's gnuplot.
//
// remat does not link a plotting library: commands write their data as text
// files and a gnuplot script next to them, then run `gnuplot SCRIPT`. When
// gnuplot is not on PATH the data and script are still written and the
// caller reports how to draw the plot later.
#pragma once

#include <string>

namespace remat::cli {

/// True when a `gnuplot` executable is on PATH.
bool gnuplot_available();

/// Runs `gnuplot script_path` with the script's folder as the working
/// directory. Returns "" on success, else why it failed (not on PATH, or the
/// exit status and the first lines of gnuplot's stderr).
std::string run_gnuplot(const std::string& script_path);

/// `text` quoted for a gnuplot string literal (single quotes doubled).
std::string gnuplot_quote(const std::string& text);

}  // namespace remat::cli
