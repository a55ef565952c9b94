// An engine's view of kvrelay: this program is compiled with client/include
// as its only kvrelay include directory and linked against libkvrelay.so
// alone, so it builds only while the public headers are self-contained. It
// then uses what it compiled against, on a real instance:
//
//   public_engine_test <path to kvrelay-coordinator>
//
// starts a one-rank instance with a host tier (fork/exec), reads its
// InstanceInfo, writes KV bytes through a PoolView, evicts them to the host
// tier and loads them back layer by layer, and checks every byte and the
// errors a caller gets for bad input. Exits 0 when every check passed.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kvrelay/client.h"

namespace {

using namespace std::chrono_literals;

int g_failures = 0;

#define CHECK(cond)                                                                 \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
      ++g_failures;                                                                 \
    }                                                                               \
  } while (0)

constexpr uint32_t kLayers = 3;
constexpr uint32_t kBlocks = 16;
constexpr uint32_t kHostBlocks = 8;

pid_t start_coordinator(const char* binary, const std::string& instance) {
  const pid_t pid = fork();
  if (pid == 0) {
    execl(binary, binary, "--instance", instance.c_str(), "--tp-size", "1", "--num-layers", "3",
          "--num-blocks", "16", "--num-host-blocks", "8", "--block-size", "16", "--head-dim", "32",
          "--log-level", "warn", static_cast<char*>(nullptr));
    std::perror("execl");
    _exit(127);
  }
  return pid;
}

