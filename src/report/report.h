// report.h — the results of a benchmark as data, and their three renderings.
//
// CONTRACT (stable; scenarios build Sections, the driver writes them):
//  - A Section is what one scenario returns: a heading, the machine line, the
//    exact command, and a body of paragraphs and tables in order.
//  - A Table is columns plus rows of typed Cells. Scenarios never format
//    numbers themselves: a Cell keeps the value and its kind, and each writer
//    renders it:
//      Markdown  bytes via remat::planner::format_bytes (binary units:
//                "37.2 MiB"), times and ratios with the cell's digits;
//      CSV, JSON exact values (bytes as integers, times as doubles).
//  - Writers never throw on content; write_* functions throw std::runtime_error
//    when a file cannot be written.
//  - Units are in column names ("forward ms"); byte columns say "peak" and the
//    unit is in the cell (Markdown) or is bytes (CSV/JSON: "peak bytes").
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "remat/measure/machine.h"
#include "remat/measure/runner.h"
#include "remat/measure/statistics.h"

namespace remat::report {

/// One value of a table, with how to render it.
class Cell {
 public:
  enum class Kind {
    kEmpty,    ///< no value ("—" in Markdown, empty in CSV, null in JSON)
    kText,     ///< free text
    kInteger,  ///< a count
    kNumber,   ///< a real number shown with `digits` decimals
    kBytes,    ///< a byte count: format_bytes in Markdown, an integer elsewhere
    kRatioInterval,  ///< a median ratio with its interval: "1.140
                     ///< [1.021, 1.262]"
  };
  Cell() = default;
  static Cell empty();
  static Cell text(std::string text);
  static Cell integer(int64_t value);
  /// A real number shown with `digits` decimals in Markdown.
  static Cell number(double value, int digits);
  /// Milliseconds: number(value, 1).
  static Cell ms(double value);
  /// A ratio: number(value, 3).
  static Cell ratio(double value);
  static Cell bytes(int64_t value);
  /// A paired ratio: Markdown "1.140 [1.021, 1.262]" (the median and its
  /// interval; "1.140 (range 0.9–1.3; too few rounds)" without one), CSV the
  /// same text, JSON {median, low, high, coverage, rounds}.
  static Cell ratio_interval(const measure::RatioInterval& ratio);

  Kind kind() const {
    return kind_;
  }
  /// For kNumber and kInteger (and kBytes, as a double); 0 otherwise.
  double value() const {
    return value_;
  }
  std::string markdown() const;
  std::string csv() const;
  nlohmann::json json() const;

 private:
  Kind kind_ = Kind::kEmpty;
  double value_ = 0;
  int64_t integer_ = 0;
  int digits_ = 0;
  std::string text_;
  measure::RatioInterval interval_;
};

/// A table: a name (for the CSV file and JSON), columns, rows.
struct Table {
  std::string name;                  // "E1-n32": a file-name-safe id
  std::string caption;               // shown in bold above the table; or ""
  std::vector<std::string> columns;  // headers, units included
  std::vector<std::vector<Cell>> rows;
  /// Appends a row. Throws std::invalid_argument unless it has one cell per
  /// column.
  void add_row(std::vector<Cell> cells);
};

/// What one scenario reports.
struct Section {
  std::string scenario;  // "E1": the scenario's name, the anchor of its section
  std::string title;     // "E1 — homogeneous chain, optimality"
  measure::Machine machine;  // where and when it ran
  std::string command;       // the exact command line that produced it
  /// Paragraphs (Markdown text) and tables, in reading order.
  std::vector<std::variant<std::string, Table>> body;

  void add_text(std::string markdown) {
    body.emplace_back(std::move(markdown));
  }
  void add_table(Table table) {
    body.emplace_back(std::move(table));
  }
};

/// The Markdown of a table (GitHub pipes; a caption paragraph if any).
std::string to_markdown(const Table& table);
/// The Markdown of a section: "## <title>", a line with the date, machine and
/// command, then the body.
std::string to_markdown(const Section& section);
/// The table as aligned plain text for a terminal: the Markdown cells, the
/// first column left-aligned, the others right-aligned, two spaces apart.
std::string to_text(const Table& table);
/// The CSV of a table: a header line of the columns, then one line per row.
/// Cells with commas, quotes or newlines are quoted (RFC 4180).
std::string to_csv(const Table& table);
/// The JSON of a section: {scenario, title, machine{...}, command, tables:
/// [{name, caption, columns, rows: [[...]]}], text: [...]}.
nlohmann::json to_json(const Section& section);

/// Writes <dir>/<scenario>.md, <dir>/<scenario>.json and one
/// <dir>/<scenario>.<table name>.csv per table; creates `dir` if needed.
void write_section_files(const Section& section, const std::string& dir);

/// Writes `path`: `preamble` (Markdown), then each section's Markdown (as
/// to_markdown(Section) made it, e.g. read back from <dir>/<scenario>.md) in
/// the given order.
void write_page(
    const std::string& path,
    const std::string& preamble,
    const std::vector<std::string>& section_markdowns);

// ---- the step-time columns every timed table shows ------------------------

/// Column names for step_time_cells(): "forward ms", "backward ms",
/// "step ms", "spread ms", "time ratio [95% CI]", "CPU ratio [95% CI]".
std::vector<std::string> step_time_columns();

/// The paired ratio of two series of the same rounds as a cell; empty when
/// they cannot be paired (different lengths, or none: e.g. a peer process
/// that reports no CPU time).
Cell paired_ratio_cell(
    const std::vector<double>& compared, const std::vector<double>& baseline);

/// Median forward, median backward, median step, step spread, and the step
/// time's and the CPU time's paired ratios to `baseline`'s (paired_ratio_cell).
std::vector<Cell> step_time_cells(
    const measure::Measurement& measurement,
    const measure::Measurement& baseline);

}  // namespace remat::report
