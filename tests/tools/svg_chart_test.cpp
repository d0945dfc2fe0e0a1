// kvo-vram's chart: lines run left to right whatever order the contexts came in, no two labels
// collide, every label stays inside the picture, and flagged points are marked.
#include <gtest/gtest.h>

#include <cmath>
#include <regex>
#include <string>
#include <vector>

#include "tools/cli/svg_chart.hpp"

namespace kvo::tools {
namespace {

std::string ticks(double x) {
  return std::to_string(static_cast<long long>(x) / 1024) + "K";
}
std::string gib(double y) {
  char text[32];
  std::snprintf(text, sizeof text, "%g GiB", y);
  return text;
}

// Three series over `contexts` shaped like kvo-vram's: all-on-device grows fastest and runs far
// above a 24 GiB budget.
Chart chart_of(const std::vector<double>& contexts, double budget = 24) {
  Chart c;
  c.title = "llama3-8b: device memory against context (1 sequence)";
  c.x_label = "context (tokens, log scale)";
  c.y_label = "device memory";
  c.x_tick = ticks;
  c.y_tick = gib;
  c.flag_label = "host memory short";
  const char* names[] = {"everything on the device", "transformers offloaded static", "kvoffload"};
  for (int s = 0; s < 3; ++s) {
    ChartSeries series;
    series.label = names[s];
    series.color = "#123456";
    for (double x : contexts) {
      const double per_token = s == 0 ? 1.0 / 8192 : s == 1 ? 1.0 / 65536 : 1.0 / 131072;
      series.x.push_back(x);
      series.y.push_back(15 + x * per_token);
      series.flagged.push_back(x > 200000);
    }
    c.series.push_back(series);
  }
  c.lines.push_back({"budget " + gib(budget), budget});
  return c;
}

struct Text {
  double x0, y0, x1, y1;
  std::string content;
};

std::size_t glyphs(const std::string& text) {
  std::size_t n = 0;
  for (unsigned char c : text) n += (c & 0xc0) != 0x80 ? 1 : 0;
  return n;
}

std::string unescape(std::string s) {
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""}, {"&amp;", "&"}}) {
    for (std::size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + 1)) {
      s.replace(at, from.size(), to);
    }
  }
  return s;
}

double attribute(const std::string& attrs, const std::string& name, double fallback) {
  std::smatch m;
  if (!std::regex_search(attrs, m, std::regex(" " + name + "=\"([-0-9.]+)\""))) return fallback;
  return std::stod(m[1]);
}

// Every horizontal text of the SVG with the box it takes (the same measure as a sans-serif
// font: 0.6 of the size per character, 0.8 above the baseline, 0.25 below).
std::vector<Text> texts(const std::string& svg) {
  std::vector<Text> out;
  const std::regex text_re("<text([^>]*)>([^<]*)</text>");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), text_re);
       it != std::sregex_iterator(); ++it) {
    const std::string attrs = (*it)[1];
    if (attrs.find("transform") != std::string::npos) continue;  // the rotated axis label
    const std::string content = unescape((*it)[2]);
    const double x = attribute(attrs, "x", 0), y = attribute(attrs, "y", 0);
    const double size = attribute(attrs, "font-size", 13);
    const double w = 0.6 * size * static_cast<double>(glyphs(content));
    const double left = attrs.find("\"middle\"") != std::string::npos ? x - w / 2
                        : attrs.find("\"end\"") != std::string::npos  ? x - w
                                                                      : x;
    out.push_back({left, y - 0.8 * size, left + w, y + 0.25 * size, content});
  }
  return out;
}

