#include "coordinator/tombstones.h"

#include <cstdlib>
#include <new>

namespace kvrelay::coordinator {

namespace {

// Two independent 64-bit hashes of the id: FNV-1a, and a multiply-xorshift
// mix with another seed. 128 bits in all: ids that collide are not a concern.
void digest(std::string_view id, uint64_t& d1, uint64_t& d2) {
  uint64_t a = 0xcbf29ce484222325ULL;
  uint64_t b = 0x9E3779B97F4A7C15ULL ^ id.size();
  for (unsigned char c : id) {
    a = (a ^ c) * 0x100000001b3ULL;
    b = (b ^ c) * 0xbf58476d1ce4e5b9ULL;
    b ^= b >> 31;
  }
  b ^= b >> 33;
  b *= 0x94d049bb133111ebULL;
  b ^= b >> 29;
  d1 = a | 1;  // never both zero: zero marks an empty slot
  d2 = b;
}

size_t round_up_pow2(size_t n) {
  size_t p = 16;
  while (p < n)
    p <<= 1;
  return p;
}

}  // namespace

Tombstones::Tombstones(size_t max_entries)
    : mask_(round_up_pow2(max_entries / 3 * 4 + 4) - 1), limit_(max_entries) {
  // calloc: large blocks come zeroed from the kernel, page by page as used.
  table_ = static_cast<Entry*>(std::calloc(mask_ + 1, sizeof(Entry)));
  if (table_ == nullptr) throw std::bad_alloc();
}

Tombstones::~Tombstones() {
  std::free(table_);
}

size_t Tombstones::locate(uint64_t d1, uint64_t d2) const {
  size_t i = d2 & mask_;
  while (!empty(table_[i]) && !(table_[i].d1 == d1 && table_[i].d2 == d2))
    i = (i + 1) & mask_;
  return i;
}

std::optional<Tombstones::Halves> Tombstones::find(std::string_view id, uint64_t now_ns) const {
  uint64_t d1 = 0, d2 = 0;
  digest(id, d1, d2);
  const Entry& e = table_[locate(d1, d2)];
  if (empty(e) || (e.word >> 2) <= now_ns) return std::nullopt;
  return Halves{(e.word & 1) != 0, (e.word & 2) != 0};
}

bool Tombstones::remember(std::string_view id, Halves halves, uint64_t expires_ns,
                          uint64_t now_ns) {
  uint64_t d1 = 0, d2 = 0;
  digest(id, d1, d2);
  size_t i = locate(d1, d2);
  if (empty(table_[i])) {
    if (size_ >= limit()) {
      sweep(now_ns, mask_ + 1);
      if (size_ >= limit()) return false;
      i = locate(d1, d2);
    }
    ++size_;
  }
  table_[i] = Entry{d1, d2, (expires_ns << 2) | (halves.dest ? 2U : 0U) | (halves.task ? 1U : 0U)};
  return true;
}

void Tombstones::mark(std::string_view id, Halves halves) {
  uint64_t d1 = 0, d2 = 0;
  digest(id, d1, d2);
  Entry& e = table_[locate(d1, d2)];
  if (empty(e)) return;
  e.word = (e.word & ~uint64_t{3}) | (halves.dest ? 2U : 0U) | (halves.task ? 1U : 0U);
}

void Tombstones::forget(std::string_view id) {
  uint64_t d1 = 0, d2 = 0;
  digest(id, d1, d2);
  const size_t i = locate(d1, d2);
  if (!empty(table_[i])) erase_at(i);
}

// Backward-shift deletion: entries after the hole that may live there move
// into it, so that no probe sequence is ever cut short.
void Tombstones::erase_at(size_t i) {
  size_t j = i;
  for (;;) {
    j = (j + 1) & mask_;
    if (empty(table_[j])) break;
    const size_t home = table_[j].d2 & mask_;
    // Can the entry at j move to i? Only if its home is not in (i, j].
    const bool home_between = i <= j ? (home > i && home <= j) : (home > i || home <= j);
    if (home_between) continue;
    table_[i] = table_[j];
    i = j;
  }
  table_[i] = Entry{0, 0, 0};
  --size_;
}

void Tombstones::sweep(uint64_t now_ns, size_t budget) {
  for (size_t n = 0; n < budget && size_ > 0; ++n) {
    const size_t i = hand_;
    hand_ = (hand_ + 1) & mask_;
    const Entry& e = table_[i];
    if (!empty(e) && (e.word >> 2) <= now_ns) {
      erase_at(i);
      hand_ = i;  // an entry may have shifted into i: look at it again
    }
  }
}

}  // namespace kvrelay::coordinator
