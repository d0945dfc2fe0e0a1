// A line chart as a standalone SVG file: a log2-scaled x axis, a linear y axis, one polyline per
// series and horizontal reference lines (a budget). Enough to read a plot without its table.
#pragma once

#include <string>
#include <vector>

namespace kvo::tools {

struct ChartSeries {
  std::string label;
  std::string color;  // any SVG color
  std::vector<double> x;
  std::vector<double> y;
};

struct ChartLine {  // a horizontal line across the plot, e.g. the VRAM budget
  std::string label;
  double y = 0;
};

struct Chart {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<ChartSeries> series;
  std::vector<ChartLine> lines;
  // Formats a tick value of each axis ("128K", "24 GiB").
  std::string (*x_tick)(double) = nullptr;
  std::string (*y_tick)(double) = nullptr;
};

// The SVG document. Points above the first reference line are drawn hollow: "does not fit".
std::string render_svg(const Chart& chart);

}  // namespace kvo::tools
