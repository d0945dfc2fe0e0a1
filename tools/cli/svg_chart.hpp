// A line chart as a standalone SVG file: a log2-scaled x axis, a linear y axis, one polyline per
// series and horizontal reference lines (a budget). Enough to read a plot without its table.
//
// Every label is placed where it collides with no other (tick labels that would touch a
// neighbour are left out, a reference line's label moves off the legend, labels of clipped
// points stack or are dropped), and every label stays inside the picture.
#pragma once

#include <string>
#include <vector>

namespace kvo::tools {

struct ChartSeries {
  std::string label;
  std::string color;  // any SVG color
  std::vector<double> x;
  std::vector<double> y;
  // Optional, one per point: points marked with a cross and Chart::flag_label (e.g. "host memory
  // short"). Empty: none.
  std::vector<bool> flagged;
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
  std::string flag_label = "flagged";  // the legend's word for a flagged point
  // Formats a tick value of each axis ("128K", "24 GiB").
  std::string (*x_tick)(double) = nullptr;
  std::string (*y_tick)(double) = nullptr;
};

// The SVG document. Points are drawn in order of x whatever order they come in. Points above
// the first reference line are hollow: "does not fit".
std::string render_svg(const Chart& chart);

}  // namespace kvo::tools
