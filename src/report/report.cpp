// report.cpp — Cell rendering and the Markdown, CSV and JSON writers (see
// report.h). Bytes are rendered by remat::planner::format_bytes alone.
#include "report/report.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <stdexcept>

#include "remat/planner/units.h"

namespace remat::report {
namespace {

std::string fixed(double value, int digits) {
  std::ostringstream text;
  text << std::fixed << std::setprecision(digits) << value;
  return text.str();
}

// A cell of a Markdown table: pipes escaped, line breaks as spaces.
std::string markdown_cell(const std::string& text) {
  std::string cell;
  for (const char c : text) {
    if (c == '|') {
      cell += "\\|";
    } else if (c == '\n') {
      cell += ' ';
    } else {
      cell += c;
    }
  }
  return cell;
}

std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\n") == std::string::npos) {
    return text;
  }
  std::string quoted = "\"";
  for (const char c : text) {
    quoted += c;
    if (c == '"') {
      quoted += '"';
    }
  }
  return quoted + "\"";
}

void write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.close();
  if (!out) {
    throw std::runtime_error("remat::report: cannot write " + path.string());
  }
}

}  // namespace

Cell Cell::empty() {
  return Cell();
}

Cell Cell::text(std::string text) {
  Cell cell;
  cell.kind_ = Kind::kText;
  cell.text_ = std::move(text);
  return cell;
}

Cell Cell::integer(int64_t value) {
  Cell cell;
  cell.kind_ = Kind::kInteger;
  cell.integer_ = value;
  cell.value_ = static_cast<double>(value);
  return cell;
}

Cell Cell::number(double value, int digits) {
  Cell cell;
  cell.kind_ = Kind::kNumber;
  cell.value_ = value;
  cell.digits_ = digits;
  return cell;
}

Cell Cell::ms(double value) {
  return number(value, 1);
}

Cell Cell::ratio(double value) {
  return number(value, 3);
}

Cell Cell::ratio_interval(const measure::RatioInterval& ratio) {
  Cell cell;
  cell.kind_ = Kind::kRatioInterval;
  cell.value_ = ratio.median;
  cell.interval_ = ratio;
  return cell;
}

namespace {

std::string interval_text(const measure::RatioInterval& ratio) {
  if (ratio.has_interval) {
    return fixed(ratio.median, 3) + " [" + fixed(ratio.low, 3) + ", " +
           fixed(ratio.high, 3) + "]";
  }
  return fixed(ratio.median, 3) + " (range " + fixed(ratio.low, 3) + "–" +
         fixed(ratio.high, 3) + "; too few rounds)";
}

}  // namespace

Cell Cell::bytes(int64_t value) {
  Cell cell;
  cell.kind_ = Kind::kBytes;
  cell.integer_ = value;
  cell.value_ = static_cast<double>(value);
  return cell;
}

std::string Cell::markdown() const {
  switch (kind_) {
    case Kind::kEmpty:
      return "—";
    case Kind::kText:
      return markdown_cell(text_);
    case Kind::kInteger:
      return std::to_string(integer_);
    case Kind::kNumber:
      return std::isfinite(value_) ? fixed(value_, digits_) : "—";
    case Kind::kBytes:
      return planner::format_bytes(integer_);
    case Kind::kRatioInterval:
      return interval_text(interval_);
  }
  return "";
}

std::string Cell::csv() const {
  switch (kind_) {
    case Kind::kEmpty:
      return "";
    case Kind::kText:
      return csv_field(text_);
    case Kind::kInteger:
    case Kind::kBytes:
      return std::to_string(integer_);
    case Kind::kNumber: {
      std::ostringstream text;
      text << std::setprecision(10) << value_;
      return std::isfinite(value_) ? text.str() : "";
    }
    case Kind::kRatioInterval:
      return csv_field(interval_text(interval_));
  }
  return "";
}

nlohmann::json Cell::json() const {
  switch (kind_) {
    case Kind::kEmpty:
      return nullptr;
    case Kind::kText:
      return text_;
    case Kind::kInteger:
    case Kind::kBytes:
      return integer_;
    case Kind::kNumber:
      return std::isfinite(value_) ? nlohmann::json(value_)
                                   : nlohmann::json(nullptr);
    case Kind::kRatioInterval:
      return {
          {"median", interval_.median},
          {"low", interval_.low},
          {"high", interval_.high},
          {"coverage", interval_.coverage},
          {"rounds", interval_.rounds},
          {"has_interval", interval_.has_interval}};
  }
  return nullptr;
}

void Table::add_row(std::vector<Cell> cells) {
  if (cells.size() != columns.size()) {
    throw std::invalid_argument(
        "remat::report::Table::add_row: expected " +
        std::to_string(columns.size()) + " cells for table '" + name +
        "', got " + std::to_string(cells.size()));
  }
  rows.push_back(std::move(cells));
}

std::string to_markdown(const Table& table) {
  std::ostringstream out;
  if (!table.caption.empty()) {
    out << "**" << table.caption << "**\n\n";
  }
  out << "|";
  for (const std::string& column : table.columns) {
    out << " " << markdown_cell(column) << " |";
  }
  out << "\n|";
  for (size_t c = 0; c < table.columns.size(); ++c) {
    out << "---|";
  }
  out << "\n";
  for (const auto& row : table.rows) {
    out << "|";
    for (const Cell& cell : row) {
      out << " " << cell.markdown() << " |";
    }
    out << "\n";
  }
  return out.str();
}

