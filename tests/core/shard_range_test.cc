#include "core/shard_range.h"

#include <gtest/gtest.h>

namespace keel {
namespace {

TEST(ShardRangeTest, ShardsTileTheBufferInOrderAlignedToCacheLines) {
  for (size_t n : {0, 1, 15, 16, 17, 1000, 364288, 1000003}) {
    for (int world : {1, 2, 3, 7, 8}) {
      size_t at = 0;
      for (int r = 0; r < world; ++r) {
        const ShardRange s = ShardOf(n, r, world);
        EXPECT_EQ(s.begin, at) << n << " " << world << " " << r;
        EXPECT_LE(s.end, n);
        if (s.size() > 0) {  // an empty last shard sits at n
          EXPECT_EQ(s.begin % 16, 0u);
        }
        // Equal chunks: none larger than ceil(n / world) rounded up to 16.
        EXPECT_LE(s.size(), ((n + world - 1) / world + 15) / 16 * 16);
        at = s.end;
      }
      EXPECT_EQ(at, n) << n << " " << world;
    }
  }
  EXPECT_EQ(ShardOf(100, 0, 1).size(), 100u);
}

}  // namespace
}  // namespace keel
