#include "parallel/trace/schedule_svg.h"

#include <algorithm>
#include <cstdio>

#include "tensor/error.h"

namespace loom::parallel {

namespace {

// Layout, in SVG user units (pixels at 100%).
constexpr double kLeft = 80, kRight = 20, kTop = 40, kRow = 34, kBox = 26, kWidth = 1000;

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// Text for an SVG element: the five characters XML reserves, escaped.
std::string escaped(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace

std::string schedule_svg(const std::vector<StageEvents>& stages, const std::string& title,
                         const std::string& bubble_line) {
  LOOM_CHECK(!stages.empty(), "schedule_svg: no stages");
  double t0 = 1e300, t1 = -1e300;
  for (const StageEvents& s : stages)
    for (const ScheduleEvent& e : s) t0 = std::min(t0, e.start_us), t1 = std::max(t1, e.end_us);
  LOOM_CHECK(t1 > t0, "schedule_svg: the stages recorded no events");
  bool chunked = false;  // interleaved 1F1B: label F3.1 (micro-batch 3, chunk 1)
  for (const StageEvents& s : stages)
    for (const ScheduleEvent& e : s) chunked |= e.chunk > 0;
  const double scale = (kWidth - kLeft - kRight) / (t1 - t0);  // pixels per microsecond
  const double height = kTop + kRow * double(stages.size()) + 50;

  std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + number(kWidth) + "\" height=\"" +
                    number(height) + "\" font-family=\"monospace\" font-size=\"12\">\n";
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  svg += "<text x=\"" + number(kLeft) + "\" y=\"22\" font-size=\"14\">" + escaped(title) + "</text>\n";
  for (size_t s = 0; s < stages.size(); ++s) {
    const double y = kTop + kRow * double(s);
    svg += "<text x=\"8\" y=\"" + number(y + kBox * 0.7) + "\">stage " + std::to_string(s) + "</text>\n";
    // The row's full span in light grey: whatever is not covered by a box is idle.
    svg += "<rect x=\"" + number(kLeft) + "\" y=\"" + number(y) + "\" width=\"" + number((t1 - t0) * scale) +
           "\" height=\"" + number(kBox) + "\" fill=\"#eeeeee\"/>\n";
    for (const ScheduleEvent& e : stages[s]) {
      const double x = kLeft + (e.start_us - t0) * scale, w = std::max(1.0, (e.end_us - e.start_us) * scale);
      const std::string label = chunked ? str(e.kind, e.mb, ".", e.chunk) : str(e.kind, e.mb);
      svg += "<g><title>" + label + ": " + number((e.end_us - e.start_us) / 1000.0) + " ms</title>";
      svg += "<rect x=\"" + number(x) + "\" y=\"" + number(y) + "\" width=\"" + number(w) + "\" height=\"" +
             number(kBox) + "\" fill=\"" + (e.kind == 'F' ? "#6fa8dc" : "#93c47d") + "\" stroke=\"#333333\"/>";
      if (w >= 8.0 * double(label.size()))  // the label only where it fits
        svg += "<text x=\"" + number(x + w / 2) + "\" y=\"" + number(y + kBox * 0.7) +
               "\" text-anchor=\"middle\">" + label + "</text>";
      svg += "</g>\n";
    }
  }
  const double bottom = kTop + kRow * double(stages.size());
  svg += "<text x=\"" + number(kLeft) + "\" y=\"" + number(bottom + 14) + "\">0 ms</text>\n";
  svg += "<text x=\"" + number(kWidth - kRight) + "\" y=\"" + number(bottom + 14) + "\" text-anchor=\"end\">" +
         number((t1 - t0) / 1000.0) + " ms</text>\n";
  svg += "<text x=\"" + number(kLeft) + "\" y=\"" + number(bottom + 36) + "\">" + escaped(bubble_line) + "</text>\n";
  return svg + "</svg>\n";
}

}  // namespace loom::parallel
