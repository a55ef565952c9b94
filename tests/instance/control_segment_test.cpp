// Control segments: naming and permission rules, header validation (each
// mismatch its own error), and replacement of a segment whose creator died.
#include "instance/control_segment.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <thread>

#include "instance/names.h"
#include "support/processes.h"

namespace kvrelay {
namespace {

using namespace std::chrono_literals;

// Creates a segment for the test and unlinks it afterwards.
class ControlSegmentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    instance_ =
        testing::unique_instance(::testing::UnitTest::GetInstance()->current_test_info()->name());
    if (instance_.size() > kMaxInstanceNameBytes) instance_.resize(kMaxInstanceNameBytes);
    config_ = default_config(instance_, 2);
  }
  void TearDown() override { (void)SharedSegment::unlink(control_segment_name(instance_)); }

  ControlSegment create() {
    auto seg = ControlSegment::create(config_);
    EXPECT_TRUE(seg.ok()) << seg.error().message;
    return std::move(seg).value();
  }
  Errc attach_code() { return ControlSegment::attach(instance_).code(); }
  std::string attach_message() {
    auto r = ControlSegment::attach(instance_);
    return r.ok() ? "" : r.error().message;
  }

  std::string instance_;
  InstanceConfig config_{};
  std::unique_ptr<ControlSegment> created_;
};

TEST_F(ControlSegmentTest, AttachSeesTheCreatorsConfigurationEpochAndRegions) {
  ControlSegment created = create();
  EXPECT_EQ(created.epoch(), 1u);
  EXPECT_FALSE(created.replaced().has_value());
  auto attached = ControlSegment::attach(instance_);
  ASSERT_TRUE(attached.ok()) << attached.error().message;
  EXPECT_EQ(attached->instance(), instance_);
  EXPECT_EQ(attached->config().tp_size, 2u);
  EXPECT_EQ(attached->state(), InstanceState::kInitialising);
  created.set_state(InstanceState::kReady);
  EXPECT_EQ(attached->state(), InstanceState::kReady);
  EXPECT_TRUE(attached->submit_ring().ok());
  EXPECT_TRUE(attached->task_ring(1).ok());
  EXPECT_FALSE(attached->task_ring(2).ok()) << "tp=2 has no rank 2";
  EXPECT_EQ(Barrier(attached->barrier()).snapshot().parties, 2u);
}

TEST_F(ControlSegmentTest, SegmentIsPrivateToItsOwnerByDefault) {
  ControlSegment seg = create();
  EXPECT_EQ(seg.segment().mode(), 0600u);
}

TEST_F(ControlSegmentTest, GroupAccessIsAnExplicitOption) {
  auto seg = ControlSegment::create(config_, SegmentOptions{.group_access = true});
  ASSERT_TRUE(seg.ok());
  EXPECT_EQ(seg->segment().mode(), 0660u);
}

TEST_F(ControlSegmentTest, BadInstanceNamesAreRefusedWithTheReason) {
  const std::string too_long(65, 'a');
  for (const std::string& bad : {std::string("a/b"), std::string(".."), std::string("x..y"),
                                 too_long, std::string(""), std::string("sp ace")}) {
    auto r = ControlSegment::attach(bad);
    EXPECT_EQ(r.code(), Errc::kInvalidArgument) << bad;
    InstanceConfig c = default_config("placeholder", 1);
    std::memset(c.instance, 0, sizeof(c.instance));
    std::memcpy(c.instance, bad.data(), std::min(bad.size(), sizeof(c.instance) - 1));
    EXPECT_EQ(ControlSegment::create(c).code(), Errc::kInvalidArgument) << bad;
  }
  EXPECT_NE(validate_instance_name(too_long).error().message.find("at most 64"), std::string::npos);
  EXPECT_NE(validate_instance_name("a/b").error().message.find("'/'"), std::string::npos);
  EXPECT_TRUE(validate_instance_name(std::string(64, 'a')).ok());
}

TEST_F(ControlSegmentTest, MissingInstanceSaysSo) {
  EXPECT_EQ(attach_code(), Errc::kNotFound);
  EXPECT_NE(attach_message().find("does not exist"), std::string::npos);
}

TEST_F(ControlSegmentTest, WrongMagicIsNotAKvrelaySegment) {
  ControlSegment seg = create();
  seg.header().preamble.magic.store(0x1234);
  EXPECT_EQ(attach_code(), Errc::kBadMagic);
  EXPECT_NE(attach_message().find("not a kvrelay segment"), std::string::npos);
}

TEST_F(ControlSegmentTest, UnpublishedSegmentIsNotReady) {
  ControlSegment seg = create();
  seg.header().preamble.magic.store(0);
  EXPECT_EQ(attach_code(), Errc::kNotReady);
}

