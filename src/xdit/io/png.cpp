#include "xdit/io/png.h"

#include <spng.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>

#include "xdit/core/error.h"
#include "xdit/io/atomic_file.h"

namespace xdit {
namespace {

struct ContextDeleter {
  void operator()(spng_ctx* ctx) const { spng_ctx_free(ctx); }
};
using Context = std::unique_ptr<spng_ctx, ContextDeleter>;

void check_spng(int rc, const std::string& path, const char* what) {
  if (rc != 0) fail("cannot ", what, " ", path, ": ", spng_strerror(rc));
}

}  // namespace

RgbImage to_rgb8(const Tensor& image) {
  XDIT_CHECK(image.dim() == 3 && image.size(2) == 3, "to_rgb8: expected an [H, W, 3] image, got ",
             shape_str(image.shape()));
  const Tensor values = image.to(DType::F32).contiguous();
  RgbImage out{image.size(0), image.size(1), std::vector<uint8_t>(static_cast<size_t>(values.numel()))};
  const float* v = values.data<float>();
  for (size_t i = 0; i < out.pixels.size(); ++i) {
    const float scaled = std::clamp(v[i], 0.0f, 1.0f) * 255.0f;
    out.pixels[i] = static_cast<uint8_t>(std::nearbyint(scaled));  // the default rounding mode: half to even
  }
  return out;
}

void write_png(const std::string& path, const RgbImage& image, const PngText& text) {
  XDIT_CHECK(image.height > 0 && image.width > 0 && image.height <= INT32_MAX && image.width <= INT32_MAX,
             "cannot write ", path, ": image size ", image.height, "x", image.width, " is not valid for PNG");
  XDIT_CHECK(image.pixels.size() == static_cast<size_t>(image.height * image.width * 3), "cannot write ", path,
             ": ", image.pixels.size(), " bytes for a ", image.height, "x", image.width, " RGB image");
  Context ctx(spng_ctx_new(SPNG_CTX_ENCODER));
  XDIT_CHECK(ctx != nullptr, "cannot write ", path, ": out of memory");
  check_spng(spng_set_option(ctx.get(), SPNG_ENCODE_TO_BUFFER, 1), path, "write");

  spng_ihdr ihdr{};
  ihdr.width = static_cast<uint32_t>(image.width);
  ihdr.height = static_cast<uint32_t>(image.height);
  ihdr.bit_depth = 8;
  ihdr.color_type = SPNG_COLOR_TYPE_TRUECOLOR;
  check_spng(spng_set_ihdr(ctx.get(), &ihdr), path, "write");

  std::vector<spng_text> chunks;
  std::vector<std::string> values;
  values.reserve(text.size());
  char empty[1] = {0};
  for (const auto& [keyword, value] : text) {
    spng_text chunk{};
    XDIT_CHECK(!keyword.empty() && keyword.size() < sizeof chunk.keyword, "cannot write ", path,
               ": PNG text keyword \"", keyword, "\" must have 1 to 79 characters");
    if (value.empty()) continue;  // PNG text chunks cannot be empty
    std::memcpy(chunk.keyword, keyword.c_str(), keyword.size() + 1);
    values.push_back(value);
    chunk.type = SPNG_ITXT;  // UTF-8, so prompts in any script survive
    chunk.length = value.size();
    chunk.text = values.back().data();
    chunk.language_tag = empty;
    chunk.translated_keyword = empty;
    chunks.push_back(chunk);
  }
  if (!chunks.empty()) {
    check_spng(spng_set_text(ctx.get(), chunks.data(), static_cast<uint32_t>(chunks.size())), path, "write");
  }
  check_spng(spng_encode_image(ctx.get(), image.pixels.data(), image.pixels.size(), SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE),
             path, "write");

  int rc = 0;
  size_t size = 0;
  std::unique_ptr<void, decltype(&std::free)> buffer(spng_get_png_buffer(ctx.get(), &size, &rc), &std::free);
  check_spng(rc, path, "write");
  write_file_atomically(path, std::string_view(static_cast<const char*>(buffer.get()), size));
}

RgbImage read_png(const std::string& path, PngText* text) {
  std::unique_ptr<FILE, decltype(&std::fclose)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  XDIT_CHECK(file != nullptr, "cannot read ", path, ": ", std::strerror(errno));
  Context ctx(spng_ctx_new(0));
  XDIT_CHECK(ctx != nullptr, "cannot read ", path, ": out of memory");
  check_spng(spng_set_png_file(ctx.get(), file.get()), path, "read");
  spng_ihdr ihdr{};
  check_spng(spng_get_ihdr(ctx.get(), &ihdr), path, "read");

  size_t size = 0;
  check_spng(spng_decoded_image_size(ctx.get(), SPNG_FMT_RGB8, &size), path, "read");
  RgbImage image{ihdr.height, ihdr.width, std::vector<uint8_t>(size)};
  check_spng(spng_decode_image(ctx.get(), image.pixels.data(), size, SPNG_FMT_RGB8, 0), path, "read");

  if (text) {
    text->clear();
    uint32_t count = 0;
    if (spng_get_text(ctx.get(), nullptr, &count) == 0 && count > 0) {
      std::vector<spng_text> chunks(count);
      check_spng(spng_get_text(ctx.get(), chunks.data(), &count), path, "read");
      for (const spng_text& c : chunks) text->emplace_back(c.keyword, std::string(c.text, c.length));
    }
  }
  return image;
}

}  // namespace xdit
