#include "tools/cli/svg_chart.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <sstream>

namespace kvo::tools {

namespace {

constexpr double kWidth = 1000, kHeight = 560;
constexpr double kLeft = 90, kRight = 290, kTop = 60, kBottom = 70;
constexpr double kFont = 13;        // the document's font size
constexpr double kCharWidth = 0.6;  // of the font size: wide enough for sans-serif digits

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

// Characters, not bytes: "↑" is one.
std::size_t glyphs(const std::string& text) {
  std::size_t n = 0;
  for (unsigned char c : text) n += (c & 0xc0) != 0x80 ? 1 : 0;
  return n;
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

struct Box {
  double x0, y0, x1, y1;
  bool overlaps(const Box& o) const { return x0 < o.x1 && o.x0 < x1 && y0 < o.y1 && o.y0 < y1; }
};

enum class Anchor { kStart, kMiddle, kEnd };

// The box a line of text occupies: its baseline at y, its anchor at x.
Box text_box(const std::string& text, double x, double y, double size, Anchor anchor) {
  const double w = kCharWidth * size * static_cast<double>(glyphs(text));
  const double left = anchor == Anchor::kStart ? x : anchor == Anchor::kMiddle ? x - w / 2 : x - w;
  return {left, y - 0.8 * size, left + w, y + 0.25 * size};
}

// Labels placed so far; a new one goes where it overlaps none of them.
class Labels {
 public:
  bool free(const Box& b) const {
    if (b.x0 < 0 || b.x1 > kWidth || b.y0 < 0 || b.y1 > kHeight) return false;
    for (const Box& p : placed_) {
      if (b.overlaps(p)) return false;
    }
    return true;
  }
  void take(const Box& b) { placed_.push_back(b); }
  // Tries y, then y + step, y - step, y + 2 step, ... within [y_min, y_max]; returns the
  // baseline it took, or NaN when none is free.
  double place(const std::string& text, double x, double y, double size, Anchor anchor, double step,
               double y_min, double y_max) {
    for (int i = 0; i < 64; ++i) {
      const double offset = step * ((i + 1) / 2) * (i % 2 == 1 ? 1 : -1);
      const double at = y + offset;
      if (at < y_min || at > y_max) continue;
      const Box b = text_box(text, x, at, size, anchor);
      if (free(b)) {
        take(b);
        return at;
      }
    }
    return NAN;
  }

 private:
  std::vector<Box> placed_;
};

const char* anchor_name(Anchor a) {
  return a == Anchor::kStart ? "start" : a == Anchor::kMiddle ? "middle" : "end";
}

void text(std::ostringstream& svg, const std::string& s, double x, double y, Anchor anchor,
          const std::string& extra = "") {
  svg << "<text x=\"" << number(x) << "\" y=\"" << number(y) << "\" text-anchor=\""
      << anchor_name(anchor) << "\"" << extra << ">" << escape(s) << "</text>\n";
}

// The title, cut to the width of the picture.
std::string fitted(const std::string& title, double size, double width) {
  const auto room = static_cast<std::size_t>(width / (kCharWidth * size));
  if (glyphs(title) <= room) return title;
  std::string out;
  for (unsigned char c : title) {
    if ((c & 0xc0) != 0x80 && glyphs(out) + 1 >= room) break;
    out += static_cast<char>(c);
  }
  return out + "...";
}

}  // namespace

std::string render_svg(const Chart& input) {
  // Points in order of x, so that a line never runs back on itself.
  Chart chart = input;
  for (ChartSeries& s : chart.series) {
    std::vector<std::size_t> order(s.x.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return s.x[a] < s.x[b]; });
    ChartSeries sorted = s;
    for (std::size_t i = 0; i < order.size(); ++i) {
      sorted.x[i] = s.x[order[i]];
      sorted.y[i] = s.y[order[i]];
      if (!s.flagged.empty()) sorted.flagged[i] = s.flagged[order[i]];
    }
    s = std::move(sorted);
  }

