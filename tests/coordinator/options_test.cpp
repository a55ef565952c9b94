// kvrelay-coordinator's command line, and the flags it hands on to its
// workers: the data plane's and the network transports' flags are declared
// once by their owners (worker/transport_options.h), so what the coordinator
// accepts is exactly what a worker reads back, and what it refuses a worker
// started by hand refuses with the same words.
#include "coordinator/options.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "worker/transport_options.h"

namespace kvrelay::coordinator {
namespace {

// A 0600 file of 32 random bytes, removed at the end.
class KeyFile {
 public:
  KeyFile() : path_(::testing::TempDir() + "kvrelay-options-key-" + std::to_string(getpid())) {
    std::random_device random;
    std::vector<unsigned char> bytes(32);
    for (unsigned char& b : bytes) b = static_cast<unsigned char>(random());
    const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) {
      if (::write(fd, bytes.data(), bytes.size()) != static_cast<ssize_t>(bytes.size()))
        path_.clear();
      ::close(fd);
    }
  }
  ~KeyFile() { ::unlink(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

Result<CoordinatorOptions> parse(std::vector<std::string> args) {
  args.insert(args.begin(), {"kvrelay-coordinator", "--instance", "options-test", "--num-layers",
                             "2", "--num-blocks", "8"});
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return parse_options(static_cast<int>(argv.size()), argv.data());
}

// What a worker's own command line makes of the arguments it is handed.
worker::NetworkOptions as_worker_reads(const std::vector<std::string>& worker_args) {
  worker::NetworkOptions read;
  CLI::App app;
  worker::declare_transport_options(app, read);
  app.allow_extras();  // --idle-strategy and --cpu-list are the worker's own
  std::vector<std::string> reversed(worker_args.rbegin(), worker_args.rend());
  app.parse(reversed);
  return read;
}

std::string refusal(std::initializer_list<std::string> args) {
  Result<CoordinatorOptions> o = parse(args);
  return o ? std::string("(accepted)") : o.error().message;
}

TEST(CoordinatorOptions, EveryHandedOnFlagReachesTheWorkerAsSet) {
  KeyFile key;
  ASSERT_FALSE(key.path().empty());
  Result<CoordinatorOptions> o = parse(
      {"--role", "decode", "--tp-size", "2", "--protocol", "ipc,tcp,rdma", "--tcp-ports",
       "7301,7302", "--rdma-ports", "7401,7402", "--auth-key-file", key.path(), "--listen-address",
       "198.18.0.2", "--net-protection", "encrypt", "--tcp-lanes", "3", "--tcp-staging-mib", "16",
       "--rdma-devices", "mlx5_0,mlx5_1", "--rdma-ib-port", "2", "--rdma-gid-index", "3",
       "--rdma-traffic-class", "106", "--rdma-queue-pairs", "4", "--copy-max-sms", "8"});
  ASSERT_TRUE(o) << o.error().message;
  const worker::NetworkOptions w = as_worker_reads(o->worker_args);
  EXPECT_EQ(w.net.listen_address, "198.18.0.2");
  EXPECT_EQ(w.net.auth_key_file, key.path());
  EXPECT_EQ(w.net.protection, worker::net::Protection::kEncrypt);
  EXPECT_EQ(w.tcp.lanes, 3U);
  EXPECT_EQ(w.tcp.staging_slot_mib, 16U);
  EXPECT_EQ(w.rdma.devices, (std::vector<std::string>{"mlx5_0", "mlx5_1"}));
  EXPECT_EQ(w.rdma.device_of(1), "mlx5_1");
  EXPECT_EQ(w.rdma.port, 2U);
  EXPECT_EQ(w.rdma.gid_index, 3U);
  EXPECT_EQ(w.rdma.traffic_class, 106U);
  EXPECT_EQ(w.rdma.queue_pairs, 4U);
  EXPECT_EQ(w.copy_max_sms, 8U);
}

TEST(CoordinatorOptions, DefaultsReachTheWorkerAsDefaults) {
  Result<CoordinatorOptions> o = parse({});
  ASSERT_TRUE(o) << o.error().message;
  const worker::NetworkOptions w = as_worker_reads(o->worker_args);
  const worker::NetworkOptions d;
  EXPECT_EQ(w.net.listen_address, d.net.listen_address);
  EXPECT_TRUE(w.net.auth_key_file.empty());
  EXPECT_EQ(w.net.protection, d.net.protection);
  EXPECT_EQ(w.tcp.lanes, d.tcp.lanes);
  EXPECT_EQ(w.rdma.queue_pairs, d.rdma.queue_pairs);
  EXPECT_EQ(w.copy_max_sms, d.copy_max_sms);
}

TEST(CoordinatorOptions, BadTransportFlagsAreRefusedNamingTheFlag) {
  EXPECT_NE(refusal({"--tcp-lanes", "9"}).find("--tcp-lanes"), std::string::npos);
  EXPECT_NE(refusal({"--tcp-staging-mib", "0"}).find("--tcp-staging-mib"), std::string::npos);
  EXPECT_NE(refusal({"--net-protection", "none"}).find("--net-protection"), std::string::npos);
  EXPECT_NE(refusal({"--listen-address", "host.example"}).find("is not an IP address"),
            std::string::npos);
  EXPECT_NE(refusal({"--rdma-queue-pairs", "4"}).find("need rdma in --protocol"),
            std::string::npos);
  EXPECT_NE(refusal({"--protocol", "rdma", "--rdma-queue-pairs", "17"}).find("--rdma-queue-pairs"),
            std::string::npos);
  EXPECT_NE(refusal({"--protocol", "rdma", "--rdma-devices", "a,,b"}).find("has an empty name"),
            std::string::npos);
  EXPECT_NE(refusal({"--protocol", "rdma", "--tp-size", "2", "--rdma-devices", "a,b,c"})
                .find("names 3 devices for 2 ranks"),
            std::string::npos);
  EXPECT_NE(refusal({"--role", "decode", "--protocol", "tcp", "--tcp-ports", "7301"})
                .find("--tcp-ports needs --auth-key-file"),
            std::string::npos);
  EXPECT_NE(refusal({"--role", "decode", "--protocol", "rdma", "--rdma-ports", "7401"})
                .find("--rdma-ports needs --auth-key-file"),
            std::string::npos);
  EXPECT_NE(refusal({"--auth-key-file", "/nonexistent/kvrelay.key"}).find("--auth-key-file"),
            std::string::npos);
  // A prefill-only instance listens on nothing, so its ports need no key.
  EXPECT_EQ(refusal({"--role", "prefill", "--protocol", "tcp", "--tcp-ports", "7301"}),
            "(accepted)");
}

// Pools that do not fit /dev/shm are refused in MiB, rounded so that what
// is needed never reads like what is free ("needs 0.1 GiB ... has 0.1 GiB").
TEST(CoordinatorOptions, PoolsThatDoNotFitDevShmAreRefusedInMiB) {
  std::vector<std::string> args = {"kvrelay-coordinator", "--instance", "options-test",
                                   "--num-layers", "64", "--num-blocks", "1000000", "--kv-heads",
                                   "8", "--head-dim", "128", "--tp-size", "8"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  Result<CoordinatorOptions> o = parse_options(static_cast<int>(argv.size()), argv.data());
  ASSERT_FALSE(o) << "about 16 TiB of pools";
  const std::string why = o.error().message;
  EXPECT_NE(why.find("MiB free"), std::string::npos) << why;
  EXPECT_NE(why.find("8 ranks x "), std::string::npos) << why;
  EXPECT_EQ(why.find("GiB"), std::string::npos) << why;
  EXPECT_NE(why.find("--pool none"), std::string::npos) << "says how a GPU server avoids it: " << why;
  EXPECT_NE(why.find("--shm-size"), std::string::npos) << why;
}

// With --pool none the engine registers its own pools (a GPU's KV cache):
// /dev/shm needs room only for the host swap tier, and the instance says so.
TEST(CoordinatorOptions, WithPoolNoneOnlyTheHostTierMustFitDevShm) {
  auto parse_huge = [](std::vector<std::string> more) {
    std::vector<std::string> args = {"kvrelay-coordinator", "--instance", "options-test",
                                     "--num-layers", "64", "--kv-heads", "8", "--head-dim", "128",
                                     "--tp-size", "8", "--pool", "none"};
    args.insert(args.end(), more.begin(), more.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    return parse_options(static_cast<int>(argv.size()), argv.data());
  };
  Result<CoordinatorOptions> o = parse_huge({"--num-blocks", "1000000"});
  ASSERT_TRUE(o) << "16 TiB of GPU cache needs nothing in /dev/shm: " << o.error().message;
  EXPECT_EQ(o->config.engine_pools, 1u);
  EXPECT_EQ(pool_bytes_per_rank(o->config), 0u);

  Result<CoordinatorOptions> with_tier =
      parse_huge({"--num-blocks", "1000", "--num-host-blocks", "1000000"});
  ASSERT_FALSE(with_tier) << "the host swap tier is still the worker's, in /dev/shm";
  const std::string why = with_tier.error().message;
  EXPECT_NE(why.find("a host swap tier of 1000000 blocks"), std::string::npos) << why;
  EXPECT_EQ(why.find("device pool"), std::string::npos) << why;

  EXPECT_NE(refusal({"--pool", "gpu"}).find("--pool"), std::string::npos);
  Result<CoordinatorOptions> by_default = parse({});
  ASSERT_TRUE(by_default);
  EXPECT_EQ(by_default->config.engine_pools, 0u) << "a worker makes a host pool by default";
}

// A worker started by another supervisor (--external-workers) settles its
// flags against the instance it attached to, with the coordinator's words.
TEST(CoordinatorOptions, AWorkerRefusesWhatTheCoordinatorRefuses) {
  Result<CoordinatorOptions> o = parse({"--role", "decode", "--protocol", "ipc"});
  ASSERT_TRUE(o) << o.error().message;
  worker::NetworkOptions w;
  w.rdma.queue_pairs = 4;
  Status s = worker::settle_transport_options(o->config, w);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().message, refusal({"--role", "decode", "--rdma-queue-pairs", "4"}));
}

}  // namespace
}  // namespace kvrelay::coordinator
