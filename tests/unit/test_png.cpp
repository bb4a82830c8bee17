#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "support/files.h"
#include "support/reference.h"
#include "xdit/core/error.h"
#include "xdit/io/png.h"

namespace xdit {
namespace {

Tensor image_of(const std::vector<float>& values, int64_t height, int64_t width) {
  return Tensor::from_floats(values, {height, width, 3});
}

TEST(Png, RoundsLikeNumpyToPil) {
  // (x * 255).round() in f32 with ties to even, after clamping to [0, 1].
  const Tensor image = image_of({0.0f, 1.0f, -0.5f, 1.5f, 0.5f / 255.0f, 1.5f / 255.0f, 2.5f / 255.0f, 0.5f, 0.2f},
                                1, 3);
  const RgbImage rgb = to_rgb8(image);
  const std::vector<uint8_t> expected = {0, 255, 0, 255, 0, 2, 2, 128, 51};
  EXPECT_EQ(rgb.pixels, expected);
  EXPECT_EQ(rgb.height, 1);
  EXPECT_EQ(rgb.width, 3);
}

TEST(Png, WritesPixelsAndUtf8TextThatReadBack) {
  const auto folder = testing::scratch_folder("png_round_trip");
  RgbImage image{5, 7, {}};
  for (int i = 0; i < 5 * 7 * 3; ++i) image.pixels.push_back(static_cast<uint8_t>(i * 37 % 256));
  const PngText text = {{"prompt", "a fox \xe7\x8b\x90\xe7\x8b\xb8 \xf0\x9f\xa6\x8a"}, {"seed", "42"}, {"negative_prompt", ""}};
  const std::string path = (folder / "out.png").string();
  write_png(path, image, text);

  PngText read_text;
  const RgbImage back = read_png(path, &read_text);
  EXPECT_EQ(back.height, 5);
  EXPECT_EQ(back.width, 7);
  EXPECT_EQ(back.pixels, image.pixels);
  const PngText written = {text[0], text[1]};  // the empty entry is left out
  EXPECT_EQ(read_text, written);
  // Only the PNG itself remains: the temporary file was renamed.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(folder), std::filesystem::directory_iterator()), 1);
}

TEST(Png, BadWritesNameThePathAndLeaveNothing) {
  const auto folder = testing::scratch_folder("png_bad");
  RgbImage image{2, 2, std::vector<uint8_t>(12, 7)};
  testing::expect_error([&] { write_png((folder / "missing" / "x.png").string(), image); }, {"missing/x.png"});
  testing::expect_error([&] { write_png((folder / "k.png").string(), image, {{"", "v"}}); }, {"keyword"});
  testing::expect_error([&] { write_png((folder / "k.png").string(), image, {{std::string(80, 'k'), "v"}}); },
                        {"keyword"});
  RgbImage short_image{2, 2, std::vector<uint8_t>(11, 7)};
  testing::expect_error([&] { write_png((folder / "s.png").string(), short_image); }, {"s.png"});
  EXPECT_TRUE(std::filesystem::is_empty(folder));
  const std::vector<float> four = {0, 0, 0, 0};
  testing::expect_error([&] { to_rgb8(Tensor::from_floats(four, {1, 1, 4})); }, {"[H, W, 3]"});
  testing::expect_error([&] { read_png((folder / "none.png").string()); }, {"none.png"});
}

}  // namespace
}  // namespace xdit
