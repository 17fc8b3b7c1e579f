// ShardRange: a rank's contiguous part of a flat buffer. The data-parallel reduction (each
// element's owner sums it), ZeRO-1's optimizer shard and the moment files of a checkpoint all cut
// the parameter buffer the same way, by ShardOf.
#pragma once

#include <cstddef>

namespace keel {

// A half-open range [begin, end) of a flat buffer.
struct ShardRange {
  size_t begin = 0;
  size_t end = 0;
  size_t size() const { return end - begin; }
  bool Contains(size_t i) const { return i >= begin && i < end; }
};

// Rank `rank`'s part of a buffer of n elements split over `world` ranks: equal contiguous
// chunks, each a multiple of 16 floats (one cache line) except the last, which may be shorter or
// empty.
ShardRange ShardOf(size_t n, int rank, int world);

}  // namespace keel
