// A pixel classifier for the shapes-demo pictures (tools/train_demo/shapes.py): which colour the
// background is, which colour the shape is, and which shape it is, from pixel statistics alone.
// The end-to-end tests check the demo model's prompt adherence with it.
#pragma once

#include <string>
#include <vector>

#include "xdit/io/png.h"

namespace xdit::testing {

// The grammar's vocabulary, as shapes.py defines it.
const std::vector<std::string>& shape_names();   // circle, square, triangle, diamond, cross, star
const std::vector<std::string>& colour_names();  // red, green, blue, yellow, purple, orange, white, black

struct ShapeReading {
  std::string shape;
  std::string colour;      // the shape's
  std::string background;
  std::string size;        // small, medium or large: the shape's extent against the picture's side
  std::string position;    // "top left" ... "bottom right": the 3 x 3 cell of the shape's centroid
  double shape_score = 0;  // intersection over union of the region with the best-fitting template, 0..1
};

// Reads one picture. The background is the median of the outer ring of pixels, snapped to the
// nearest palette colour; the shape colour is the most common palette colour among the pixels far
// from the background. The largest connected region of shape-coloured pixels gives the position
// (its centroid's cell) and the shape: the template that, centred there, scaled, and blurred by
// 0, 1 or 2 px as a decoded picture's soft edges are, overlaps it best; that fit's radius gives
// the size.
ShapeReading read_shape_picture(const RgbImage& picture);

// The tile at (row, column) of an atlas of `tile` x `tile` pictures.
RgbImage crop_tile(const RgbImage& atlas, int row, int column, int tile);

// One row of a prompts TSV written by tools/train_demo/make_e2e_fixtures.py.
struct PromptCase {
  std::string prompt;
  std::string shape;
  std::string colour;
  std::string background;
  std::string size;
  std::string position;
};

// Reads the TSV (header "prompt shape colour background size position"); throws naming the file
// and line for a malformed row.
std::vector<PromptCase> read_prompt_cases(const std::string& path);

}  // namespace xdit::testing
