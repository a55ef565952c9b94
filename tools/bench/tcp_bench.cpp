// tcp transport bandwidth between two hosts (two network namespaces joined
// by a veth pair; loopback addresses where namespaces cannot be made, and it
// says so): kvrelay's tcp transport (authenticated lanes, frames
// gather-written from the pool, acked per layer once in the pool) against a
// plain framed-socket sender and receiver of the same bytes over the same
// number of connections (a 24-byte header per run, writev, a one-byte ack
// per layer), in one run. Scattered block ids, 1 KiB..1 MiB blocks.
// Target (issue "Cross-host transfer"): >= 90% of the baseline at >= 16 KiB.
// The same framed socket again with a 16-byte AES-GCM tag after each frame's
// payload (kvrelay's own RecordSeal, authenticate mode, computed by the
// sender and checked by the receiver): what the sealing alone costs on these
// cores, so that the gap to the plain socket can be split into the sealing
// and the rest.
// Then iperf3 between the same hosts, as many streams as lanes: the limit of
// the path itself, against which every block size is shown again.
#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <thread>

#include "bench_pools.h"
#include "bench_support.h"
#include "iperf3_baseline.h"
#include "shm/command_line.h"
#include "shm/wait_event.h"
#include "two_hosts.h"
#include "worker/copy_plan.h"
#include "worker/local_pool.h"
#include "worker/net/session_seal.h"
#include "worker/receiver.h"
#include "worker/tcp/tcp_transport.h"

using namespace kvrelay;
using namespace kvrelay::bench;
using namespace std::chrono_literals;