TEST_F(ControlSegmentTest, OtherLayoutVersionIsAVersionMismatch) {
  ControlSegment seg = create();
  seg.header().preamble.layout_version = kLayoutVersion + 1;
  EXPECT_EQ(attach_code(), Errc::kVersionMismatch);
  EXPECT_NE(attach_message().find("layout version " + std::to_string(kLayoutVersion + 1)),
            std::string::npos);
}

TEST_F(ControlSegmentTest, OtherLayoutHashIsALayoutMismatch) {
  ControlSegment seg = create();
  seg.header().preamble.layout_hash ^= 1;
  EXPECT_EQ(attach_code(), Errc::kLayoutMismatch);
  EXPECT_NE(attach_message().find("differently built"), std::string::npos);
}

TEST_F(ControlSegmentTest, SizeDisagreeingWithTheHeaderIsASizeMismatch) {
  ControlSegment seg = create();
  const int fd = shm_open(("/" + control_segment_name(instance_)).c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(seg.segment().size() + 4096)), 0);
  close(fd);
  EXPECT_EQ(attach_code(), Errc::kSizeMismatch);
}

TEST_F(ControlSegmentTest, TruncatedSegmentIsASizeMismatchNotACrash) {
  { ControlSegment seg = create(); }
  const int fd = shm_open(("/" + control_segment_name(instance_)).c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 40), 0);
  close(fd);
  EXPECT_EQ(attach_code(), Errc::kSizeMismatch);
  EXPECT_NE(attach_message().find("smaller than a kvrelay preamble"), std::string::npos);
}

// The coordinator creates its segment and sizes it in two steps. An engine
// or worker attaching in between must wait, not fail; a coordinator that
// died in between leaves an empty segment, which the next one replaces once
// it is older than a creation could take.
TEST_F(ControlSegmentTest, AnEmptySegmentIsWaitedForAndReplacedOnceItsCreatorIsSurelyGone) {
  const int fd =
      shm_open(("/" + control_segment_name(instance_)).c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  close(fd);
  EXPECT_EQ(attach_code(), Errc::kNotReady);
  EXPECT_NE(attach_message().find("is empty"), std::string::npos);
  EXPECT_EQ(ControlSegment::create(config_).code(), Errc::kAlreadyExists)
      << "a fresh empty segment may be a creation in progress";
  std::thread creator([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    Result<ControlSegment> c = ControlSegment::create(config_);
    ASSERT_TRUE(c) << c.error().message;
    ASSERT_TRUE(c->replaced());
    EXPECT_NE(c->replaced()->reason.find("empty"), std::string::npos);
    created_ = std::make_unique<ControlSegment>(std::move(c).value());
  });
  Result<ControlSegment> attached =
      ControlSegment::attach_when_published(instance_, Deadline::after(std::chrono::seconds(10)));
  creator.join();
  ASSERT_TRUE(attached) << attached.error().message;
  ASSERT_TRUE(created_);
  EXPECT_EQ(attached->epoch(), created_->epoch());
}

TEST_F(ControlSegmentTest, SegmentOfAnotherUidIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give the segment to another uid";
  ControlSegment seg = create();
  ASSERT_EQ(fchown(seg.segment().fd(), 12345, static_cast<gid_t>(-1)), 0);
  EXPECT_EQ(attach_code(), Errc::kPermissionDenied);
  EXPECT_NE(attach_message().find("belongs to uid 12345"), std::string::npos);
}

TEST_F(ControlSegmentTest, ImpossibleConfigurationInTheHeaderIsCorrupt) {
  ControlSegment seg = create();
  seg.header().config.tp_size = 0;
  EXPECT_EQ(attach_code(), Errc::kCorrupt);
  EXPECT_NE(attach_message().find("tp_size = 0"), std::string::npos);
}

TEST_F(ControlSegmentTest, RegionDirectoryDisagreeingWithTheConfigurationIsCorrupt) {
  ControlSegment seg = create();
  seg.header().regions[3].offset += 256;
  EXPECT_EQ(attach_code(), Errc::kCorrupt);
  EXPECT_NE(attach_message().find("region 3"), std::string::npos);
}

TEST_F(ControlSegmentTest, SecondCreatorIsRefusedWhileTheFirstIsAlive) {
  ControlSegment first = create();
  auto second = ControlSegment::create(config_);
  ASSERT_EQ(second.code(), Errc::kAlreadyExists);
  EXPECT_NE(second.error().message.find("served by coordinator pid " + std::to_string(getpid())),
            std::string::npos)
      << second.error().message;
}

// Liveness is the owner lock the coordinator holds, not what the segment
// says: a same-uid process that zeroes the recorded pid (or changes its
// start time) cannot make a live instance look stale, so no second
// coordinator can take it over (split brain).
TEST_F(ControlSegmentTest, AScribbledCreatorIdentityDoesNotMakeALiveSegmentStale) {
  ControlSegment seg = create();
  seg.header().preamble.creator_pid = 0;
  seg.header().preamble.creator_start_time += 1;
  EXPECT_TRUE(ControlSegment::attach(instance_).ok()) << attach_message();
  auto second = ControlSegment::create(config_);
  ASSERT_EQ(second.code(), Errc::kAlreadyExists) << "a second coordinator must be refused";
  EXPECT_EQ(seg.coordinator_liveness(), LockState::kFree)
      << "our own description holds the lock: a probe through it sees no conflict";
  auto other = ControlSegment::attach(instance_);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->coordinator_liveness(), LockState::kHeld);
}

