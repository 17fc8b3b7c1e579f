// JsonNumber / NumberFromJson: non-finite numbers survive a trip through JSON as null -> NaN, and
// a value of another type is an error rather than a made-up number.
#include "core/json_number.h"

#include <gtest/gtest.h>

#include <limits>

namespace keel {
namespace {

TEST(JsonNumberTest, FiniteNumbersRoundTripExactly) {
  for (double v : {0.0, -2.5, 1e-300, 6.02214076e23, std::numeric_limits<double>::max()}) {
    const nlohmann::json j = JsonNumber(v);
    ASSERT_TRUE(j.is_number()) << v;
    EXPECT_EQ(NumberFromJson(nlohmann::json::parse(j.dump())), v);
  }
}

TEST(JsonNumberTest, NonFiniteIsWrittenAsNullAndReadAsNan) {
  const double inf = std::numeric_limits<double>::infinity();
  for (double v : {std::nan(""), inf, -inf}) {
    const nlohmann::json j = JsonNumber(v);
    EXPECT_TRUE(j.is_null()) << v;
    EXPECT_EQ(j.dump(), "null");  // valid JSON, unlike the NaN a plain dump would refuse
    EXPECT_TRUE(std::isnan(NumberFromJson(nlohmann::json::parse(j.dump()))));
  }
  // Usable where an ordered_json is built (state.json).
  nlohmann::ordered_json o = {{"x", JsonNumber(inf)}, {"y", JsonNumber(2.0)}};
  EXPECT_EQ(o.dump(), R"({"x":null,"y":2.0})");
}

TEST(JsonNumberTest, OtherTypesAreAnErrorNotANumber) {
  EXPECT_THROW(NumberFromJson(nlohmann::json("1.5")), nlohmann::json::type_error);
  EXPECT_THROW(NumberFromJson(nlohmann::json::array()), nlohmann::json::type_error);
  EXPECT_THROW(NumberFromJson(nlohmann::json(true)), nlohmann::json::type_error);
}

}  // namespace
}  // namespace keel