namespace {

struct BaselineHeader {
  uint32_t layer;
  uint32_t tensor;  // high bit: the layer's last frame on this connection
  uint64_t offset;
  uint64_t bytes;
};
constexpr uint32_t kLastFrame = 1u << 31;
constexpr uint32_t kSealedFrame = 1u << 30;  // its payload is followed by a tag
constexpr uint32_t kFrameFlags = kLastFrame | kSealedFrame;
// The sealed baseline sends its tags in batches of about this much payload,
// as kvrelay's channel does.
constexpr uint64_t kSealBatchBytes = 512u << 10;

// Both ends of a sealed baseline connection: one direction's key.
worker::net::SessionKey baseline_seal_key() {
  worker::net::SessionKey k{};
  k.fill(0x5e);
  return k;
}

bool read_all(int fd, void* p, size_t n) {
  auto* b = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t got = ::read(fd, b, n);
    if (got <= 0) return false;
    b += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

// To a socket, or (`pipe`) a pipe; a closed socket is an error, not a SIGPIPE.
bool write_all(int fd, const void* p, size_t n, bool pipe = false) {
  const auto* b = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t put = pipe ? ::write(fd, b, n) : ::send(fd, b, n, MSG_NOSIGNAL);
    if (put <= 0) return false;
    b += put;
    n -= static_cast<size_t>(put);
  }
  return true;
}

void tune(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// The baseline receiver: reads each header and its payload straight into the
// pool (a sealed frame's tag checked after it), acks a layer's last frame.
void serve_baseline(int fd, const worker::LocalPool& pool) {
  worker::net::RecordSeal seal(baseline_seal_key(), worker::net::Protection::kAuthenticate,
                               worker::net::RecordSeal::Side::kReceive);
  BaselineHeader h{};
  while (read_all(fd, &h, sizeof(h))) {
    const bool last = (h.tensor & kLastFrame) != 0;
    std::byte* base = pool.tensor(h.layer, static_cast<PoolTensor>(h.tensor & ~kFrameFlags));
    if (base == nullptr || !read_all(fd, base + h.offset, h.bytes)) return;
    if ((h.tensor & kSealedFrame) != 0) {
      worker::net::Tag tag;
      if (!read_all(fd, tag.data(), tag.size())) return;
      seal.begin();
      seal.add(std::span<const std::byte>(base + h.offset, h.bytes), nullptr);
      if (!seal.finish_receive(tag)) {
        fmt::print(stderr, "the sealed baseline's tag failed\n");
        return;
      }
    }
    const char ack = 1;
    if (last && !write_all(fd, &ack, 1)) return;
  }
}

// Writes iov[at, end) whole, IOV_MAX pieces a call. False: the peer is gone.
bool write_iov(int fd, std::vector<iovec>& iov, size_t at, size_t end) {
  while (at < end) {
    msghdr msg{};
    msg.msg_iov = iov.data() + at;
    msg.msg_iovlen = std::min<size_t>(end - at, IOV_MAX);
    ssize_t put = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (put <= 0) return false;
    while (put > 0 && at < end) {  // advance past what was written
      if (static_cast<size_t>(put) >= iov[at].iov_len) {
        put -= static_cast<ssize_t>(iov[at].iov_len);
        ++at;
      } else {
        iov[at].iov_base = static_cast<char*>(iov[at].iov_base) + put;
        iov[at].iov_len -= static_cast<size_t>(put);
        put = 0;
      }
    }
  }
  return true;
}

// The baseline sender of one connection: its layers' frames with writev,
// then one ack per layer. With `seal`, each payload is followed by its tag,
// computed a batch of about kSealBatchBytes at a time just before the batch
// is written.
void send_baseline(int fd, const worker::LocalPool& pool, const std::vector<uint32_t>& layers,
                   const std::vector<worker::BlockRun>& runs, worker::net::RecordSeal* seal) {
  const PoolGeometry& g = pool.geometry();
  std::vector<BaselineHeader> headers;
  std::vector<worker::net::Tag> tags;
  std::vector<iovec> iov;
  std::vector<size_t> frame_at;  // each frame's first piece in iov
  std::vector<kernels::CopyRun> bytes;
  for (uint32_t layer : layers) {
    headers.clear();
    tags.clear();
    iov.clear();
    frame_at.clear();
    headers.reserve(runs.size() * 2);
    tags.reserve(runs.size() * 2);  // pointers into both go into iov
    for (uint32_t t = 0; t < 2; ++t) {
      worker::to_byte_runs(runs, g.block_bytes(static_cast<PoolTensor>(t)), bytes);
      for (size_t i = 0; i < bytes.size(); ++i) {
        const bool last = t == 1 && i + 1 == bytes.size();
        headers.push_back({layer, t | (last ? kLastFrame : 0) | (seal ? kSealedFrame : 0),
                           bytes[i].dst_offset, bytes[i].bytes});
        frame_at.push_back(iov.size());
        iov.push_back({&headers.back(), sizeof(BaselineHeader)});
        iov.push_back(
            {pool.tensor(layer, static_cast<PoolTensor>(t)) + bytes[i].src_offset, bytes[i].bytes});
        if (seal != nullptr) {
          tags.emplace_back();
          iov.push_back({tags.back().data(), tags.back().size()});
        }
      }
    }
    if (seal == nullptr) {
      if (!write_iov(fd, iov, 0, iov.size())) return;
      continue;
    }
    for (size_t frame = 0; frame < headers.size();) {
      const size_t first = frame;
      for (uint64_t batch = 0; frame < headers.size() && batch < kSealBatchBytes; ++frame) {
        const iovec& payload = iov[frame_at[frame] + 1];
        seal->begin();
        seal->add(std::span<const std::byte>(static_cast<const std::byte*>(payload.iov_base),
                                             payload.iov_len),
                  nullptr);
        tags[frame] = seal->finish_send();
        batch += payload.iov_len;
      }
      const size_t end = frame < headers.size() ? frame_at[frame] : iov.size();
      if (!write_iov(fd, iov, frame_at[first], end)) return;
    }
  }
  char ack;
  for (size_t i = 0; i < layers.size(); ++i)
    if (!read_all(fd, &ack, 1)) return;
}

int listen_on(const std::string& address, uint16_t* port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  ::inet_pton(AF_INET, address.c_str(), &a.sin_addr);
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd, 16) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    return -1;
  *port = ntohs(a.sin_port);
  return fd;
}

int connect_to(const std::string& address, uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  ::inet_pton(AF_INET, address.c_str(), &a.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return -1;
  tune(fd);
  return fd;
}

struct Ports {
  uint16_t ours = 0;
  uint16_t baseline = 0;
};

// Host B: both receivers on one pool, until the parent closes `control`.
int run_receivers(const sim::TwoHosts& hosts, const AuthKey& key, const PoolGeometry& g,
                  uint32_t lanes, worker::net::Protection protection, int report_fd,
                  int control_fd) {
  if (Status s = hosts.enter(false); !s) {
    fmt::print(stderr, "{}\n", s.error().message);
    return 1;
  }
  auto pool = make_pool(fmt::format("kvrelay-bench-tcp-dst-{}", getpid()), g);
  worker::net::NetThread net;
  worker::ReceiverOptions o;
  o.address = hosts.address_b();
  o.instance = "bench-decode";
  o.protection = protection;
  auto receiver = worker::Receiver::start(net, *pool, key, o);
  Ports ports;
  const int listener = listen_on(hosts.address_b(), &ports.baseline);
  if (!receiver || listener < 0) {
    fmt::print(stderr, "receivers: {}\n", receiver ? "cannot listen" : receiver.error().message);
    return 1;
  }
  ports.ours = (*receiver)->port();
  if (!write_all(report_fd, &ports, sizeof(ports), true)) return 1;
  std::vector<std::thread> served;
  for (uint32_t i = 0; i < lanes; ++i) {
    const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return 1;
    tune(fd);
    served.emplace_back([fd, &pool] {
      serve_baseline(fd, *pool);
      ::close(fd);
    });
  }
  char c;
  (void)::read(control_fd, &c, 1);  // EOF: the parent is done
  for (auto& t : served)
    t.join();
  return 0;
}

struct Measured {
  double ours_gbps = 0, baseline_gbps = 0, sealed_baseline_gbps = 0;
};

Measured measure(const sim::TwoHosts& hosts, uint64_t block_bytes, uint64_t layer_bytes,
                 uint32_t lanes, worker::net::Protection protection, int trials, bool with_sealed) {
  const PoolGeometry g = geometry_for(block_bytes, layer_bytes);
  const auto key = AuthKey::from_bytes(std::vector<uint8_t>(32, 42));
  int report[2], control[2];
  if (::pipe(report) != 0 || ::pipe(control) != 0) std::exit(1);
  std::fflush(nullptr);  // the child must not print this process's buffered output again
  const pid_t child = fork_worker([&] {
    ::close(report[0]);
    ::close(control[1]);
    return run_receivers(hosts, key, g, lanes, protection, report[1], control[0]);
  });
  ::close(report[1]);
  ::close(control[0]);
  Ports ports;
  if (!read_all(report[0], &ports, sizeof(ports))) {
    fmt::print(stderr, "the receiving side did not start\n");
    std::exit(1);
  }
  ::close(report[0]);

  auto src = make_pool(fmt::format("kvrelay-bench-tcp-src-{}", getpid()), g);
  for (uint32_t l = 0; l < kLayers; ++l)
    for (uint32_t t = 0; t < 2; ++t)
      std::memset(src->tensor(l, static_cast<PoolTensor>(t)), static_cast<int>(l * 2 + t + 1),
                  g.tensor_bytes(l, static_cast<PoolTensor>(t)));
  std::vector<uint32_t> src_ids(g.num_blocks), dst_ids(g.num_blocks);
  std::iota(src_ids.begin(), src_ids.end(), 0);
  std::iota(dst_ids.begin(), dst_ids.end(), 0);
  std::mt19937 rng(7);
  std::shuffle(src_ids.begin(), src_ids.end(), rng);
  std::shuffle(dst_ids.begin(), dst_ids.end(), rng);
  const auto runs = worker::plan_block_runs(src_ids, dst_ids, g.num_blocks, g.num_blocks, 0, 0);
  const uint64_t bytes = uint64_t{kLayers} * 2 * g.tensor_bytes(0, PoolTensor::kKey);

  worker::net::NetThread net;
  worker::tcp::SenderOptions so;
  so.instance = "bench-prefill";
  so.lanes = lanes;
  so.protection = protection;
  WaitEvent doorbell;  // rung by the transport when completions are ready
  worker::tcp::TcpTransport transport(net, *src, &key, so, &doorbell);
  capnp::MallocMessageBuilder m;
  auto d = m.initRoot<schema::CacheDest>();
  d.setProtocol(schema::TransferProtocol::TCP);
  d.setPeerAddress(hosts.address_b());
  d.initTcpPorts(1).set(0, ports.ours);
  auto dest = transport.resolve(d.asReader());
  std::vector<int> fds;
  for (uint32_t i = 0; i < lanes; ++i)
    fds.push_back(connect_to(hosts.address_b(), ports.baseline));
  if (!dest || std::find(fds.begin(), fds.end(), -1) != fds.end()) {
    fmt::print(stderr, "cannot connect\n");
    std::exit(1);
  }

  auto ours_once = [&]() -> double {
    const uint64_t t0 = mono_now_ns();
    for (uint32_t l = 0; l < kLayers; ++l) {
      worker::TransferTicket t;
      t.layer = l;
      (void)(*dest)->submit_layer(t, l, *runs);
    }
    std::vector<worker::TransferCompletion> done;
    while (done.size() < kLayers) {
      wait_until(
          doorbell, [&] { return transport.has_completions(); }, Deadline::after(1s), 0);
      transport.poll(done);
    }
    const uint64_t t1 = mono_now_ns();
    for (const auto& c : done)
      if (!c.status) {
        fmt::print(stderr, "transfer failed: {}\n", c.status.error().message);
        std::exit(1);
      }
    return static_cast<double>(bytes) / static_cast<double>(t1 - t0);
  };
  // One seal per connection, for the whole run: the receiver's counts along.
  std::vector<std::unique_ptr<worker::net::RecordSeal>> seals;
  for (uint32_t i = 0; i < lanes; ++i)
    seals.push_back(std::make_unique<worker::net::RecordSeal>(
        baseline_seal_key(), worker::net::Protection::kAuthenticate,
        worker::net::RecordSeal::Side::kSend));
  auto baseline_once = [&](bool sealed) -> double {
    const uint64_t t0 = mono_now_ns();
    std::vector<std::thread> senders;
    for (uint32_t i = 0; i < lanes; ++i) {
      std::vector<uint32_t> mine;
      for (uint32_t l = i; l < kLayers; l += lanes)
        mine.push_back(l);
      senders.emplace_back([&, i, mine] {
        send_baseline(fds[i], *src, mine, *runs, sealed ? seals[i].get() : nullptr);
      });
    }
    for (auto& t : senders)
      t.join();
    return static_cast<double>(bytes) / static_cast<double>(mono_now_ns() - t0);
  };
  (void)ours_once();  // warm: connections, page faults on both sides
  (void)baseline_once(false);
  std::vector<double> ours, base, sealed;
  for (int i = 0; i < trials; ++i) {
    ours.push_back(ours_once());
    base.push_back(baseline_once(false));
    if (with_sealed) sealed.push_back(baseline_once(true));
  }
  for (int fd : fds)
    ::close(fd);
  ::close(control[1]);
  join_worker(child, "the receiving side");
  return Measured{median(ours), median(base), with_sealed ? median(sealed) : 0.0};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvrelay tcp transport bandwidth vs a plain framed socket, between two hosts"};
  uint64_t layer_mib = 64;
  int trials = 3;
  uint32_t lanes = 2;
  app.add_option("--layer-mib", layer_mib, "bytes per layer (K+V), MiB; 4 layers per trial")
      ->capture_default_str();
  app.add_option("--trials", trials, "trials per case; the median is reported")
      ->capture_default_str();
  app.add_option("--lanes", lanes, "connections, for both")->capture_default_str();
  std::vector<uint64_t> block_kibs{1, 4, 16, 64, 256, 1024};
  app.add_option("--block-kib", block_kibs, "block sizes to measure, KiB")
      ->check(CLI::Range(uint64_t{1}, uint64_t{64 * 1024}))
      ->capture_default_str();
  int iperf3_seconds = 3;
  app.add_option("--iperf3-seconds", iperf3_seconds,
                 "how long iperf3 runs (the path's limit); 0 skips it")
      ->check(CLI::Range(0, 3600))
      ->capture_default_str();
  std::string protection = "authenticate";
  app.add_option("--protection", protection,
                 "kvrelay's sessions: authenticate (AES-GCM tags, the default) or encrypt; the "
                 "baseline is a plain socket either way")
      ->check(CLI::IsMember({"authenticate", "encrypt"}))
      ->capture_default_str();
  bool sealed_baseline = true;
  app.add_flag("--sealed-baseline,!--no-sealed-baseline", sealed_baseline,
               "also run the framed socket with an AES-GCM tag per frame (what the sealing "
               "alone costs); on unless --no-sealed-baseline");
  kvrelay::add_version_flag(app, "kvrelay-bench-tcp");
  KVRELAY_PARSE_COMMAND_LINE(app, argc, argv);
  const auto mode = protection == "encrypt" ? worker::net::Protection::kEncrypt
                                            : worker::net::Protection::kAuthenticate;
  spdlog::set_level(spdlog::level::err);  // connections closing at the end of each case

  auto hosts = sim::TwoHosts::make("bnch");
  if (!hosts->isolated())
    fmt::print("note: no network namespaces ({}); both hosts are loopback addresses\n",
               hosts->why_not_isolated());
  if (Status s = hosts->enter(true); !s) {
    fmt::print(stderr, "{}\n", s.error().message);
    return 1;
  }
  print_header(
      fmt::format("tcp transfer bandwidth (GB/s), {} lanes, scattered ids, {}, sessions "
                  "{}",
                  lanes, hosts->isolated() ? "two namespaces over veth" : "loopback", protection),
      "plain framed socket");
  double worst_large = 1e9;
  std::vector<std::pair<uint64_t, double>> ours;  // block KiB, GB/s
  std::vector<Measured> measured;
  for (const uint64_t kib : block_kibs) {
    const Measured m =
        measure(*hosts, kib * 1024, layer_mib << 20, lanes, mode, trials, sealed_baseline);
    measured.push_back(m);
    ours.emplace_back(kib, m.ours_gbps);
    Row row{fmt::format("{} KiB blocks", kib), "GB/s", m.ours_gbps, m.baseline_gbps};
    print_row(row);
    record_point("kvrelay tcp", "block KiB", static_cast<double>(kib), "GB/s", m.ours_gbps, true);
    record_point("plain framed socket", "block KiB", static_cast<double>(kib), "GB/s",
                 m.baseline_gbps, true);
    if (kib >= 16) worst_large = std::min(worst_large, row.ratio());
  }
  print_target(">= 90% of the baseline at >= 16 KiB blocks", worst_large >= 0.9,
               fmt::format("worst case {:.0f}%", worst_large * 100));

  if (sealed_baseline) {
    // The gap above, split: the socket sealed as kvrelay seals (a tag per
    // frame, both ends, same cores) against the plain one is the sealing's
    // share; kvrelay against the sealed socket is the rest.
    print_header(
        "the same transfers against the framed socket sealed as kvrelay seals (an "
        "AES-GCM tag per frame, computed and checked)",
        "sealed framed socket");
    for (size_t i = 0; i < measured.size(); ++i) {
      const uint64_t kib = block_kibs[i];
      print_row(Row{fmt::format("{} KiB blocks", kib), "GB/s", measured[i].ours_gbps,
                    measured[i].sealed_baseline_gbps});
      record_point("sealed framed socket", "block KiB", static_cast<double>(kib), "GB/s",
                   measured[i].sealed_baseline_gbps, true);
    }
    for (size_t i = 0; i < measured.size(); ++i)
      fmt::print("sealing alone at {} KiB: the sealed socket is {:.2f}x the plain one\n",
                 block_kibs[i], measured[i].sealed_baseline_gbps / measured[i].baseline_gbps);
  }

  if (iperf3_seconds <= 0) return 0;
  const Iperf3Result path = run_iperf3(*hosts, lanes, iperf3_seconds);
  if (!path.why_not.empty()) {
    const std::string note = "iperf3 baseline skipped: " + path.why_not;
    fmt::print("{}\n", note);
    print_note(note);
    return 0;
  }
  print_header(fmt::format("the same transfers against the path's limit: iperf3, {} streams for "
                           "{} s, {:.2f} GB/s",
                           lanes, iperf3_seconds, path.gbps),
               "iperf3");
  for (const auto& [kib, gbps] : ours) {
    print_row(Row{fmt::format("{} KiB blocks", kib), "GB/s", gbps, path.gbps});
    record_point("iperf3 (the path)", "block KiB", static_cast<double>(kib), "GB/s", path.gbps,
                 true);
  }
  return 0;
}
