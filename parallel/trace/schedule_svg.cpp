#include "parallel/trace/schedule_svg.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

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

// Forwards blue, backwards (or their input half B) green, the weights' half W
// of a zero-bubble schedule orange; each model chunk (interleaved 1F1B) its
// own shade, so a stage's two chunks tell apart at a glance.
const char* fill(const ScheduleEvent& e) {
  static const char* forward[] = {"#6fa8dc", "#1c4587", "#a4c2f4", "#3c78d8"};
  static const char* backward[] = {"#93c47d", "#274e13", "#b6d7a8", "#6aa84f"};
  static const char* weights[] = {"#f6b26b", "#b45f06", "#f9cb9c", "#e69138"};
  return (e.kind == 'F' ? forward : e.kind == 'W' ? weights : backward)[e.chunk % 4];
}

// A caption cut into lines of at most `width` characters, at spaces.
std::vector<std::string> wrapped(const std::string& text, size_t width) {
  std::vector<std::string> lines(1);
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find(' ', start);
    if (end == std::string::npos) end = text.size();
    const std::string word = text.substr(start, end - start);
    if (!lines.back().empty() && lines.back().size() + 1 + word.size() > width) lines.emplace_back();
    lines.back() += (lines.back().empty() ? "" : " ") + word;
    start = end + 1;
  }
  return lines;
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
  // 12 px monospace is ~7.2 px a character: the caption wraps inside the picture.
  const std::vector<std::string> caption = wrapped(bubble_line, size_t((kWidth - kLeft - kRight) / 7.2));
  const double height = kTop + kRow * double(stages.size()) + 36 + 16 * double(caption.size());

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
             number(kBox) + "\" fill=\"" + fill(e) + "\" stroke=\"#333333\"/>";
      // The label where it fits: at 12 px (~7.2 px a character), else at 9 px (~5.4); the tooltip always.
      const double chars = double(label.size());
      const char* size = w >= 7.2 * chars + 4 ? "12" : w >= 5.4 * chars + 2 ? "9" : nullptr;
      const char* ink = e.chunk % 2 == 1 ? "white" : "black";  // readable on the dark shades
      if (size)
        svg += "<text x=\"" + number(x + w / 2) + "\" y=\"" + number(y + kBox * 0.7) + "\" font-size=\"" + size +
               "\" fill=\"" + ink + "\" text-anchor=\"middle\">" + label + "</text>";
      svg += "</g>\n";
    }
  }
  const double bottom = kTop + kRow * double(stages.size());
  svg += "<text x=\"" + number(kLeft) + "\" y=\"" + number(bottom + 14) + "\">0 ms</text>\n";
  svg += "<text x=\"" + number(kWidth - kRight) + "\" y=\"" + number(bottom + 14) + "\" text-anchor=\"end\">" +
         number((t1 - t0) / 1000.0) + " ms</text>\n";
  for (size_t i = 0; i < caption.size(); ++i)
    svg += "<text x=\"" + number(kLeft) + "\" y=\"" + number(bottom + 36 + 16 * double(i)) + "\">" +
           escaped(caption[i]) + "</text>\n";
  return svg + "</svg>\n";
}

}  // namespace loom::parallel
