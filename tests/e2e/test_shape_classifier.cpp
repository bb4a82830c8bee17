// The demo model's pixel classifier, checked on ground-truth pictures drawn by the training
// renderer (tools/train_demo/shapes.py via make_e2e_fixtures.py), sharp and blurred by PIL as
// softly as a decoded picture: it must read every one right, or the adherence numbers it gives
// the model would mean nothing.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "e2e/shape_classifier.h"
#include "support/reference.h"
#include "xdit/io/png.h"

namespace xdit::testing {
namespace {

const std::filesystem::path kFixtures = std::filesystem::path(XDIT_SOURCE_DIR) / "tests/e2e/fixtures";
constexpr int kTile = 64;
constexpr int kTilesPerRow = 8;

void expect_every_tile_read_right(const std::string& atlas_name) {
  const RgbImage atlas = read_png((kFixtures / atlas_name).string());
  const std::vector<PromptCase> cases = read_prompt_cases((kFixtures / "shapes_atlas.tsv").string());
  ASSERT_EQ(cases.size(), 48u);
  for (size_t i = 0; i < cases.size(); ++i) {
    const PromptCase& expected = cases[i];
    SCOPED_TRACE(expected.prompt);
    const RgbImage tile =
        crop_tile(atlas, static_cast<int>(i) / kTilesPerRow, static_cast<int>(i) % kTilesPerRow, kTile);
    const ShapeReading reading = read_shape_picture(tile);
    EXPECT_EQ(reading.background, expected.background);
    EXPECT_EQ(reading.colour, expected.colour);
    EXPECT_EQ(reading.shape, expected.shape) << "best overlap " << reading.shape_score;
    EXPECT_EQ(reading.size, expected.size);
    EXPECT_EQ(reading.position, expected.position);
  }
}

TEST(ShapeClassifier, ReadsEveryGroundTruthPicture) { expect_every_tile_read_right("shapes_atlas.png"); }

// A Gaussian blur of 1.5 px: the points of a star cut at half coverage are shorter and its
// notches shallower. A classifier that stretched sharp templates over the region's bounding box
// read 3 of these 8 stars as diamonds and 6 more pictures a size too small.
TEST(ShapeClassifier, ReadsEverySoftenedGroundTruthPicture) { expect_every_tile_read_right("shapes_atlas_soft.png"); }

TEST(ShapeClassifier, APlainPictureHasNoShape) {
  RgbImage blue{kTile, kTile, {}};
  for (int i = 0; i < kTile * kTile; ++i) blue.pixels.insert(blue.pixels.end(), {40, 80, 220});
  const ShapeReading reading = read_shape_picture(blue);
  EXPECT_EQ(reading.background, "blue");
  EXPECT_EQ(reading.shape, "");
}

TEST(ShapeClassifier, BadInputsAreClearErrors) {
  expect_error([] { read_shape_picture(RgbImage{4, 4, std::vector<uint8_t>(48)}); }, {"4x4", "too small"});
  expect_error([] { read_prompt_cases("/nonexistent/prompts.tsv"); }, {"/nonexistent/prompts.tsv", "cannot open"});
}

}  // namespace
}  // namespace xdit::testing
