// The tcp transport's wire format and key: what is accepted, what is refused
// and how the refusal reads.
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <future>
#include <fstream>

#include "instance/auth_key.h"
#include "support/pool_patterns.h"
#include "worker/net/envelope.h"
#include "worker/net/peer_plan.h"
#include "worker/tcp/frame_plan.h"
#include "worker/tcp/frame_wire.h"

namespace kvrelay::worker::tcp {
namespace {

PoolGeometry frame_geometry() {
  PoolGeometry g;
  g.num_layers = 4;
  g.num_blocks = 64;
  g.kv_heads = 2;
  g.block_size = 16;
  g.head_dim = 64;
  g.dtype = static_cast<uint32_t>(CacheDtype::kBf16);
  return g;
}

constexpr uint64_t kBlock = 2 * 16 * 64 * 2;  // bytes of one block of K (or V)

using net::check_hello;
using net::decode_envelope;
using net::Hello;
using net::kMaxEnvelopeBytes;
using net::parse_length;

// Decodes the first message of `stream` as tcp's (`body` keeps its bytes).
Result<Message> first_message(const std::vector<std::byte>& stream, std::vector<uint64_t>& body) {
  uint8_t prefix[4];
  std::memcpy(prefix, stream.data(), 4);
  Result<uint32_t> len = parse_length(std::span<const uint8_t, 4>(prefix, 4));
  if (!len) return len.error();
  body.assign(*len / 8, 0);
  std::memcpy(body.data(), stream.data() + 4, *len);
  Result<net::Inbound> in = decode_envelope(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(body.data()), *len));
  if (!in) return in.error();
  if (in->kind != schema::NetEnvelope::MESSAGE || in->protocol != kProtocol)
    return make_error(Errc::kCorrupt, "not a tcp message");
  return decode(*in);
}

TEST(TcpWire, AFrameHeaderSurvivesTheRoundTrip) {
  FrameHeader f;
  f.transfer = 9;
  f.handle = 1234567890123ull;
  f.layer = 3;
  f.tensor = 1;
  f.dst_offset = 5 * kBlock;
  f.bytes = 2 * kBlock;
  f.last = true;
  std::vector<std::byte> out;
  encode_frame(f, out);
  std::vector<uint64_t> body;
  Result<Message> in = first_message(out, body);
  ASSERT_TRUE(in) << in.error().message;
  ASSERT_EQ(in->kind, Message::Kind::kFrame);
  EXPECT_EQ(in->frame.transfer, 9u);
  EXPECT_EQ(in->frame.handle, 1234567890123ull);
  EXPECT_EQ(in->frame.layer, 3u);
  EXPECT_EQ(in->frame.tensor, 1u);
  EXPECT_EQ(in->frame.dst_offset, 5 * kBlock);
  EXPECT_EQ(in->frame.bytes, 2 * kBlock);
  EXPECT_TRUE(in->frame.last);
}

TEST(TcpWire, AFrameOfSeveralRunsSurvivesTheRoundTripAndSplitsIntoItsParts) {
  FrameHeader f;
  f.transfer = 9;
  f.request_key = 77;
  f.layer = 2;
  f.tensor = 1;
  f.bytes = 4 * kBlock;
  f.last = true;
  const std::vector<FrameRun> runs = {
      {40 * kBlock, kBlock}, {3 * kBlock, 2 * kBlock}, {9 * kBlock, kBlock}};
  std::vector<std::byte> out;
  encode_frame(f, runs, out);
  std::vector<uint64_t> body;
  Result<Message> in = first_message(out, body);
  ASSERT_TRUE(in) << in.error().message;
  ASSERT_EQ(in->runs.size(), 3u);
  for (size_t i = 0; i < runs.size(); ++i) {
    EXPECT_EQ(in->runs[i].dst_offset, runs[i].dst_offset) << "run " << i;
    EXPECT_EQ(in->runs[i].bytes, runs[i].bytes) << "run " << i;
  }
  const std::vector<FrameHeader> parts = frame_parts(in->frame, in->runs);
  ASSERT_EQ(parts.size(), 3u);
  for (size_t i = 0; i < parts.size(); ++i) {
    EXPECT_EQ(parts[i].dst_offset, runs[i].dst_offset);
    EXPECT_EQ(parts[i].bytes, runs[i].bytes);
    EXPECT_EQ(parts[i].transfer, 9u);
    EXPECT_EQ(parts[i].request_key, 77u);
    EXPECT_EQ(parts[i].layer, 2u);
    EXPECT_EQ(parts[i].last, i == 2) << "only the final part ends the transfer";
    EXPECT_TRUE(check_frame(parts[i], frame_geometry()));
  }
  // The largest a receiver takes still fits one envelope.
  std::vector<FrameRun> most(kMaxFrameRuns, FrameRun{0, kBlock});
  f.bytes = kMaxFrameRuns * kBlock;
  out.clear();
  encode_frame(f, most, out);
  in = first_message(out, body);
  ASSERT_TRUE(in) << in.error().message;
  EXPECT_EQ(in->runs.size(), kMaxFrameRuns);
}

TEST(TcpWire, AFrameWhoseRunsDoNotAddUpIsRefusedSayingHow) {
  FrameHeader f;
  f.layer = 1;
  f.bytes = 3 * kBlock;
  auto refusal = [&](const std::vector<FrameRun>& runs) -> std::string {
    std::vector<std::byte> out;
    encode_frame(f, runs, out);
    std::vector<uint64_t> body;
    Result<Message> in = first_message(out, body);
    if (in) return "accepted";
    EXPECT_EQ(in.error().code, Errc::kCorrupt);
    return in.error().message;
  };
  EXPECT_EQ(refusal({{0, kBlock}, {kBlock, 2 * kBlock}}), "accepted");
  EXPECT_NE(
      refusal({{0, kBlock}, {kBlock, kBlock}}).find("sum to 8192 bytes, but it carries 12288"),
      std::string::npos);
  EXPECT_NE(refusal({{0, kBlock}, {kBlock, 3 * kBlock}}).find("run 1 has 12288 bytes, with 8192"),
            std::string::npos);
  EXPECT_NE(refusal({{0, kBlock}, {kBlock, 0}, {0, 2 * kBlock}}).find("run 1 has 0 bytes"),
            std::string::npos);
  // Two runs whose sizes wrap around 2^64 to the frame's bytes.
  EXPECT_NE(refusal({{0, ~0ull}, {0, 3 * kBlock + 1}}).find("run 0 has"), std::string::npos);
  f.dst_offset = kBlock;
  EXPECT_NE(refusal({{0, 3 * kBlock}}).find("both runs and a dstOffset"), std::string::npos);
  f.dst_offset = 0;
  f.bytes = (kMaxFrameRuns + 1) * kBlock;
  EXPECT_NE(refusal(std::vector<FrameRun>(kMaxFrameRuns + 1, FrameRun{0, kBlock}))
                .find("a tcp frame of 1025 runs (at most 1024)"),
            std::string::npos);
}

TEST(TcpWire, ALengthThatIsNoEnvelopeIsRefused) {
  for (uint32_t len : {0u, 7u, 12u, kMaxEnvelopeBytes + 8}) {
    const uint8_t p[4] = {static_cast<uint8_t>(len), static_cast<uint8_t>(len >> 8),
                          static_cast<uint8_t>(len >> 16), static_cast<uint8_t>(len >> 24)};
    EXPECT_FALSE(parse_length(std::span<const uint8_t, 4>(p, 4))) << len;
  }
  const std::string http = "GET / HTTP/1.1\r\n";  // someone else's protocol on the port
  EXPECT_FALSE(
      parse_length(std::span<const uint8_t, 4>(reinterpret_cast<const uint8_t*>(http.data()), 4)));
}

TEST(TcpWire, GarbageEnvelopesAreErrorsNotCrashes) {
  std::vector<uint64_t> words(4, 0xffffffffffffffffull);
  EXPECT_FALSE(decode_envelope(std::span<const std::byte>(
      reinterpret_cast<const std::byte*>(words.data()), words.size() * 8)));
}

// A K-only pool (an MLA latent cache) has K, and K's scale with fp8: a frame
// for V, or for V's scale, is refused naming what the pool has.
TEST(TcpWire, AFrameForATensorAKOnlyPoolLacksIsRefused) {
  PoolGeometry g = frame_geometry();
  g.k_only = 1;
  g.has_scales = 1;
  FrameHeader f;
  f.bytes = g.block_bytes(PoolTensor::kKeyScale);
  f.tensor = static_cast<uint32_t>(PoolTensor::kKeyScale);
  EXPECT_TRUE(check_frame(f, g)) << "K's scale is there";
  for (PoolTensor missing : {PoolTensor::kValue, PoolTensor::kValueScale}) {
    f.tensor = static_cast<uint32_t>(missing);
    ASSERT_FALSE(check_frame(f, g));
    EXPECT_EQ(check_frame(f, g).error().message,
              fmt::format("frame for tensor {}, which the pool does not have (its tensors: K, K "
                          "scale)",
                          f.tensor));
  }
}

TEST(TcpWire, FramesInsideThePoolInWholeBlocksAreAccepted) {
  FrameHeader f;
  f.layer = 3;
  f.tensor = 1;
  f.dst_offset = 62 * kBlock;
  f.bytes = 2 * kBlock;
  EXPECT_TRUE(check_frame(f, frame_geometry()));
}

TEST(TcpWire, EveryFrameCheckNamesWhatIsWrong) {
  const PoolGeometry g = frame_geometry();
  FrameHeader f;
  f.bytes = kBlock;
  f.layer = 4;
  EXPECT_EQ(check_frame(f, g).error().message, "frame for layer 4, but the pool has 4 layers");
  f.layer = 0;
  f.tensor = 2;  // no scales in a bf16 pool
  EXPECT_EQ(check_frame(f, g).error().message,
            "frame for tensor 2, which the pool does not have (its tensors: K, V)");
  f.tensor = 0;
  f.dst_offset = 100;
  EXPECT_EQ(check_frame(f, g).error().message,
            "frame of 4096 bytes at offset 100 is neither whole blocks of 4096 bytes nor whole "
            "heads of 2048 bytes within one block");
  // Heterogeneous TP: whole heads of one block go, heads across two do not.
  f.dst_offset = 5 * kBlock + kBlock / 2;
  f.bytes = kBlock / 2;
  EXPECT_TRUE(check_frame(f, g)) << "head 1 of block 5";
  f.bytes = kBlock;
  EXPECT_EQ(check_frame(f, g).error().message,
            "frame of 4096 bytes at offset 22528 is neither whole blocks of 4096 bytes nor whole "
            "heads of 2048 bytes within one block");
  f.dst_offset = 63 * kBlock + kBlock / 2;
  f.bytes = kBlock / 2;
  EXPECT_TRUE(check_frame(f, g)) << "the last head of the last block";
  f.dst_offset = 63 * kBlock;
  f.bytes = 2 * kBlock;
  EXPECT_EQ(check_frame(f, g).error().message,
            "frame writes destination blocks 63..64 of layer 0, but the pool has 64 blocks there");
  f.dst_offset = 0;
  f.bytes = ~uint64_t{0} - kBlock + 1;  // offset + bytes would wrap
  EXPECT_FALSE(check_frame(f, g));
  f.bytes = 0;
  EXPECT_FALSE(check_frame(f, g));
}

TEST(TcpWire, AHelloOfAnotherTpSizeIsAcceptedWhenItServesTheSameModelHeads) {
  // This side: tp 2, 2 heads per rank (4 in all).
  const HeadLayout here{2, 2, 4};
  Hello h;
  h.version = net::kWireVersion;
  h.pool = frame_geometry();
  h.pool.kv_heads = 1;
  h.tp_size = 4;  // 4 x 1 heads: the same 4
  EXPECT_TRUE(check_hello(h, "d0", frame_geometry(), here));
  EXPECT_FALSE(check_hello(h, "d0", frame_geometry())) << "without a layout the pools must match";
  h.tp_size = 8;
  h.total_kv_heads = 8;
  EXPECT_EQ(check_hello(h, "d0", frame_geometry(), here).error().message,
            "pools differ in the model's KV heads: 4 here (tp 2), 8 at the peer (tp 8)");
  h.tp_size = 3;
  h.total_kv_heads = 2;
  EXPECT_EQ(check_hello(h, "d0", frame_geometry(), here).error().message,
            "the peer's heads: 2 KV heads in all cannot be spread over tp 3 with 1 heads per "
            "rank: kv_heads x tp_size must equal the total, or (fewer heads than ranks) kv_heads "
            "must be 1 and tp_size a multiple of the total");
  h.tp_size = 4;
  h.total_kv_heads = 0;
  h.pool.head_dim = 32;
  EXPECT_EQ(check_hello(h, "d0", frame_geometry(), here).error().message,
            "pools differ in head_dim: 64 here, 32 at the peer");
}

// The hello (tcp and rdma alike) refuses a K-only pool (an MLA latent cache)
// against a K+V one by its kind, before any head count: an MLA model's one
// replicated head against a GQA model's heads is the wrong kind of cache.
TEST(TcpWire, AHelloOfAnotherKindOfPoolIsRefusedByItsKindFirst) {
  Hello h;
  h.version = net::kWireVersion;
  h.pool = frame_geometry();
  h.pool.k_only = 1;
  EXPECT_EQ(check_hello(h, "d0", frame_geometry()).error().message,
            "pools differ in kind: K and V here, K only (an MLA latent cache) at the peer");
  const HeadLayout gqa{2, 2, 4};
  h.pool.kv_heads = 1;
  h.tp_size = 2;
  h.total_kv_heads = 1;  // MLA: one head, on every rank
  EXPECT_EQ(check_hello(h, "d0", frame_geometry(), gqa).error().message,
            "pools differ in kind: K and V here, K only (an MLA latent cache) at the peer");
  PoolGeometry mla = frame_geometry();
  mla.k_only = 1;
  mla.kv_heads = 1;
  EXPECT_TRUE(check_hello(h, "d0", mla, HeadLayout{2, 1, 1})) << "the same kind and heads";
}

TEST(TcpWire, AHelloIsRefusedNamingTheFieldThatDiffers) {
  Hello h;
  h.version = net::kWireVersion;
  h.pool = frame_geometry();
  EXPECT_TRUE(check_hello(h, "d0", frame_geometry()));
  h.pool.head_dim = 128;
  EXPECT_EQ(check_hello(h, "d0", frame_geometry()).error().message,
            "pools differ in head_dim: 64 here, 128 at the peer");
  h.pool = frame_geometry();
  h.expected_instance = "d1";
  EXPECT_EQ(check_hello(h, "d0", frame_geometry()).error().message, "this is instance 'd0', not 'd1'");
  h.expected_instance.clear();
  h.version = net::kWireVersion + 1;
  EXPECT_EQ(check_hello(h, "d0", frame_geometry()).code(), Errc::kVersionMismatch);
}

class KeyFile : public ::testing::Test {
 protected:
  std::string path = ::testing::TempDir() + "kvrelay-test-key-" + std::to_string(getpid());
  std::string link = path + "-link";
  void write(const std::string& bytes, mode_t mode) {
    ::unlink(path.c_str());
    std::ofstream(path) << bytes;
    ::chmod(path.c_str(), mode);
  }
  static std::string random_bytes(size_t n) {
    std::string out(n, '\0');
    const Nonce a = random_nonce(), b = random_nonce();
    for (size_t i = 0; i < n; ++i)
      out[i] = static_cast<char>(i < 32 ? a[i] : b[i % 32]);
    return out;
  }
  std::string refusal() {
    Result<AuthKey> key = AuthKey::load(path);
    return key ? std::string("(accepted)") : key.error().message;
  }
  void TearDown() override {
    ::unlink(path.c_str());
    ::unlink(link.c_str());
  }
};

TEST_F(KeyFile, AnOwnerOnlyFileOfEnoughBytesIsAKey) {
  write(random_bytes(32), 0600);
  Result<AuthKey> key = AuthKey::load(path);
  ASSERT_TRUE(key) << key.error().message;
  const Nonce a = random_nonce(), b = random_nonce();
  const Mac mac = key->mac(kConnectLabel, {a, b});
  EXPECT_TRUE(key->verify(kConnectLabel, {a, b}, mac));
  EXPECT_FALSE(key->verify(kAcceptLabel, {a, b}, mac)) << "labels keep the two proofs apart";
  EXPECT_FALSE(key->verify(kConnectLabel, {b, a}, mac));
  const AuthKey other = AuthKey::from_bytes(std::vector<uint8_t>(32, 'x'));
  EXPECT_FALSE(other.verify(kConnectLabel, {a, b}, mac));
}

TEST_F(KeyFile, AKeyOthersCanReadIsRefusedSayingHowToFixIt) {
  write(random_bytes(32), 0644);
  EXPECT_NE(refusal().find("chmod 600"), std::string::npos) << refusal();
}

TEST_F(KeyFile, AShortKeyIsRefused) {
  write("short", 0600);
  EXPECT_NE(refusal().find("head -c 32 /dev/urandom"), std::string::npos);
}

TEST_F(KeyFile, AMissingFileIsRefused) {
  EXPECT_FALSE(AuthKey::load(path + "-missing"));
}

// Obviously weak keys are refused saying how to make a good one; random
// bytes, and their hex or base64 (with the newline the tools leave), pass.
TEST_F(KeyFile, ObviouslyWeakKeysAreRefusedAndRandomOnesInAnyCommonEncodingPass) {
  write(std::string(32, '\0'), 0600);
  EXPECT_NE(refusal().find("weak key: only 1 distinct byte values"), std::string::npos)
      << refusal();
  write("correcthorse2026", 0600);  // a 16-character password
  EXPECT_NE(refusal().find("weak key: its 16 bytes of text carry at most about 96 bits"),
            std::string::npos)
      << refusal();
  EXPECT_NE(refusal().find("head -c 32 /dev/urandom"), std::string::npos) << refusal();
  write("0123456789abcdef0123456789abcdef", 0600);  // hex of 16 bytes: 128 bits at most
  EXPECT_EQ(refusal(), "(accepted)");
  write("0123456789abcdef0123456789abcde", 0600);
  EXPECT_NE(refusal().find("weak key"), std::string::npos) << refusal();

  const std::string raw = random_bytes(32);
  write(raw, 0600);
  EXPECT_EQ(refusal(), "(accepted)");
  std::string hex;
  for (unsigned char c : raw)
    hex += fmt::format("{:02x}", c);
  write(hex + "\n", 0600);
  EXPECT_EQ(refusal(), "(accepted)");
  static const char* const kB64 =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string b64;
  for (size_t i = 0; i < 30; i += 3) {  // 40 characters of base64
    const uint32_t v = (uint8_t(raw[i]) << 16) | (uint8_t(raw[i + 1]) << 8) | uint8_t(raw[i + 2]);
    for (int k = 3; k >= 0; --k)
      b64 += kB64[(v >> (6 * k)) & 63];
  }
  write(b64 + "\n", 0600);
  EXPECT_EQ(refusal(), "(accepted)");
}

// A FIFO is refused at once (opening one for reading would wait for a
// writer and hang the coordinator at startup).
TEST_F(KeyFile, AFifoIsRefusedWithoutWaitingForAWriter) {
  ::unlink(path.c_str());
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  auto load = std::async(std::launch::async, [&] { return refusal(); });
  ASSERT_EQ(load.wait_for(std::chrono::seconds(10)), std::future_status::ready)
      << "load() waits on the FIFO";
  EXPECT_NE(load.get().find("is a FIFO; a key is a regular file"), std::string::npos);
}

// A symbolic link (how a Kubernetes secret volume presents a key) is
// followed, and its target must pass every check; messages name both.
TEST_F(KeyFile, ASymlinkedKeyIsFollowedAndItsTargetIsWhatIsChecked) {
  write(random_bytes(32), 0600);
  ASSERT_EQ(::symlink(path.c_str(), link.c_str()), 0);
  Result<AuthKey> key = AuthKey::load(link);
  ASSERT_TRUE(key) << key.error().message;
  ::chmod(path.c_str(), 0644);
  key = AuthKey::load(link);
  ASSERT_FALSE(key);
  EXPECT_NE(key.error().message.find(link + " (a link to "), std::string::npos)
      << key.error().message;
  EXPECT_NE(key.error().message.find("has mode 644"), std::string::npos) << key.error().message;
  ::unlink(path.c_str());
  key = AuthKey::load(link);
  ASSERT_FALSE(key);
  EXPECT_NE(key.error().message.find("a symbolic link that does not lead to a file"),
            std::string::npos)
      << key.error().message;
}

// The sender's plan of a layer's frames: exactly one is `last`, the final
// one, whatever the shape; the receiver acks the transfer at it.
TEST(FramePlan, OnlyTheFinalFrameIsLastForWholeBlocksAndForHeadShares) {
  const PoolGeometry g = kvrelay::testing::transport_geometry();  // 2 heads per block
  LayerJob job;
  job.transfer = 9;
  job.ticket.layer = 1;
  job.runs = {BlockRun{4, 6, 24}, BlockRun{40, 1, 2}};  // two coalesced runs, 26 blocks
  std::vector<kernels::CopyRun> scratch;
  std::vector<PlannedFrame> frames;
  auto check = [&](size_t expected_frames, uint64_t frame_bytes) {
    ASSERT_EQ(frames.size(), expected_frames);
    uint64_t bytes = 0;
    for (size_t i = 0; i < frames.size(); ++i) {
      EXPECT_EQ(frames[i].header.last, i + 1 == frames.size()) << "frame " << i;
      EXPECT_EQ(frames[i].header.transfer, 9u);
      EXPECT_EQ(frames[i].header.layer, 1u);
      bytes += frames[i].header.bytes;
    }
    EXPECT_EQ(bytes, frame_bytes);
  };
  const uint64_t block = g.block_bytes(PoolTensor::kKey);
  // Whole blocks: a frame per run and tensor.
  plan_frames(job, g, 2, scratch, frames);
  check(2 * 2, 2 * 26 * block);
  // One head of two to a receiver with one head per block: a frame per
  // block and tensor, 52 of them, where the runs alone would say 4.
  job.share = HeadShare{0, 1, 0, 1};
  plan_frames(job, g, 1, scratch, frames);
  check(2 * 26, 2 * 26 * block / 2);
  for (const PlannedFrame& f : frames) {
    EXPECT_EQ(f.header.bytes, block / 2);
    EXPECT_EQ(f.src_offset % block, block / 2) << "head 1 of each source block";
    EXPECT_EQ(f.header.dst_offset % (block / 2), 0u);
  }
}

TEST(FramePlan, ConsecutiveFramesOfATensorAreGroupedUpToTheRunAndByteLimits) {
  auto frame = [](uint32_t tensor, uint64_t bytes) {
    PlannedFrame f;
    f.header.tensor = tensor;
    f.header.bytes = bytes;
    return f;
  };
  std::vector<PlannedFrame> frames;
  std::vector<FrameGroup> groups;
  // 600 scattered 4 KiB blocks of K, then 10 of V: K in groups of kGroupRuns,
  // V apart from K.
  for (int i = 0; i < 600; ++i)
    frames.push_back(frame(0, 4096));
  for (int i = 0; i < 10; ++i)
    frames.push_back(frame(1, 4096));
  group_frames(frames, groups);
  ASSERT_EQ(groups.size(), 4u);
  EXPECT_EQ(groups[0].count, kGroupRuns);
  EXPECT_EQ(groups[1].count, kGroupRuns);
  EXPECT_EQ(groups[2].count, 600 - 2 * kGroupRuns);
  EXPECT_EQ(groups[3].first, 600u);
  EXPECT_EQ(groups[3].count, 10u);
  EXPECT_EQ(groups[3].bytes, 10u * 4096);
  // By bytes: 384 KiB runs, two to a group; one larger than the limit alone.
  frames = {frame(0, 384 << 10), frame(0, 384 << 10), frame(0, 384 << 10),
            frame(0, kGroupBytes + 4096), frame(0, 4096)};
  group_frames(frames, groups);
  ASSERT_EQ(groups.size(), 4u);
  EXPECT_EQ(groups[0].count, 2u);
  EXPECT_EQ(groups[1].count, 1u);
  EXPECT_EQ(groups[2].count, 1u) << "a frame over the limit goes alone";
  EXPECT_EQ(groups[2].bytes, kGroupBytes + 4096);
  EXPECT_EQ(groups[3].count, 1u);
  size_t covered = 0;
  for (const FrameGroup& g : groups) {
    EXPECT_EQ(g.first, covered) << "in order, each frame once";
    covered += g.count;
  }
  EXPECT_EQ(covered, frames.size());
}

}  // namespace
}  // namespace kvrelay::worker::tcp
