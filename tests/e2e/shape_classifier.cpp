#include "e2e/shape_classifier.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <numbers>
#include <sstream>

#include "xdit/core/error.h"

namespace xdit::testing {
namespace {

struct Rgb {
  double r, g, b;
};

// shapes.COLOURS, in colour_names() order.
const std::vector<Rgb>& palette() {
  static const std::vector<Rgb> colours = {{220, 40, 40},  {40, 170, 60},  {40, 80, 220},   {240, 210, 40},
                                           {140, 60, 180}, {245, 140, 30}, {245, 245, 245}, {20, 20, 20}};
  return colours;
}

double distance(const Rgb& a, const Rgb& b) { return std::hypot(a.r - b.r, a.g - b.g, a.b - b.b); }

size_t nearest_colour(const Rgb& c) {
  size_t best = 0;
  for (size_t i = 1; i < palette().size(); ++i) {
    if (distance(c, palette()[i]) < distance(c, palette()[best])) best = i;
  }
  return best;
}

Rgb pixel(const RgbImage& image, int64_t y, int64_t x) {
  const uint8_t* p = &image.pixels[static_cast<size_t>((y * image.width + x) * 3)];
  return {static_cast<double>(p[0]), static_cast<double>(p[1]), static_cast<double>(p[2])};
}

double median(std::vector<double> values) {
  std::nth_element(values.begin(), values.begin() + static_cast<long>(values.size() / 2), values.end());
  return values[values.size() / 2];
}

// A polygon in the shape's own units (radius 1, y down), as shapes.py draws it.
using Polygon = std::vector<std::array<double, 2>>;

Polygon template_polygon(const std::string& shape) {
  if (shape == "square") return {{-0.85, -0.85}, {0.85, -0.85}, {0.85, 0.85}, {-0.85, 0.85}};
  if (shape == "triangle") return {{0, -1}, {0.95, 0.8}, {-0.95, 0.8}};
  if (shape == "diamond") return {{0, -1}, {1, 0}, {0, 1}, {-1, 0}};
  if (shape == "cross") {
    const double t = 0.38;
    return {{-t, -1}, {t, -1}, {t, -t}, {1, -t}, {1, t}, {t, t}, {t, 1}, {-t, 1}, {-t, t}, {-1, t}, {-1, -t}, {-t, -t}};
  }
  if (shape == "star") {
    Polygon points;
    for (int k = 0; k < 10; ++k) {
      const double radius = k % 2 == 0 ? 1.0 : 0.45;
      const double angle = std::numbers::pi / 2 + k * std::numbers::pi / 5;
      points.push_back({radius * std::cos(angle), -radius * std::sin(angle)});
    }
    return points;
  }
  Polygon circle;  // a 64-gon is a circle at these sizes
  for (int k = 0; k < 64; ++k) {
    const double angle = 2 * std::numbers::pi * k / 64;
    circle.push_back({std::cos(angle), std::sin(angle)});
  }
  return circle;
}

bool inside(const Polygon& polygon, double x, double y) {
  bool in = false;
  for (size_t i = 0, j = polygon.size() - 1; i < polygon.size(); j = i++) {
    const auto& a = polygon[i];
    const auto& b = polygon[j];
    if ((a[1] > y) != (b[1] > y) && x < (b[0] - a[0]) * (y - a[1]) / (b[1] - a[1]) + a[0]) in = !in;
  }
  return in;
}

struct Bounds {
  double min_x, max_x, min_y, max_y;
};

Bounds bounds(const Polygon& polygon) {
  Bounds b{1e9, -1e9, 1e9, -1e9};
  for (const auto& [x, y] : polygon) {
    b.min_x = std::min(b.min_x, x), b.max_x = std::max(b.max_x, x);
    b.min_y = std::min(b.min_y, y), b.max_y = std::max(b.max_y, y);
  }
  return b;
}

// The polygon's area and area centroid (shoelace formula).
struct Moments {
  double area, x, y;
};

Moments moments(const Polygon& polygon) {
  double twice_area = 0, x = 0, y = 0;
  for (size_t i = 0, j = polygon.size() - 1; i < polygon.size(); j = i++) {
    const double cross = polygon[j][0] * polygon[i][1] - polygon[i][0] * polygon[j][1];
    twice_area += cross;
    x += (polygon[j][0] + polygon[i][0]) * cross, y += (polygon[j][1] + polygon[i][1]) * cross;
  }
  return {std::abs(twice_area) / 2, x / (3 * twice_area), y / (3 * twice_area)};
}

// The polygon's coverage of each pixel of a height x width picture, drawn with its origin at
// (cx, cy) and radius r in pixels (4 x 4 samples per pixel, as the renderer's supersampling).
std::vector<double> template_coverage(const Polygon& polygon, double cx, double cy, double r, int64_t height,
                                      int64_t width) {
  const Bounds b = bounds(polygon);
  const auto clamp = [](double at, int64_t side) {
    return std::clamp<int64_t>(static_cast<int64_t>(std::floor(at)), 0, side - 1);
  };
  std::vector<double> coverage(static_cast<size_t>(height * width), 0.0);
  constexpr int kSamples = 4;
  for (int64_t y = clamp(cy + r * b.min_y, height); y <= clamp(cy + r * b.max_y, height); ++y) {
    for (int64_t x = clamp(cx + r * b.min_x, width); x <= clamp(cx + r * b.max_x, width); ++x) {
      int hits = 0;
      for (int sy = 0; sy < kSamples; ++sy) {
        for (int sx = 0; sx < kSamples; ++sx) {
          const double u = (x + (sx + 0.5) / kSamples - cx) / r, v = (y + (sy + 0.5) / kSamples - cy) / r;
          hits += inside(polygon, u, v) ? 1 : 0;
        }
      }
      coverage[static_cast<size_t>(y * width + x)] = static_cast<double>(hits) / (kSamples * kSamples);
    }
  }
  return coverage;
}

// A separable Gaussian blur of `sigma` pixels, zero outside the picture.
std::vector<double> gaussian_blur(const std::vector<double>& image, int64_t height, int64_t width, double sigma) {
  const int64_t reach = static_cast<int64_t>(std::ceil(3 * sigma));
  std::vector<double> kernel(static_cast<size_t>(2 * reach + 1));
  double total = 0;
  for (int64_t k = -reach; k <= reach; ++k) {
    total += kernel[static_cast<size_t>(k + reach)] = std::exp(-0.5 * static_cast<double>(k * k) / (sigma * sigma));
  }
  for (double& weight : kernel) weight /= total;
  const auto pass = [&](const std::vector<double>& from, bool along_rows) {
    std::vector<double> to(from.size(), 0.0);
    for (int64_t y = 0; y < height; ++y) {
      for (int64_t x = 0; x < width; ++x) {
        double sum = 0;
        for (int64_t k = -reach; k <= reach; ++k) {
          const int64_t fy = along_rows ? y : y + k, fx = along_rows ? x + k : x;
          if (fy < 0 || fx < 0 || fy >= height || fx >= width) continue;
          sum += kernel[static_cast<size_t>(k + reach)] * from[static_cast<size_t>(fy * width + fx)];
        }
        to[static_cast<size_t>(y * width + x)] = sum;
      }
    }
    return to;
  };
  return pass(pass(image, true), false);
}

// How well a template explains a region: the polygon, centred on the region's centroid, scaled
// and softened by a Gaussian blur, then cut at half coverage as the region was cut; the score is
// the best intersection over union with the region, the radius the one that gave it.
struct TemplateFit {
  double score = 0, radius = 0;
};

TemplateFit fit_template(const Polygon& polygon, const std::vector<bool>& region, double area, double centre_x,
                         double centre_y, int64_t height, int64_t width) {
  // A decoded picture's edges are soft, as a blur of up to ~2 px (docs/getting-started.md): a soft
  // star cut at half coverage loses its points' tips and fills the notches between them.
  static const double kBlurs[] = {0.0, 1.0, 2.0};
  const Moments m = moments(polygon);
  const double area_radius = std::sqrt(area / m.area);
  TemplateFit best;
  for (double scale = 0.8; scale < 1.26; scale += 0.025) {
    const double r = area_radius * scale;
    const std::vector<double> sharp =
        template_coverage(polygon, centre_x - r * m.x, centre_y - r * m.y, r, height, width);
    for (const double sigma : kBlurs) {
      const std::vector<double> coverage = sigma > 0 ? gaussian_blur(sharp, height, width, sigma) : sharp;
      double intersection = 0, union_ = 0;
      for (size_t i = 0; i < coverage.size(); ++i) {
        const bool drawn = coverage[i] > 0.5;
        intersection += drawn && region[i] ? 1 : 0;
        union_ += drawn || region[i] ? 1 : 0;
      }
      const double score = union_ > 0 ? intersection / union_ : 0.0;
      if (score > best.score) best = {score, r};
    }
  }
  return best;
}

// The largest 4-connected region of `mask` ([H * W], row-major).
std::vector<bool> largest_region(const std::vector<bool>& mask, int64_t height, int64_t width) {
  std::vector<int> label(mask.size(), -1);
  std::vector<bool> best;
  size_t best_size = 0;
  for (size_t start = 0; start < mask.size(); ++start) {
    if (!mask[start] || label[start] >= 0) continue;
    std::vector<bool> region(mask.size(), false);
    std::vector<size_t> stack = {start};
    label[start] = 1;
    size_t size = 0;
    while (!stack.empty()) {
      const size_t at = stack.back();
      stack.pop_back();
      region[at] = true;
      ++size;
      const int64_t y = static_cast<int64_t>(at) / width, x = static_cast<int64_t>(at) % width;
      const int64_t neighbours[4][2] = {{y - 1, x}, {y + 1, x}, {y, x - 1}, {y, x + 1}};
      for (const auto& [ny, nx] : neighbours) {
        if (ny < 0 || nx < 0 || ny >= height || nx >= width) continue;
        const size_t next = static_cast<size_t>(ny * width + nx);
        if (mask[next] && label[next] < 0) {
          label[next] = 1;
          stack.push_back(next);
        }
      }
    }
    if (size > best_size) best_size = size, best = std::move(region);
  }
  return best;
}

}  // namespace

const std::vector<std::string>& shape_names() {
  static const std::vector<std::string> names = {"circle", "square", "triangle", "diamond", "cross", "star"};
  return names;
}

const std::vector<std::string>& colour_names() {
  static const std::vector<std::string> names = {"red", "green", "blue", "yellow", "purple", "orange", "white", "black"};
  return names;
}

ShapeReading read_shape_picture(const RgbImage& picture) {
  const int64_t height = picture.height, width = picture.width;
  XDIT_CHECK(height >= 8 && width >= 8, "read_shape_picture: a ", width, "x", height, " picture is too small");

  // Background: the median of the outer two-pixel ring.
  std::vector<double> ring[3];
  for (int64_t y = 0; y < height; ++y) {
    for (int64_t x = 0; x < width; ++x) {
      if (y >= 2 && x >= 2 && y < height - 2 && x < width - 2) continue;
      const Rgb c = pixel(picture, y, x);
      ring[0].push_back(c.r), ring[1].push_back(c.g), ring[2].push_back(c.b);
    }
  }
  const size_t background = nearest_colour({median(ring[0]), median(ring[1]), median(ring[2])});
  const Rgb& back = palette()[background];

  // Shape colour: the most common other palette colour among pixels clearly off the background.
  std::vector<int> votes(palette().size(), 0);
  for (int64_t y = 0; y < height; ++y) {
    for (int64_t x = 0; x < width; ++x) {
      const Rgb c = pixel(picture, y, x);
      const size_t nearest = nearest_colour(c);
      if (nearest != background && distance(c, back) > 60) ++votes[nearest];
    }
  }
  votes[background] = -1;
  const size_t colour = static_cast<size_t>(std::max_element(votes.begin(), votes.end()) - votes.begin());
  ShapeReading reading;
  reading.background = colour_names()[background];
  if (votes[colour] == 0) return reading;  // no shape drawn
  reading.colour = colour_names()[colour];

  // Shape pixels: nearer the shape colour than the background along the line between them.
  const Rgb& fore = palette()[colour];
  const double span = std::pow(distance(fore, back), 2);
  std::vector<bool> mask(static_cast<size_t>(height * width));
  for (int64_t y = 0; y < height; ++y) {
    for (int64_t x = 0; x < width; ++x) {
      const Rgb c = pixel(picture, y, x);
      const double along = ((c.r - back.r) * (fore.r - back.r) + (c.g - back.g) * (fore.g - back.g) +
                            (c.b - back.b) * (fore.b - back.b)) / span;
      mask[static_cast<size_t>(y * width + x)] = along > 0.5;
    }
  }
  const std::vector<bool> region = largest_region(mask, height, width);
  if (region.empty()) return reading;
  double sum_y = 0, sum_x = 0, area = 0;
  for (int64_t y = 0; y < height; ++y) {
    for (int64_t x = 0; x < width; ++x) {
      if (!region[static_cast<size_t>(y * width + x)]) continue;
      sum_y += y + 0.5, sum_x += x + 0.5, area += 1;
    }
  }
  const double centre_y = sum_y / area, centre_x = sum_x / area;

  const auto third = [](double at, int64_t side) { return std::min<int64_t>(2, static_cast<int64_t>(3 * at / side)); };
  static const char* const kRows[] = {"top", "middle", "bottom"};
  static const char* const kColumns[] = {"left", "center", "right"};
  reading.position = std::string(kRows[third(centre_y, height)]) + " " + kColumns[third(centre_x, width)];

  double radius = 0;
  for (const std::string& shape : shape_names()) {
    const TemplateFit fit = fit_template(template_polygon(shape), region, area, centre_x, centre_y, height, width);
    if (fit.score > reading.shape_score) reading.shape_score = fit.score, reading.shape = shape, radius = fit.radius;
  }

  // Size: shapes.py draws every shape at radius 0.38, 0.47 or 0.56 of the side over 2 (+-4%); the
  // fitted radius falls in one of three bands, split at the geometric means.
  const double extent = 2 * radius / static_cast<double>(width);
  reading.size = extent < 0.423 ? "small" : extent < 0.513 ? "medium" : "large";
  return reading;
}

RgbImage crop_tile(const RgbImage& atlas, int row, int column, int tile) {
  XDIT_CHECK((row + 1) * tile <= atlas.height && (column + 1) * tile <= atlas.width, "crop_tile: tile (", row, ", ",
             column, ") is outside the ", atlas.width, "x", atlas.height, " atlas");
  RgbImage out{tile, tile, std::vector<uint8_t>(static_cast<size_t>(tile * tile * 3))};
  for (int y = 0; y < tile; ++y) {
    const uint8_t* from = &atlas.pixels[static_cast<size_t>(((row * tile + y) * atlas.width + column * tile) * 3)];
    std::copy(from, from + tile * 3, &out.pixels[static_cast<size_t>(y * tile * 3)]);
  }
  return out;
}

std::vector<PromptCase> read_prompt_cases(const std::string& path) {
  std::ifstream in(path);
  XDIT_CHECK(in.good(), path, ": cannot open");
  std::string line;
  std::getline(in, line);
  XDIT_CHECK(line == "prompt\tshape\tcolour\tbackground\tsize\tposition", path, ": line 1 is not the expected header");
  std::vector<PromptCase> cases;
  for (int number = 2; std::getline(in, line); ++number) {
    std::vector<std::string> fields;
    std::stringstream row(line);
    for (std::string field; std::getline(row, field, '\t');) fields.push_back(field);
    XDIT_CHECK(fields.size() == 6, path, ":", number, ": expected 6 tab-separated fields, got ", fields.size());
    cases.push_back({fields[0], fields[1], fields[2], fields[3], fields[4], fields[5]});
  }
  return cases;
}

}  // namespace xdit::testing
