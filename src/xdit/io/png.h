// PNG output: 8-bit RGB with UTF-8 text chunks (the generation parameters), written atomically.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "xdit/core/tensor.h"

namespace xdit {

struct RgbImage {
  int64_t height = 0;
  int64_t width = 0;
  std::vector<uint8_t> pixels;  // row-major RGB, height * width * 3 bytes
};

// One image of a [H, W, 3] float tensor in [0, 1] (values outside are clamped), rounded as
// diffusers' numpy_to_pil does: round-half-even of x * 255 in f32.
RgbImage to_rgb8(const Tensor& image);

// Keyword (Latin-1, 1-79 characters) and UTF-8 text. Entries with empty text are not written.
using PngText = std::vector<std::pair<std::string, std::string>>;

void write_png(const std::string& path, const RgbImage& image, const PngText& text = {});

// Reads an 8-bit RGB or RGBA PNG (alpha dropped) and its text chunks; for tests and tools.
RgbImage read_png(const std::string& path, PngText* text = nullptr);

}  // namespace xdit