std::string to_markdown(const Section& section) {
  std::ostringstream out;
  out << "## " << (section.title.empty() ? section.scenario : section.title)
      << "\n\n"
      << "Run " << section.machine.to_string() << ".  \nCommand: `"
      << section.command << "`\n";
  for (const auto& block : section.body) {
    out << "\n";
    if (const auto* text = std::get_if<std::string>(&block)) {
      out << *text;
      if (text->empty() || text->back() != '\n') {
        out << "\n";
      }
    } else {
      out << to_markdown(std::get<Table>(block));
    }
  }
  return out.str();
}

std::string to_text(const Table& table) {
  std::vector<std::vector<std::string>> lines{table.columns};
  for (const auto& row : table.rows) {
    std::vector<std::string> line;
    for (const Cell& cell : row) {
      line.push_back(cell.markdown());
    }
    lines.push_back(std::move(line));
  }
  // Widths in code points, so that "—" and "×" count as one column.
  const auto width = [](const std::string& text) {
    return std::count_if(text.begin(), text.end(), [](char c) {
      return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
    });
  };
  std::vector<int64_t> widths(table.columns.size(), 0);
  for (const auto& line : lines) {
    for (size_t c = 0; c < line.size() && c < widths.size(); ++c) {
      widths[c] = std::max<int64_t>(widths[c], width(line[c]));
    }
  }
  std::ostringstream out;
  for (const auto& line : lines) {
    for (size_t c = 0; c < line.size() && c < widths.size(); ++c) {
      const std::string padding(
          static_cast<size_t>(widths[c] - width(line[c])), ' ');
      out << (c ? "  " : "") << (c ? padding + line[c] : line[c] + padding);
    }
    out << "\n";
  }
  return out.str();
}

std::string to_csv(const Table& table) {
  std::ostringstream out;
  for (size_t c = 0; c < table.columns.size(); ++c) {
    out << (c ? "," : "") << csv_field(table.columns[c]);
  }
  out << "\n";
  for (const auto& row : table.rows) {
    for (size_t c = 0; c < row.size(); ++c) {
      out << (c ? "," : "") << row[c].csv();
    }
    out << "\n";
  }
  return out.str();
}

nlohmann::json to_json(const Section& section) {
  nlohmann::json json;
  json["scenario"] = section.scenario;
  json["title"] = section.title;
  json["command"] = section.command;
  const measure::Machine& machine = section.machine;
  json["machine"] = {
      {"date", machine.date},
      {"cpu_model", machine.cpu_model},
      {"cores", machine.cores},
      {"torch_threads", machine.torch_threads},
      {"libtorch", machine.libtorch},
      {"load_average", machine.load_average}};
  json["text"] = nlohmann::json::array();
  json["tables"] = nlohmann::json::array();
  for (const auto& block : section.body) {
    if (const auto* text = std::get_if<std::string>(&block)) {
      json["text"].push_back(*text);
      continue;
    }
    const Table& table = std::get<Table>(block);
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& row : table.rows) {
      nlohmann::json cells = nlohmann::json::array();
      for (const Cell& cell : row) {
        cells.push_back(cell.json());
      }
      rows.push_back(std::move(cells));
    }
    json["tables"].push_back(
        {{"name", table.name},
         {"caption", table.caption},
         {"columns", table.columns},
         {"rows", std::move(rows)}});
  }
  return json;
}

void write_section_files(const Section& section, const std::string& dir) {
  const std::filesystem::path folder(dir);
  std::filesystem::create_directories(folder);
  write_file(folder / (section.scenario + ".md"), to_markdown(section));
  write_file(
      folder / (section.scenario + ".json"), to_json(section).dump(2) + "\n");
  for (const auto& block : section.body) {
    if (const auto* table = std::get_if<Table>(&block)) {
      write_file(
          folder / (section.scenario + "." + table->name + ".csv"),
          to_csv(*table));
    }
  }
}

void write_page(
    const std::string& path,
    const std::string& preamble,
    const std::vector<std::string>& section_markdowns) {
  std::string page = preamble;
  for (const std::string& section : section_markdowns) {
    if (!page.empty() && page.back() != '\n') {
      page += "\n";
    }
    page += "\n" + section;
  }
  write_file(path, page);
}

std::vector<std::string> step_time_columns() {
  return {
      "forward ms",
      "backward ms",
      "step ms",
      "spread ms",
      "time ratio [95% CI]",
      "CPU ratio [95% CI]"};
}

std::vector<Cell> step_time_cells(
    const measure::Measurement& measurement,
    const measure::Measurement& baseline) {
  const measure::Summary step = measurement.step();
  return {
      Cell::ms(measurement.forward().median),
      Cell::ms(measurement.backward().median),
      Cell::ms(step.median),
      Cell::ms(step.spread()),
      paired_ratio_cell(measurement.step_ms, baseline.step_ms),
      paired_ratio_cell(measurement.cpu_ms, baseline.cpu_ms)};
}

Cell paired_ratio_cell(
    const std::vector<double>& compared, const std::vector<double>& baseline) {
  if (compared.empty() || compared.size() != baseline.size()) {
    return Cell::empty();
  }
  return Cell::ratio_interval(measure::paired_ratio(compared, baseline));
}

}  // namespace remat::report
