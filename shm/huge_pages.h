// Transparent huge pages for large shared segments (the KV pools).
//
// A layer's blocks are copied as runs of a few KiB to a few hundred KiB at
// random places in pools of many GiB: with 4 KiB pages each run costs TLB
// misses. On an AMD EPYC host, with /dev/shm mounted for huge pages, the
// layer copies of kvrelay-bench-copy ran 6-83% faster (a request taking a
// twentieth of its pools: 10.3-10.5 GB/s against 6.8-8.8; docs/benchmarks.md).
// Files in /dev/shm get huge pages only where the tmpfs is mounted with
// `huge=advise` (and the mapping asks, as every kvrelay mapping of 2 MiB or
// more does) or `huge=always`; most hosts mount it without, which means
// `huge=never`, and then asking changes nothing. docs/operating.md tells
// the operator how.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvrelay {

// Huge pages are asked for mappings of at least this size.
inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// Asks the kernel to back [start, start + bytes) with huge pages (before its
// pages are touched, so that they are allocated huge). Best effort: a kernel
// or mount that gives none just keeps small pages.
void advise_huge_pages(void* start, size_t bytes);

// Bytes of the mapping that starts at `start` mapped through huge pages now,
// from /proc/self/smaps (0 when none, or when it cannot be read).
uint64_t huge_page_mapped_bytes(const void* start);

// The `huge=` option of the tmpfs mounted at `mount_point` ("never" when it
// is mounted without one; "" when nothing is mounted there).
std::string tmpfs_huge_option(const std::string& mount_point = "/dev/shm");

}  // namespace kvrelay
