// The schedule of the step actually run, as a picture (SVG, opens in any
// browser): one row per pipeline stage, time running left to right, each
// forward and backward a box at its measured start and end, labelled with its
// micro-batch (and chunk, F3.1, under interleaved 1F1B) where the label fits,
// and the idle time left blank - the bubble, seen. Forwards are blue, backwards
// green (a backward takes about twice a forward, which the boxes show), each
// chunk its own shade; every box has a tooltip (its name and length). Under
// the rows, the bubble measured beside the theory, wrapped to the picture's width.
//
//   stage 0 |[F0][F1][F2][F3]        [ B0 ][F4][ B1 ]...
//   stage 1 |    [F0][F1][F2]    [ B0 ][F3][ B1 ]...
//
// schedule_diagram.h draws the same events as text, in slots rather than time.
#pragma once

#include <string>
#include <vector>

#include "parallel/trace/schedule_diagram.h"

namespace loom::parallel {

// The SVG document. title: its first line (e.g. "1f1b, pp 4, m 8");
// bubble_line: the text under the rows (the measured and theoretical bubble).
std::string schedule_svg(const std::vector<StageEvents>& stages, const std::string& title,
                         const std::string& bubble_line);

}  // namespace loom::parallel
