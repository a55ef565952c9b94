// The ids of requests that completed, remembered for a while so that a late
// partner half is absorbed instead of starting a second request with the same
// id (which would end in a second final completion for one id).
//
// Entries expire by time only: each lives at least as long as the longest
// deadline its partner could still be submitted within, plus a margin. They
// are compact: a 128-bit digest of the id, the expiry and which halves were
// seen, 24 bytes in an open-addressing table of fixed capacity (linear
// probing, backward-shift deletion), allocated lazily by the kernel. Expired
// entries are swept a slice at a time. When the table is full of live
// entries, remember() says so and the caller refuses the submission rather
// than forget an id early.
//
// Not thread-safe: the coordinator's loop owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace kvrelay::coordinator {

class Tombstones {
 public:
  struct Halves {
    bool task = false;  // the CacheTask (or the only part of a single-part request) arrived
    bool dest = false;  // the CacheDest arrived
  };

  // Holds up to `max_entries` ids (in a table with room to spare: at most
  // three quarters of its slots are ever used).
  explicit Tombstones(size_t max_entries);
  ~Tombstones();
  Tombstones(const Tombstones&) = delete;
  Tombstones& operator=(const Tombstones&) = delete;

  // The halves seen for `id`, if it is remembered and not expired at `now`.
  std::optional<Halves> find(std::string_view id, uint64_t now_ns) const;
  // Remembers (or updates) `id` until `expires_ns`. False when the table is
  // full of unexpired entries even after a full sweep.
  bool remember(std::string_view id, Halves halves, uint64_t expires_ns, uint64_t now_ns);
  // Updates the halves of a remembered id, keeping its expiry.
  void mark(std::string_view id, Halves halves);
  void forget(std::string_view id);
  // Drops expired entries among the next `budget` slots.
  void sweep(uint64_t now_ns, size_t budget);

  size_t size() const { return size_; }
  size_t capacity() const { return mask_ + 1; }
  size_t limit() const { return limit_; }

 private:
  struct Entry {
    uint64_t d1;  // digest; 0 in both halves: empty
    uint64_t d2;
    uint64_t word;  // expires_ns << 2 | dest << 1 | task
  };
  static bool empty(const Entry& e) { return e.d1 == 0 && e.d2 == 0; }
  size_t locate(uint64_t d1, uint64_t d2) const;  // its slot, or the empty slot ending its probe
  void erase_at(size_t i);

  Entry* table_;
  size_t mask_;
  size_t limit_;
  size_t size_ = 0;
  size_t hand_ = 0;  // the sweep's position
};

}  // namespace kvrelay::coordinator