  double x_min = 1e300, x_max = -1e300, y_max = 0;
  bool any_flagged = false;
  for (const ChartSeries& s : chart.series) {
    for (double x : s.x) x_min = std::min(x_min, x), x_max = std::max(x_max, x);
    for (double y : s.y) y_max = std::max(y_max, y);
    for (bool f : s.flagged) any_flagged = any_flagged || f;
  }
  if (!(x_min <= x_max)) x_min = 1, x_max = 2;   // no points at all
  if (!(x_max > x_min)) x_min /= 2, x_max *= 2;  // one context: keep it in the middle
  for (const ChartLine& l : chart.lines) y_max = std::max(y_max, l.y);
  // Keep the budget in the readable part of the plot: values far above it are clipped to the
  // top edge and labelled with their value instead.
  if (!chart.lines.empty()) y_max = std::min(y_max, 2.2 * chart.lines.front().y);
  const double y_step = nice_step(y_max > 0 ? y_max : 1, 6);
  const double y_top = std::ceil(y_max * 1.05 / y_step) * y_step;
  const double plot_w = kWidth - kLeft - kRight, plot_h = kHeight - kTop - kBottom;
  auto px = [&](double x) {
    return kLeft +
           (std::log2(x) - std::log2(x_min)) / (std::log2(x_max) - std::log2(x_min)) * plot_w;
  };
  auto py = [&](double y) { return kTop + plot_h - y / y_top * plot_h; };

  std::ostringstream svg;
  Labels labels;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << kHeight
      << "\" viewBox=\"0 0 " << kWidth << ' ' << kHeight
      << "\" font-family=\"sans-serif\" font-size=\"" << kFont << "\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  const std::string title = fitted(chart.title, 18, kWidth - kLeft - 10);
  labels.take(text_box(title, kLeft, 32, 18, Anchor::kStart));
  text(svg, title, kLeft, 32, Anchor::kStart, " font-size=\"18\" font-weight=\"bold\"");

  // Shade what lies above the budget: there, a strategy does not fit.
  if (!chart.lines.empty() && chart.lines.front().y < y_top) {
    svg << "<rect x=\"" << kLeft << "\" y=\"" << kTop << "\" width=\"" << plot_w << "\" height=\""
        << number(py(chart.lines.front().y) - kTop)
        << "\" fill=\"#d62728\" fill-opacity=\"0.04\"/>\n";
  }
  // Grid and ticks; an x tick label that would touch the previous one is left out.
  for (double y = 0; y <= y_top + 1e-9; y += y_step) {
    svg << "<line x1=\"" << kLeft << "\" x2=\"" << kLeft + plot_w << "\" y1=\"" << number(py(y))
        << "\" y2=\"" << number(py(y)) << "\" stroke=\"#e0e0e0\"/>\n";
    const std::string label = chart.y_tick ? chart.y_tick(y) : number(y);
    const Box b = text_box(label, kLeft - 8, py(y) + 4, kFont, Anchor::kEnd);
    if (labels.free(b)) {
      labels.take(b);
      text(svg, label, kLeft - 8, py(y) + 4, Anchor::kEnd);
    }
  }
  for (double x = std::exp2(std::ceil(std::log2(x_min) - 1e-9)); x <= x_max * 1.0001; x *= 2) {
    svg << "<line x1=\"" << number(px(x)) << "\" x2=\"" << number(px(x)) << "\" y1=\"" << kTop
        << "\" y2=\"" << kTop + plot_h << "\" stroke=\"#f0f0f0\"/>\n";
    const std::string label = chart.x_tick ? chart.x_tick(x) : number(x);
    Box b = text_box(label, px(x), kTop + plot_h + 20, kFont, Anchor::kMiddle);
    b.x0 -= 4, b.x1 += 4;  // a little air between neighbours
    if (labels.free(b)) {
      labels.take(b);
      text(svg, label, px(x), kTop + plot_h + 20, Anchor::kMiddle);
    }
  }
  svg << "<rect x=\"" << kLeft << "\" y=\"" << kTop << "\" width=\"" << plot_w << "\" height=\""
      << plot_h << "\" fill=\"none\" stroke=\"#444\"/>\n";
  labels.take(text_box(chart.x_label, kLeft + plot_w / 2, kHeight - 22, kFont, Anchor::kMiddle));
  text(svg, chart.x_label, kLeft + plot_w / 2, kHeight - 22, Anchor::kMiddle);
  svg << "<text transform=\"translate(24," << kTop + plot_h / 2
      << ") rotate(-90)\" text-anchor=\"middle\">" << escape(chart.y_label) << "</text>\n";