void expect_clean_labels(const std::string& svg) {
  std::smatch size;
  ASSERT_TRUE(
      std::regex_search(svg, size, std::regex("<svg[^>]* width=\"([0-9]+)\" height=\"([0-9]+)\"")));
  const double width = std::stod(size[1]), height = std::stod(size[2]);
  const std::vector<Text> all = texts(svg);
  ASSERT_GT(all.size(), 10u);
  for (std::size_t i = 0; i < all.size(); ++i) {
    const Text& a = all[i];
    EXPECT_GE(a.x0, 0) << a.content;
    EXPECT_LE(a.x1, width) << a.content;
    EXPECT_GE(a.y0, 0) << a.content;
    EXPECT_LE(a.y1, height) << a.content;
    for (std::size_t j = i + 1; j < all.size(); ++j) {
      const Text& b = all[j];
      const bool overlap =
          a.x0 < b.x1 - 0.5 && b.x0 < a.x1 - 0.5 && a.y0 < b.y1 - 0.5 && b.y0 < a.y1 - 0.5;
      EXPECT_FALSE(overlap) << "'" << a.content << "' collides with '" << b.content << "'";
    }
  }
}

std::vector<double> polyline_xs(const std::string& svg) {
  std::smatch m;
  EXPECT_TRUE(std::regex_search(svg, m, std::regex("<polyline[^>]*points=\"([^\"]*)\"")));
  std::vector<double> xs;
  const std::string points = m[1];
  const std::regex point_re("([-0-9.]+),[-0-9.]+");
  for (auto it = std::sregex_iterator(points.begin(), points.end(), point_re);
       it != std::sregex_iterator(); ++it) {
    xs.push_back(std::stod((*it)[1]));
  }
  return xs;
}

TEST(SvgChart, UnsortedContextsDrawLinesLeftToRight) {
  const std::string svg = render_svg(chart_of({131072, 4096, 32768}));
  const std::vector<double> xs = polyline_xs(svg);
  ASSERT_EQ(xs.size(), 3u);
  EXPECT_LT(xs[0], xs[1]);
  EXPECT_LT(xs[1], xs[2]);
  expect_clean_labels(svg);
}

TEST(SvgChart, OneContextSitsInsideThePlot) {
  const std::string svg = render_svg(chart_of({131072}));
  const std::vector<double> xs = polyline_xs(svg);
  ASSERT_EQ(xs.size(), 1u);
  EXPECT_GT(xs[0], 90 + 50);          // not on the left edge
  EXPECT_LT(xs[0], 1000 - 290 - 50);  // nor on the right one
  EXPECT_NE(svg.find(">128K<"), std::string::npos);
  expect_clean_labels(svg);
}

TEST(SvgChart, FiveHundredContextsKeepEveryLabelApart) {
  std::vector<double> contexts;
  for (int i = 0; i < 500; ++i) contexts.push_back(4096 + 2048.0 * i);
  const std::string svg = render_svg(chart_of(contexts));
  EXPECT_EQ(polyline_xs(svg).size(), 500u);
  expect_clean_labels(svg);
  // The values of points clipped at the top are still told.
  EXPECT_NE(svg.find("\xe2\x86\x91 "), std::string::npos);
}

TEST(SvgChart, TheBudgetLabelNeverCoversTheLegend) {
  // Budgets whose line runs through the legend's rows, and others.
  for (double budget : {20.0, 24.0, 28.0, 33.0, 40.0, 47.0, 60.0}) {
    const std::string svg = render_svg(chart_of({4096, 32768, 131072, 524288}, budget));
    EXPECT_NE(svg.find(">budget " + gib(budget) + "<"), std::string::npos) << budget;
    expect_clean_labels(svg);
  }
}

TEST(SvgChart, HostMemoryShortPointsAreMarked) {
  const std::string svg = render_svg(chart_of({4096, 131072, 262144, 524288}));
  // Two contexts past 200000 in each of three series.
  std::size_t crosses = 0;
  for (std::size_t at = svg.find("<path"); at != std::string::npos;
       at = svg.find("<path", at + 1)) {
    ++crosses;
  }
  EXPECT_EQ(crosses, 6u);
  EXPECT_NE(svg.find("<title>host memory short</title>"), std::string::npos);
  EXPECT_NE(svg.find(": host memory short</text>"), std::string::npos);
  // No flagged point, no legend entry.
  Chart plain = chart_of({4096, 8192});
  EXPECT_EQ(render_svg(plain).find("host memory short"), std::string::npos);
}

}  // namespace
}  // namespace kvo::tools
