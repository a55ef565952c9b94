// The order in which the host copies a layer's runs.
//
// A request's blocks lie at random places in its pools (scattered ids), so
// its runs read the source at random too, and the hardware prefetcher only
// helps within each run. Copied in source order, the reads go front to back
// through the source and only the writes land at random places. That pays
// where the runs are dense in the source span they lie in, and costs the
// sort where they are not. Sorting every list, against the request's order
// (tools/bench/experiments/run_order_lab.cpp on an AMD EPYC host: 32 MiB
// requests picked from pools 1-20x their size, the sort timed too):
//
//   the request's share of the span   16 KiB runs   64 KiB runs   4 KiB runs
//   all of it                            +62-73%       +21-23%       +42%
//   half                                 +19-22%        +7-12%        +3%
//   a quarter                             +8-10%        +3-4%         +2%
//   a tenth or a twentieth                +0-1%       -13-+1%       -3-6%
//
// So runs are sorted only from a quarter of the span up. Any order copies
// the same bytes: runs never overlap in the destination (the coordinator
// refuses a request that names a destination block twice; a caller of the
// kernels that does so gets one of the sources there, which one
// unspecified, as over the network's lanes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "kernels/block_copy.h"

namespace kvrelay::kernels {

// Lists shorter than this are copied in their own order: too few runs to
// gain from reading in order.
inline constexpr size_t kSortRunsFrom = 32;

// The order to copy `lists` in: at step k, run order[k] of every list. The
// source order of the first list, when every list has its length (they are
// cut from the same block runs, so their source orders agree) and the first
// is long, out of order and dense (its bytes fill at least a quarter of the
// source span it lies in). Empty: the order given. The span lives in a
// scratch of the calling thread, valid until its next call; the scratch
// keeps its capacity, so a worker allocates only while its requests grow.
std::span<const uint32_t> source_order(std::span<const RunsBetween> lists);

}  // namespace kvrelay::kernels
