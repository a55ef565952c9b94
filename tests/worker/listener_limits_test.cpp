// What a peer that never proves the key can cost a listener (worker/net/
// listener.h): a few KiB per connection and nothing after it is gone, a
// deadline whatever it sends, and, out of descriptors, no spinning. Each
// listener runs in a process of its own, measured from outside.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <fstream>
#include <thread>

#include "raw_net_client.h"
#include "support/pool_patterns.h"
#include "support/processes.h"
#include "worker/receiver.h"

namespace kvrelay::worker {
namespace {

using namespace std::chrono_literals;
using kvrelay::testing::RawNetClient;

// A listener in a child process, until the test kills it.
struct ListenerProcess {
  pid_t pid = -1;
  uint16_t port = 0;
  std::string log;
  // The child's listener counters, copied out every 10 ms.
  std::shared_ptr<kvrelay::testing::SharedRegion> counters;
  uint64_t accept_backoffs() const {
    return reinterpret_cast<const std::atomic<uint64_t>*>(counters->as<uint64_t>())->load();
  }

  // `fd_limit`: the child's RLIMIT_NOFILE (0: as is).
  static ListenerProcess start(const std::string& tag, rlim_t fd_limit = 0) {
    ListenerProcess p;
    p.log = fmt::format("/tmp/kvrelay-limits-{}-{}.log", getpid(), tag);
    std::remove(p.log.c_str());
    kvrelay::testing::SharedRegion port(sizeof(uint16_t));
    p.counters = std::make_shared<kvrelay::testing::SharedRegion>(sizeof(uint64_t));
    kvrelay::testing::ReadyPipe ready;
    const std::string log = p.log;
    auto* backoffs = reinterpret_cast<std::atomic<uint64_t>*>(p.counters->as<uint64_t>());
    p.pid = kvrelay::testing::fork_child([&, log, fd_limit, backoffs]() -> int {
      spdlog::set_default_logger(spdlog::basic_logger_mt("limits", log));
      spdlog::flush_on(spdlog::level::trace);  // the test reads it while we run
      auto pool =
          kvrelay::testing::make_test_pool("limits", tag, kvrelay::testing::transport_geometry());
      net::NetThread net(2);
      const AuthKey key = AuthKey::from_bytes(std::vector<uint8_t>(32, 7));
      ReceiverOptions o;
      o.handshake_timeout = 1000ms;
      Result<std::unique_ptr<Receiver>> r = Receiver::start(net, *pool, key, o);
      if (!r) return 2;
      (void)pool->segment().unlink();
      if (fd_limit != 0) {
        rlimit l{fd_limit, fd_limit};
        setrlimit(RLIMIT_NOFILE, &l);
      }
      *port.as<uint16_t>() = (*r)->port();
      ready.signal();
      for (;;) {
        backoffs->store((*r)->connections().accept_backoffs.load());
        std::this_thread::sleep_for(10ms);
      }
    });
    EXPECT_TRUE(ready.wait(10s));
    p.port = *port.as<uint16_t>();
    return p;
  }
  ~ListenerProcess() {
    if (pid > 0) kvrelay::testing::kill_child(pid);
    std::remove(log.c_str());
  }
  size_t log_lines(const std::string& containing) const {
    std::ifstream in(log);
    size_t n = 0;
    for (std::string line; std::getline(in, line);)
      n += line.find(containing) != std::string::npos;
    return n;
  }
};

int connect_to(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void raise_fd_limit() {
  rlimit l{};
  getrlimit(RLIMIT_NOFILE, &l);
  l.rlim_cur = l.rlim_max;
  setrlimit(RLIMIT_NOFILE, &l);
}

// A keyless peer that trickles bytes (never a whole envelope) is cut off at
// the handshake's deadline: the bytes do not keep it alive.
TEST(ListenerLimits, ATricklingPeerIsCutOffAtTheHandshakeDeadline) {
  ListenerProcess l = ListenerProcess::start("trickle");
  RawNetClient c(l.port);
  ASSERT_TRUE(c.read()) << "the challenge";
  // A length prefix a handshake envelope may have (1 KiB), then its body a
  // byte at a time.
  const std::byte prefix[4] = {std::byte{0}, std::byte{4}, std::byte{0}, std::byte{0}};
  c.write_raw(prefix);
  const auto t0 = std::chrono::steady_clock::now();
  const std::byte one[1] = {std::byte{0x08}};
  bool closed = false;
  while (!closed && std::chrono::steady_clock::now() - t0 < 10s) {
    std::this_thread::sleep_for(100ms);
    closed = ::send(c.socket().native_handle(), one, 1, MSG_NOSIGNAL) < 0;
  }
  EXPECT_TRUE(closed) << "still open after 10 s";
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 900ms) << "closed by the deadline, not sooner";
  EXPECT_EQ(l.log_lines("did not complete the handshake"), 1u);
}

// 2,000 connections that never prove the key: beyond the cap they are shed
// at once, the rest cost a few KiB each, and a second attack after the first
// has ended costs no more than the first (nothing stays behind).
TEST(ListenerLimits, HalfOpenConnectionsCostAFewKiBAndNothingAfterTheyClose) {
  raise_fd_limit();
  ListenerProcess l = ListenerProcess::start("halfopen");
  std::this_thread::sleep_for(200ms);
  const uint64_t base = kvrelay::testing::rss_kib(l.pid);
  uint64_t peaks[2] = {0, 0};
  for (uint64_t& peak : peaks) {
    std::vector<int> fds;
    for (int i = 0; i < 2000; ++i) {
      const int fd = connect_to(l.port);
      if (fd >= 0) fds.push_back(fd);
      if (i % 100 == 99) peak = std::max(peak, kvrelay::testing::rss_kib(l.pid));
    }
    std::this_thread::sleep_for(300ms);
    peak = std::max(peak, kvrelay::testing::rss_kib(l.pid));
    for (int fd : fds)
      ::close(fd);
    std::this_thread::sleep_for(1500ms);  // past the handshake deadline
  }
  const uint64_t factor = kvrelay::testing::sanitizer_memory_factor();
  EXPECT_LT(peaks[0] - base, 32u * 1024 * factor)
      << "2,000 half-open connections cost " << (peaks[0] - base) << " KiB";
  EXPECT_LT(peaks[1], peaks[0] + 8u * 1024 * factor)
      << "the second attack peaked at " << peaks[1] << " KiB, the first at " << peaks[0];
  EXPECT_GE(l.log_lines("shed"), 1u) << "the cap was reached and said so";
}

// Out of descriptors, the listener sheds what it cannot serve and backs off:
// it tries again every 100 ms, not in a loop, and its warnings are
// rate-limited, not one per attempt. Counted, not timed: the listener's own
// count of its pauses (a spinning loop would count thousands in 2 s).
TEST(ListenerLimits, OutOfDescriptorsTheAcceptLoopBacksOffInsteadOfSpinning) {
  raise_fd_limit();
  ListenerProcess l = ListenerProcess::start("emfile", 48);
  // One whole connection first, while the listener has descriptors to spare:
  // UBSan's vptr check caches each type it has verified, and verifying one
  // needs a pipe (sanitizer_common's IsAccessibleMemoryRange). Out of
  // descriptors, a first check would fail as "invalid vptr" and halt it.
  {
    RawNetClient warm(l.port);
    ASSERT_TRUE(warm.read()) << "the challenge";
  }
  std::this_thread::sleep_for(200ms);
  std::vector<int> fds;
  for (int i = 0; i < 200; ++i) {
    const int fd = connect_to(l.port);
    if (fd >= 0) fds.push_back(fd);
  }
  std::this_thread::sleep_for(200ms);
  const uint64_t before = l.accept_backoffs();
  std::this_thread::sleep_for(2s);
  const uint64_t backoffs = l.accept_backoffs() - before;
  for (int fd : fds)
    ::close(fd);
  EXPECT_GE(backoffs, 1u) << "it ran out of descriptors";
  EXPECT_LE(backoffs, 2000u / 100 + 5) << "one try per 100 ms pause at most";
  EXPECT_GE(l.log_lines("cannot accept"), 1u) << "it said so";
  EXPECT_LE(l.log_lines("cannot accept"), 2u) << "warnings are rate-limited";
  EXPECT_EQ(::kill(l.pid, 0), 0) << "the listener is still there";
}

}  // namespace
}  // namespace kvrelay::worker
