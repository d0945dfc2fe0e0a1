#include "tools/svg_chart.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace kvo::tools {

namespace {

constexpr double kWidth = 960, kHeight = 560;
constexpr double kLeft = 90, kRight = 250, kTop = 60, kBottom = 70;

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string number(double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.1f", v);
  return buffer;
}

// A "nice" step for about `count` ticks over [0, max].
double nice_step(double max, int count) {
  const double raw = max / count;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    if (m * magnitude >= raw) return m * magnitude;
  }
  return 10 * magnitude;
}

}  // namespace

std::string render_svg(const Chart& chart) {
  double x_min = 1e300, x_max = -1e300, y_max = 0;
  for (const ChartSeries& s : chart.series) {
    for (double x : s.x) x_min = std::min(x_min, x), x_max = std::max(x_max, x);
    for (double y : s.y) y_max = std::max(y_max, y);
  }
  for (const ChartLine& l : chart.lines) y_max = std::max(y_max, l.y);
  // Keep the budget in the readable part of the plot: values far above it are clipped to the
  // top edge and labelled with their value instead.
  if (!chart.lines.empty()) y_max = std::min(y_max, 2.2 * chart.lines.front().y);
  if (!(x_max > x_min)) x_max = x_min * 2;
  const double y_step = nice_step(y_max > 0 ? y_max : 1, 6);
  const double y_top = std::ceil(y_max * 1.05 / y_step) * y_step;
  const double plot_w = kWidth - kLeft - kRight, plot_h = kHeight - kTop - kBottom;
  auto px = [&](double x) {
    return kLeft +
           (std::log2(x) - std::log2(x_min)) / (std::log2(x_max) - std::log2(x_min)) * plot_w;
  };
  auto py = [&](double y) { return kTop + plot_h - y / y_top * plot_h; };

  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << kHeight
      << "\" viewBox=\"0 0 " << kWidth << ' ' << kHeight
      << "\" font-family=\"sans-serif\" font-size=\"13\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<text x=\"" << kLeft << "\" y=\"32\" font-size=\"18\" font-weight=\"bold\">"
      << escape(chart.title) << "</text>\n";

  // Shade what lies above the budget: there, a strategy does not fit.
  if (!chart.lines.empty() && chart.lines.front().y < y_top) {
    svg << "<rect x=\"" << kLeft << "\" y=\"" << kTop << "\" width=\"" << plot_w << "\" height=\""
        << number(py(chart.lines.front().y) - kTop)
        << "\" fill=\"#d62728\" fill-opacity=\"0.04\"/>\n";
  }
  // Grid and ticks.
  for (double y = 0; y <= y_top + 1e-9; y += y_step) {
    svg << "<line x1=\"" << kLeft << "\" x2=\"" << kLeft + plot_w << "\" y1=\"" << number(py(y))
        << "\" y2=\"" << number(py(y)) << "\" stroke=\"#e0e0e0\"/>\n"
        << "<text x=\"" << kLeft - 8 << "\" y=\"" << number(py(y) + 4) << "\" text-anchor=\"end\">"
        << escape(chart.y_tick ? chart.y_tick(y) : number(y)) << "</text>\n";
  }
  for (double x = x_min; x <= x_max * 1.0001; x *= 2) {
    svg << "<line x1=\"" << number(px(x)) << "\" x2=\"" << number(px(x)) << "\" y1=\"" << kTop
        << "\" y2=\"" << kTop + plot_h << "\" stroke=\"#f0f0f0\"/>\n"
        << "<text x=\"" << number(px(x)) << "\" y=\"" << kTop + plot_h + 20
        << "\" text-anchor=\"middle\">" << escape(chart.x_tick ? chart.x_tick(x) : number(x))
        << "</text>\n";
  }
  svg << "<rect x=\"" << kLeft << "\" y=\"" << kTop << "\" width=\"" << plot_w << "\" height=\""
      << plot_h << "\" fill=\"none\" stroke=\"#444\"/>\n"
      << "<text x=\"" << kLeft + plot_w / 2 << "\" y=\"" << kHeight - 22
      << "\" text-anchor=\"middle\">" << escape(chart.x_label) << "</text>\n"
      << "<text transform=\"translate(24," << kTop + plot_h / 2
      << ") rotate(-90)\" text-anchor=\"middle\">" << escape(chart.y_label) << "</text>\n";

  // Reference lines.
  for (const ChartLine& l : chart.lines) {
    svg << "<line x1=\"" << kLeft << "\" x2=\"" << kLeft + plot_w << "\" y1=\"" << number(py(l.y))
        << "\" y2=\"" << number(py(l.y))
        << "\" stroke=\"#d62728\" stroke-width=\"2\" stroke-dasharray=\"8 5\"/>\n"
        << "<text x=\"" << kLeft + plot_w + 8 << "\" y=\"" << number(py(l.y) + 4)
        << "\" fill=\"#d62728\" font-weight=\"bold\">" << escape(l.label) << "</text>\n";
  }
  // Series: a line and a marker per point, hollow where above the first reference line.
  const double limit = chart.lines.empty() ? 1e300 : chart.lines.front().y;
  double legend_y = kTop + 40;
  for (const ChartSeries& s : chart.series) {
    svg << "<polyline fill=\"none\" stroke=\"" << s.color << "\" stroke-width=\"2.5\" points=\"";
    for (std::size_t i = 0; i < s.x.size(); ++i) {
      svg << number(px(s.x[i])) << ',' << number(py(std::min(s.y[i], y_top))) << ' ';
    }
    svg << "\"/>\n";
    for (std::size_t i = 0; i < s.x.size(); ++i) {
      const bool fits = s.y[i] <= limit;
      svg << "<circle cx=\"" << number(px(s.x[i])) << "\" cy=\""
          << number(py(std::min(s.y[i], y_top))) << "\" r=\"4.5\" stroke=\"" << s.color
          << "\" stroke-width=\"2\" fill=\"" << (fits ? s.color : "white") << "\"/>\n";
      if (s.y[i] > y_top) {  // clipped: say where it really is
        svg << "<text x=\"" << number(px(s.x[i]) + 7) << "\" y=\"" << number(kTop + 14)
            << "\" fill=\"" << s.color << "\" font-size=\"11\">&#8593; "
            << escape(chart.y_tick ? chart.y_tick(std::round(s.y[i])) : number(s.y[i]))
            << "</text>\n";
      }
    }
    svg << "<line x1=\"" << kLeft + plot_w + 10 << "\" x2=\"" << kLeft + plot_w + 34 << "\" y1=\""
        << legend_y << "\" y2=\"" << legend_y << "\" stroke=\"" << s.color
        << "\" stroke-width=\"3\"/>\n"
        << "<text x=\"" << kLeft + plot_w + 40 << "\" y=\"" << legend_y + 4 << "\">"
        << escape(s.label) << "</text>\n";
    legend_y += 24;
  }
  svg << "<text x=\"" << kLeft + plot_w + 10 << "\" y=\"" << legend_y + 10
      << "\" fill=\"#555\">filled: fits the budget</text>\n"
      << "<text x=\"" << kLeft + plot_w + 10 << "\" y=\"" << legend_y + 28
      << "\" fill=\"#555\">hollow: does not fit</text>\n"
      << "</svg>\n";
  return svg.str();
}

}  // namespace kvo::tools