  // The legend, in the right margin: its places are taken before any other label is placed.
  const double legend_x = kLeft + plot_w + 10;
  double legend_y = kTop + 40;
  std::ostringstream legend;
  const auto legend_text = [&](const std::string& s, double x, const std::string& extra) {
    labels.take(text_box(s, x, legend_y + 4, kFont, Anchor::kStart));
    legend << "<text x=\"" << number(x) << "\" y=\"" << number(legend_y + 4)
           << "\" text-anchor=\"start\"" << extra << ">" << escape(s) << "</text>\n";
    legend_y += 22;
  };
  for (const ChartSeries& s : chart.series) {
    legend << "<line x1=\"" << legend_x << "\" x2=\"" << legend_x + 24 << "\" y1=\"" << legend_y
           << "\" y2=\"" << legend_y << "\" stroke=\"" << s.color << "\" stroke-width=\"3\"/>\n";
    legend_text(s.label, legend_x + 30, "");
  }
  legend_y += 6;
  legend_text("filled: fits the budget", legend_x, " fill=\"#555\"");
  legend_text("hollow: does not fit", legend_x, " fill=\"#555\"");
  if (any_flagged) legend_text("\xc3\x97: " + chart.flag_label, legend_x, " fill=\"#d62728\"");

  // Reference lines; each label at its line's height in the margin, or as near as is free.
  for (const ChartLine& l : chart.lines) {
    const double y = py(std::min(l.y, y_top));
    svg << "<line x1=\"" << kLeft << "\" x2=\"" << kLeft + plot_w << "\" y1=\"" << number(y)
        << "\" y2=\"" << number(y)
        << "\" stroke=\"#d62728\" stroke-width=\"2\" stroke-dasharray=\"8 5\"/>\n";
    const double at =
        labels.place(l.label, legend_x, y + 4, kFont, Anchor::kStart, 8, kTop, kTop + plot_h + 4);
    if (!std::isnan(at)) {
      text(svg, l.label, legend_x, at, Anchor::kStart, " fill=\"#d62728\" font-weight=\"bold\"");
    }
  }
  svg << legend.str();

  // Series: a line and a marker per point, hollow where above the first reference line,
  // crossed where flagged; the first and last points clipped at the top say where they really
  // are, if there is room.
  const double limit = chart.lines.empty() ? 1e300 : chart.lines.front().y;
  for (const ChartSeries& s : chart.series) {
    // Of the points clipped at the top, the first and the last say where the series goes.
    std::size_t first_clipped = s.x.size(), last_clipped = s.x.size();
    for (std::size_t i = 0; i < s.x.size(); ++i) {
      if (s.y[i] <= y_top) continue;
      if (first_clipped == s.x.size()) first_clipped = i;
      last_clipped = i;
    }
    svg << "<polyline fill=\"none\" stroke=\"" << s.color << "\" stroke-width=\"2.5\" points=\"";
    for (std::size_t i = 0; i < s.x.size(); ++i) {
      svg << number(px(s.x[i])) << ',' << number(py(std::min(s.y[i], y_top))) << ' ';
    }
    svg << "\"/>\n";
    for (std::size_t i = 0; i < s.x.size(); ++i) {
      const double cx = px(s.x[i]), cy = py(std::min(s.y[i], y_top));
      const bool fits = s.y[i] <= limit;
      svg << "<circle cx=\"" << number(cx) << "\" cy=\"" << number(cy) << "\" r=\"4.5\" stroke=\""
          << s.color << "\" stroke-width=\"2\" fill=\"" << (fits ? s.color : "white") << "\"/>\n";
      if (!s.flagged.empty() && s.flagged[i]) {
        svg << "<path d=\"M" << number(cx - 6) << ',' << number(cy - 6) << " L" << number(cx + 6)
            << ',' << number(cy + 6) << " M" << number(cx - 6) << ',' << number(cy + 6) << " L"
            << number(cx + 6) << ',' << number(cy - 6)
            << "\" stroke=\"#d62728\" stroke-width=\"2\"><title>" << escape(chart.flag_label)
            << "</title></path>\n";
      }
      if (i == first_clipped || i == last_clipped) {
        const std::string label =
            "\xe2\x86\x91 " + (chart.y_tick ? chart.y_tick(std::round(s.y[i])) : number(s.y[i]));
        // Inside the plot: left of the point when it would run past the right edge.
        const double width = kCharWidth * 11 * static_cast<double>(glyphs(label));
        const bool left = cx + 7 + width > kLeft + plot_w - 2;
        const double x = left ? cx - 7 : cx + 7;
        const Anchor anchor = left ? Anchor::kEnd : Anchor::kStart;
        const double at =
            labels.place(label, x, kTop + 14, 11, anchor, 13, kTop + 12, kTop + plot_h / 3);
        if (!std::isnan(at) && text_box(label, x, at, 11, anchor).x0 >= kLeft) {
          text(svg, label, x, at, anchor, " fill=\"" + s.color + "\" font-size=\"11\"");
        }
      }
    }
  }
  svg << "</svg>\n";
  return svg.str();
}

}  // namespace kvo::tools
