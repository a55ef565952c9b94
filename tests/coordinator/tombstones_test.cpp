// Tombstones against a reference model (std::map) under random inserts,
// updates, deletions and sweeps: the open-addressing table with
// backward-shift deletion must never lose or invent an id.
#include "coordinator/tombstones.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>

namespace kvrelay::coordinator {
namespace {

TEST(Tombstones, MatchesAReferenceModelUnderRandomOperationsAndSweeps) {
  Tombstones t(1000);
  struct Want {
    uint64_t expires;
    Tombstones::Halves halves;
  };
  std::map<std::string, Want> model;
  std::mt19937_64 rng(42);
  uint64_t now = 1'000;
  for (int step = 0; step < 200'000; ++step) {
    const std::string id = "id" + std::to_string(rng() % 3000);
    switch (rng() % 5) {
      case 0:
      case 1: {
        const Tombstones::Halves h{(rng() & 1) != 0, (rng() & 2) != 0};
        const uint64_t expires = now + 1 + rng() % 500;
        const bool live_in_model = model.count(id) != 0 && model[id].expires > now;
        size_t live = 0;
        for (const auto& [k, w] : model)
          live += w.expires > now ? 1 : 0;
        const bool ok = t.remember(id, h, expires, now);
        if (live_in_model || live < t.limit()) {
          ASSERT_TRUE(ok) << "room was there";
        }
        if (ok) model[id] = Want{expires, h};
        break;
      }
      case 2:
        t.forget(id);
        model.erase(id);
        break;
      case 3: t.sweep(now, 1 + rng() % 64); break;
      case 4: now += rng() % 20; break;
    }
    if (step % 97 == 0) {
      for (int probe = 0; probe < 50; ++probe) {
        const std::string q = "id" + std::to_string(rng() % 3000);
        auto got = t.find(q, now);
        auto it = model.find(q);
        const bool want = it != model.end() && it->second.expires > now;
        ASSERT_EQ(got.has_value(), want) << q << " at step " << step;
        if (want) {
          EXPECT_EQ(got->task, it->second.halves.task);
          EXPECT_EQ(got->dest, it->second.halves.dest);
        }
      }
    }
  }
}

TEST(Tombstones, MarkUpdatesTheHalvesAndKeepsTheExpiry) {
  Tombstones t(16);
  ASSERT_TRUE(t.remember("a", {true, false}, 100, 0));
  t.mark("a", {true, true});
  auto got = t.find("a", 99);
  ASSERT_TRUE(got.has_value());
  EXPECT_TRUE(got->dest);
  EXPECT_FALSE(t.find("a", 100).has_value()) << "expired at its original time";
}

}  // namespace
}  // namespace kvrelay::coordinator