int stop_coordinator(pid_t pid) {
  kill(pid, SIGTERM);
  int status = 0;
  for (int i = 0; i < 3000; ++i) {
    if (waitpid(pid, &status, WNOHANG) == pid)
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::this_thread::sleep_for(10ms);
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}

std::byte pattern(uint32_t layer, uint32_t tensor, uint32_t block, size_t offset) {
  return static_cast<std::byte>(layer * 31 + tensor * 17 + block * 7 + offset % 251);
}

// Fills (kind 0) or checks (kind 1) `blocks` of every layer and tensor of
// `pool` against the pattern of `source_blocks`; returns the wrong bytes.
size_t fill_or_check(const kvrelay::PoolView& pool, const std::vector<uint32_t>& blocks,
                     const std::vector<uint32_t>& source_blocks, bool check) {
  const kvrelay::PoolGeometry& g = pool.geometry();
  size_t wrong = 0;
  for (uint32_t l = 0; l < g.total_layers(); ++l) {
    for (uint32_t t = 0; t < g.tensors_per_layer(); ++t) {
      const auto tensor = static_cast<kvrelay::PoolTensor>(t);
      for (size_t i = 0; i < blocks.size(); ++i) {
        std::byte* p = pool.block(l, tensor, blocks[i]);
        if (p == nullptr) return SIZE_MAX;
        for (size_t o = 0; o < g.block_bytes(tensor); ++o) {
          const std::byte want = pattern(l, t, source_blocks[i], o);
          if (!check)
            p[o] = want;
          else if (p[o] != want)
            ++wrong;
        }
      }
    }
  }
  return wrong;
}

kvrelay::Completion next_completion(kvrelay::Client& engine) {
  kvrelay::Result<kvrelay::Completion> c = engine.wait(kvrelay::Deadline::after(20s));
  if (!c) {
    std::fprintf(stderr, "no completion: %s\n", c.error().message.c_str());
    ++g_failures;
    return {};
  }
  return std::move(c).value();
}

void run(kvrelay::Client& engine) {
  const kvrelay::InstanceInfo& info = engine.info();
  CHECK(info.tp_size == 1);
  CHECK(info.role == kvrelay::Role::kMixed);
  CHECK(info.device_pool.num_layers == kLayers);
  CHECK(info.device_pool.num_blocks == kBlocks);
  CHECK(info.host_pool.num_blocks == kHostBlocks);
  CHECK(info.accepts_ipc);
  CHECK(info.request_deadline_ms > 0);

  kvrelay::Result<kvrelay::PoolView> device = engine.open_pool(0, kvrelay::PoolTier::kDevice);
  kvrelay::Result<kvrelay::PoolView> host = engine.open_pool(0, kvrelay::PoolTier::kHost);
  CHECK(device.ok() && host.ok());
  if (!device || !host) return;
  CHECK(device->geometry() == info.device_pool);
  CHECK(host->geometry() == info.host_pool);
  CHECK(device->check_intact().ok());
  CHECK(device->block(kLayers, kvrelay::PoolTensor::kKey, 0) == nullptr);
  CHECK(device->block(0, kvrelay::PoolTensor::kKey, kBlocks) == nullptr);
  CHECK(engine.open_pool(1, kvrelay::PoolTier::kDevice).code() != kvrelay::Errc::kOk);

  const std::vector<uint32_t> device_blocks = {3, 9, 4};
  const std::vector<uint32_t> host_blocks = {0, 5, 2};
  CHECK(fill_or_check(*device, device_blocks, device_blocks, false) == 0);

  kvrelay::SwapSpec evict;
  evict.request_id = "evict-1";
  evict.device_block_ids = device_blocks;
  evict.host_block_ids = host_blocks;
  CHECK(engine.submit(evict, kvrelay::Deadline::after(5s)).ok());
  const kvrelay::Completion evicted = next_completion(engine);
  CHECK(evicted.request_id == "evict-1");
  CHECK(evicted.status == kvrelay::CompletionStatus::kFinished);
  CHECK(fill_or_check(*host, host_blocks, device_blocks, true) == 0);

  // Load into other device blocks, waiting for each layer as a forward pass
  // would.
  const std::vector<uint32_t> load_blocks = {10, 11, 12};
  kvrelay::SwapSpec load;
  load.request_id = "load-1";
  load.load = true;
  load.device_block_ids = load_blocks;
  load.host_block_ids = host_blocks;
  CHECK(engine.submit(load, kvrelay::Deadline::after(5s)).ok());
  for (uint32_t l = 0; l < kLayers; ++l)
    CHECK(engine.wait_layer("load-1", l, kvrelay::Deadline::after(10s)).ok());
  CHECK(engine.wait_layer("load-1", kLayers, kvrelay::Deadline::now()).code() ==
        kvrelay::Errc::kInvalidArgument);
  const kvrelay::Completion loaded = next_completion(engine);
  CHECK(loaded.request_id == "load-1");
  CHECK(loaded.status == kvrelay::CompletionStatus::kFinished);
  CHECK(loaded.bytes_moved > 0);
  CHECK(fill_or_check(*device, load_blocks, device_blocks, true) == 0);

  // Bad input: refused with a message, nothing submitted.
  kvrelay::SwapSpec bad = evict;
  bad.request_id = "bad";
  bad.host_block_ids = {kHostBlocks};
  const kvrelay::Status refused = engine.submit(bad, kvrelay::Deadline::after(1s));
  CHECK(refused.code() == kvrelay::Errc::kInvalidArgument);
  CHECK(!refused.error().message.empty());
  CHECK(engine.poll().ok() && !engine.poll()->has_value());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <path to kvrelay-coordinator>\n", argv[0]);
    return 2;
  }
  const std::string instance = "public-engine-" + std::to_string(getpid());
  const pid_t coordinator = start_coordinator(argv[1], instance);
  {
    kvrelay::Result<kvrelay::Client> engine =
        kvrelay::Client::attach(instance, kvrelay::Deadline::after(30s));
    if (!engine) {
      std::fprintf(stderr, "attach: %s (%s)\n", engine.error().message.c_str(),
                   std::string(kvrelay::errc_name(engine.code())).c_str());
      ++g_failures;
    } else {
      run(*engine);
    }
  }
  CHECK(stop_coordinator(coordinator) == 0);
  if (g_failures == 0) std::printf("public_engine_test: every check passed\n");
  return g_failures == 0 ? 0 : 1;
}