// Only the validated copy of the configuration and the directory is used
// after attach: scribbling on the header afterwards sends nobody elsewhere.
TEST_F(ControlSegmentTest, HeaderScribbledAfterAttachIsNotReadAgain) {
  ControlSegment seg = create();
  auto attached = ControlSegment::attach(instance_);
  ASSERT_TRUE(attached.ok());
  const auto before = attached->region(RegionKind::kSubmitRing);
  seg.header().config.tp_size = 9999;
  seg.header().region_count = 0;
  std::memset(seg.header().regions, 0xff, sizeof(seg.header().regions));
  EXPECT_EQ(attached->config().tp_size, 2u);
  const auto after = attached->region(RegionKind::kSubmitRing);
  EXPECT_EQ(after.data(), before.data());
  EXPECT_EQ(after.size(), before.size());
  EXPECT_TRUE(attached->task_ring(1).ok());
}

// The creator is SIGKILLed: attach reports the segment stale, naming the dead
// pid; a new creator replaces it, continuing the epoch.
TEST_F(ControlSegmentTest, SegmentOfASigkilledCreatorIsDetectedAndReplaced) {
  testing::ReadyPipe created;
  const pid_t creator = testing::fork_child([&] {
    auto seg = ControlSegment::create(config_);
    if (!seg) return 2;
    created.signal();
    pause();
    return 0;
  });
  ASSERT_TRUE(created.wait(10s));
  testing::kill_child(creator);

  auto stale = ControlSegment::attach(instance_);
  ASSERT_EQ(stale.code(), Errc::kStale);
  EXPECT_NE(stale.error().message.find("coordinator pid " + std::to_string(creator) + " is gone"),
            std::string::npos);
  auto dump_view = ControlSegment::attach(instance_, AttachOptions{.allow_stale = true});
  EXPECT_TRUE(dump_view.ok()) << "tools may still inspect a dead instance";

  auto fresh = ControlSegment::create(config_);
  ASSERT_TRUE(fresh.ok()) << fresh.error().message;
  ASSERT_TRUE(fresh->replaced().has_value());
  EXPECT_EQ(fresh->replaced()->creator_pid, uint32_t(creator));
  EXPECT_EQ(fresh->epoch(), 2u);
  EXPECT_TRUE(ControlSegment::attach(instance_).ok());
}

TEST_F(ControlSegmentTest, UnlinkRemovesTheNameAndLeavesNothingBehind) {
  ControlSegment seg = create();
  ASSERT_TRUE(seg.unlink().ok());
  EXPECT_EQ(attach_code(), Errc::kNotFound);
  struct stat st {};
  EXPECT_NE(stat(("/dev/shm/" + control_segment_name(instance_)).c_str(), &st), 0);
}

TEST_F(ControlSegmentTest, UnlinkLeavesASuccessorsSegmentAlone) {
  ControlSegment old_one = create();
  // Someone replaced us (e.g. we were judged dead): the name is theirs now.
  ASSERT_TRUE(SharedSegment::unlink(control_segment_name(instance_)).ok());
  ControlSegment successor = create();
  ASSERT_TRUE(old_one.unlink().ok());
  EXPECT_TRUE(ControlSegment::attach(instance_).ok());
}

TEST(InstanceConfig, ValidationNamesTheFieldTheValueAndTheLimit) {
  InstanceConfig c = default_config("x", 2);
  c.submit_ring_bytes = 5000;
  Status s = validate_config(c);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().message,
            "config submit_ring_bytes = 5000 is out of range: must be a power of two in [4096, "
            "1073741824]");
  c = default_config("x", 17);
  EXPECT_NE(validate_config(c).error().message.find("tp_size = 17"), std::string::npos);
}

TEST(ControlLayout, RegionsAreAlignedAndDisjoint) {
  const ControlLayout layout = plan_control_layout(default_config("x", 16));
  uint64_t end = sizeof(SegmentHeader);
  for (const RegionEntry& r : layout.regions) {
    EXPECT_EQ(r.offset % kRegionAlignment, 0u);
    EXPECT_GE(r.offset, end);
    end = r.offset + r.bytes;
  }
  EXPECT_LE(end, layout.total_bytes);
  EXPECT_LE(layout.regions.size(), kMaxRegions);
}

}  // namespace
}  // namespace kvrelay
