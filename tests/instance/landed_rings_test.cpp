// A decode rank's claim table and landed ring in its control segment: the claims table and the
// ring whose producer leases prove writers alive. A writer process holding
// its lease is SIGKILLed while its announcement stands, and a close no longer
// waits for it.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <vector>

#include "instance/control_segment.h"
#include "shm/claim_table.h"
#include "support/processes.h"

namespace kvrelay {
namespace {

// The real thing: a writer process holding its lease on a decode rank's
// landed ring is SIGKILLed while its announcement stands.
TEST(ClaimTableProcesses, AWriterKilledWhileWritingNoLongerHoldsUpAClose) {
  std::string instance = testing::unique_instance("landed-kill");
  InstanceConfig config = default_config(instance, 1);
  config.role = static_cast<uint32_t>(Role::kDecode);
  Result<ControlSegment> control = ControlSegment::create(config);
  ASSERT_TRUE(control) << control.error().message;
  const uint32_t blocks = claim_table_blocks(config);
  ClaimOwner owner(control->claim_table(0), blocks);
  owner.reset();
  ASSERT_TRUE(owner.open(42, std::vector<uint32_t>{0}, 10));
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  if (child == 0) {
    // Its own attachment: its own lock descriptions.
    Result<ControlSegment> mine = ControlSegment::attach(instance);
    if (!mine) _exit(1);
    Result<MpscProducer> lease = mine->landed_ring(0)->lease_producer();
    if (!lease) _exit(2);
    ClaimWriterView w(mine->claim_table(0), blocks, lease->slot());
    w.announce(0);
    const char slot = static_cast<char>(lease->slot());
    if (write(ready[1], &slot, 1) != 1) _exit(3);
    pause();
    _exit(0);
  }
  char slot = 0;
  ASSERT_EQ(read(ready[0], &slot, 1), 1);
  Result<MpscRing> ring = control->landed_ring(0);
  ASSERT_TRUE(ring);
  auto liveness = [&](uint32_t w) { return ring->producer_liveness(w); };
  const uint64_t closed = owner.close(42, 20);
  EXPECT_FALSE(owner.quiescent(closed, liveness)) << "the writer lives and announced";
  ASSERT_EQ(kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(owner.quiescent(closed, liveness)) << "its lease lock is free";
  close(ready[0]);
  close(ready[1]);
  (void)control->unlink();
}

}  // namespace
}  // namespace kvrelay
