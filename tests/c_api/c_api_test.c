/* The C ABI (client/include/kvrelay.h) from a C program, as an engine written
 * in C (or a CUDA host callback) would use it, against real processes: two
 * kvrelay-coordinator instances (prefill and decode, two ranks each) started
 * with fork/exec.
 *
 *   c_api_test <path to kvrelay-coordinator>
 *
 * Covers every call of the header: a byte-verified prefill->decode transfer
 * driven by layer signals, an evict and a layer-by-layer load waited on with
 * kvrelay_wait_layer, connect, cancel, register_pool, a memfd pool registered by
 * fd that a load lands in, the pool calls, and the errors a caller gets for bad
 * input. Exits 0 when every check passed; each
 * failed check prints the line and the library's last error.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvrelay.h"

static int g_failures = 0;

#define CHECK(cond)                                                                           \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      fprintf(stderr, "%s:%d: CHECK(%s) failed; last error: %s\n", __FILE__, __LINE__, #cond, \
              kvrelay_last_error());                                                          \
      ++g_failures;                                                                           \
    }                                                                                         \
  } while (0)

/* Aborts the test: later checks depend on this one. */
#define REQUIRE(cond)                                                                           \
  do {                                                                                          \
    if (!(cond)) {                                                                              \
      fprintf(stderr, "%s:%d: REQUIRE(%s) failed; last error: %s\n", __FILE__, __LINE__, #cond, \
              kvrelay_last_error());                                                            \
      ++g_failures;                                                                             \
      goto done;                                                                                \
    }                                                                                           \
  } while (0)

enum { kTp = 2, kLayers = 4, kBlocks = 32, kHostBlocks = 16, kBlockTokens = 16 };

static pid_t start_coordinator(const char* binary, const char* instance, const char* role) {
  const pid_t pid = fork();
  if (pid == 0) {
    execl(binary, binary, "--instance", instance, "--role", role, "--tp-size", "2", "--num-layers",
          "4", "--num-blocks", "32", "--num-host-blocks", "16", "--block-size", "16", "--head-dim",
          "32", "--log-level", "warn", (char*)NULL);
    perror("execl");
    _exit(127);
  }
  return pid;
}

/* SIGTERM, then the exit code (-1 if it did not exit within 30 s). */
static int stop_coordinator(pid_t pid) {
  if (pid <= 0) return -1;
  kill(pid, SIGTERM);
  for (int i = 0; i < 3000; ++i) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid)
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    usleep(10 * 1000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  return -1;
}

/* The byte pattern of (rank, layer, tensor, index within the request, offset). */
static uint8_t pattern(uint32_t seed, uint32_t rank, uint32_t layer, uint32_t tensor,
                       uint32_t index, size_t offset) {
  return (uint8_t)(seed * 131u + rank * 71u + layer * 31u + tensor * 17u + index * 7u +
                   (uint32_t)offset * 3u + 1u);
}

static void fill(kvrelay_pool* pool, uint32_t seed, uint32_t rank, const uint32_t* blocks,
                 size_t n) {
  for (uint32_t l = 0; l < kLayers; ++l)
    for (uint32_t t = 0; t < 2; ++t)
      for (size_t i = 0; i < n; ++i) {
        void* data = NULL;
        size_t bytes = 0;
        if (kvrelay_pool_block(pool, l, (kvrelay_tensor)t, blocks[i], &data, &bytes) != KVRELAY_OK)
          continue;
        for (size_t o = 0; o < bytes; ++o)
          ((uint8_t*)data)[o] = pattern(seed, rank, l, t, (uint32_t)i, o);
      }
}

static void poison(kvrelay_pool* pool, uint32_t layer, const uint32_t* blocks, size_t n) {
  for (uint32_t t = 0; t < 2; ++t)
    for (size_t i = 0; i < n; ++i) {
      void* data = NULL;
      size_t bytes = 0;
      if (kvrelay_pool_block(pool, layer, (kvrelay_tensor)t, blocks[i], &data, &bytes) ==
          KVRELAY_OK)
        memset(data, 0xEE, bytes);
    }
}

/* Bytes of layer `layer` of `blocks` that do not hold the pattern. */
static size_t wrong_bytes(kvrelay_pool* pool, uint32_t seed, uint32_t rank, uint32_t layer,
                          const uint32_t* blocks, size_t n) {
  size_t wrong = 0;
  for (uint32_t t = 0; t < 2; ++t)
    for (size_t i = 0; i < n; ++i) {
      void* data = NULL;
      size_t bytes = 0;
      if (kvrelay_pool_block(pool, layer, (kvrelay_tensor)t, blocks[i], &data, &bytes) !=
          KVRELAY_OK)
        return (size_t)-1;
      for (size_t o = 0; o < bytes; ++o)
        wrong += ((uint8_t*)data)[o] != pattern(seed, rank, layer, t, (uint32_t)i, o);
    }
  return wrong;
}

/* Waits for the completion of `id`; completions of other ids are an error
 * here, since this program runs one request at a time. */
static int wait_for(kvrelay_client* c, const char* id, kvrelay_completion* out) {
  const kvrelay_status s = kvrelay_wait(c, 20000, out);
  if (s != KVRELAY_OK) {
    fprintf(stderr, "no completion for %s: %s (%s)\n", id, kvrelay_status_name(s),
            kvrelay_last_error());
    return 0;
  }
  if (strcmp(out->request_id, id) != 0) {
    fprintf(stderr, "expected the completion of %s, got one of %s\n", id, out->request_id);
    return 0;
  }
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s <kvrelay-coordinator>\n", argv[0]);
    return 2;
  }
  char prefill_name[64], decode_name[64];
  snprintf(prefill_name, sizeof prefill_name, "capi-%d-p", (int)getpid());
  snprintf(decode_name, sizeof decode_name, "capi-%d-d", (int)getpid());

  kvrelay_client* prefill = NULL;
  kvrelay_client* decode = NULL;
  kvrelay_pool* src[kTp] = {NULL, NULL};
  kvrelay_pool* dst[kTp] = {NULL, NULL};
  kvrelay_pool* host[kTp] = {NULL, NULL};
  kvrelay_completion done;

  /* ---- errors before any instance exists ---- */
  kvrelay_client* none = NULL;
  CHECK(kvrelay_attach(NULL, 0, &none) == KVRELAY_INVALID_ARGUMENT);
  CHECK(strstr(kvrelay_last_error(), "instance") != NULL);
  CHECK(kvrelay_attach("capi-no-such-instance", -1, &none) == KVRELAY_INVALID_ARGUMENT);
  CHECK(strstr(kvrelay_last_error(), "negative") != NULL);
  CHECK(kvrelay_attach("capi-no-such-instance", 0, &none) == KVRELAY_NOT_FOUND);
  CHECK(none == NULL);
  CHECK(kvrelay_attach("bad/name", 0, &none) == KVRELAY_INVALID_ARGUMENT);
  CHECK(strcmp(kvrelay_status_name(KVRELAY_FULL), "ring full") == 0);
  CHECK(kvrelay_request_tag("req-1") != 0);
  CHECK(kvrelay_request_tag("req-1") == kvrelay_request_tag("req-1"));

  const pid_t decode_pid = start_coordinator(argv[1], decode_name, "decode");
  const pid_t prefill_pid = start_coordinator(argv[1], prefill_name, "prefill");
  REQUIRE(kvrelay_attach(decode_name, 30000, &decode) == KVRELAY_OK);
  REQUIRE(kvrelay_attach(prefill_name, 30000, &prefill) == KVRELAY_OK);
  CHECK(kvrelay_tp_size(prefill) == kTp);
  CHECK(kvrelay_rank_ready(prefill, 0) == 1 && kvrelay_rank_ready(prefill, 1) == 1);
  CHECK(kvrelay_rank_ready(prefill, 7) == 0);
  /* One completion reader per instance: this client is it; a second is refused, naming it. */
  CHECK(kvrelay_own_completions(prefill) == KVRELAY_OK);
  {
    kvrelay_client* second = NULL;
    REQUIRE(kvrelay_attach(prefill_name, 30000, &second) == KVRELAY_OK);
    CHECK(kvrelay_own_completions(second) == KVRELAY_BUSY);
    CHECK(strstr(kvrelay_last_error(), "already read") != NULL);
    kvrelay_detach(second);
  }

  /* ---- pools ---- */
  for (uint32_t r = 0; r < kTp; ++r) {
    REQUIRE(kvrelay_open_pool(prefill, r, 0, &src[r]) == KVRELAY_OK);
    REQUIRE(kvrelay_open_pool(decode, r, 0, &dst[r]) == KVRELAY_OK);
    REQUIRE(kvrelay_open_pool(prefill, r, 1, &host[r]) == KVRELAY_OK);
  }
  kvrelay_pool_geometry g;
  kvrelay_pool_get_geometry(src[0], &g);
  CHECK(g.num_layers == kLayers && g.num_blocks == kBlocks && g.block_size == kBlockTokens);
  CHECK(g.head_dim == 32 && g.tensors_per_layer == 2 && g.dtype == 0);
  kvrelay_pool_get_geometry(host[0], &g);
  CHECK(g.num_blocks == kHostBlocks);
  {
    void* data = NULL;
    size_t bytes = 0;
    CHECK(kvrelay_pool_block(src[0], 0, KVRELAY_KEY, 0, &data, &bytes) == KVRELAY_OK);
    CHECK(bytes == (size_t)kBlockTokens * 32 * 2); /* one head, bfloat16 */
    CHECK(kvrelay_pool_block(src[0], 0, KVRELAY_KEY, kBlocks, &data, &bytes) ==
          KVRELAY_INVALID_ARGUMENT);
    CHECK(strstr(kvrelay_last_error(), "32 blocks") != NULL);
    CHECK(kvrelay_pool_block(src[0], 0, KVRELAY_KEY_SCALE, 0, &data, &bytes) ==
          KVRELAY_INVALID_ARGUMENT);
  }
  kvrelay_pool* missing_pool = NULL;
  CHECK(kvrelay_open_pool(prefill, 9, 0, &missing_pool) != KVRELAY_OK);

  /* ---- a prefill->decode transfer driven by layer signals ---- */
  {
    const uint32_t src_blocks[3] = {3, 8, 21};
    const uint32_t dst_blocks[3] = {30, 1, 12};
    const uint64_t tokens = 3 * kBlockTokens - 5; /* a partial last block */
    for (uint32_t r = 0; r < kTp; ++r) {
      fill(src[r], 1, r, src_blocks, 3);
      for (uint32_t l = 0; l < kLayers; ++l)
        poison(dst[r], l, dst_blocks, 3);
    }
    const uint32_t devices[kTp] = {0, 1};
    CHECK(kvrelay_submit_cache_dest(prefill, "c-req-1", dst_blocks, 3, KVRELAY_IPC, decode_name,
                                    NULL, NULL, 0, devices, kTp, NULL, 5000) == KVRELAY_OK);
    CHECK(kvrelay_submit_cache_task(prefill, "c-req-1", src_blocks, 3, tokens, 0, 0, 0, 5000) ==
          KVRELAY_OK);
    const kvrelay_batch_slot slot = {0, 0, (uint32_t)tokens, kvrelay_request_tag("c-req-1")};
    for (uint32_t r = 0; r < kTp; ++r) {
      CHECK(kvrelay_own_signals(prefill, r) == KVRELAY_OK); /* outside any callback */
      CHECK(kvrelay_push_batch(prefill, r, 0, &slot, 1, 5000) == KVRELAY_OK);
      for (uint32_t l = 0; l < kLayers; ++l)
        CHECK(kvrelay_push_layer_done(prefill, r, 0, l, 5000) == KVRELAY_OK);
    }
    REQUIRE(wait_for(prefill, "c-req-1", &done));
    CHECK(done.status == KVRELAY_FINISHED);
    CHECK(done.kind == KVRELAY_KIND_CACHE);
    CHECK(done.error_rank == -1);
    CHECK(done.blocks_reusable == 1);
    CHECK(done.bytes_moved == (uint64_t)kTp * kLayers * 2 * 3 * kBlockTokens * 32 * 2);
    CHECK(done.completed_ns >= done.submitted_ns && done.submitted_ns > 0);
    for (uint32_t r = 0; r < kTp; ++r)
      for (uint32_t l = 0; l < kLayers; ++l)
        CHECK(wrong_bytes(dst[r], 1, r, l, dst_blocks, 3) == 0);
  }

  /* ---- the legacy per-query mode ---- */
  {
    const uint32_t src_blocks[2] = {5, 6};
    const uint32_t dst_blocks[2] = {7, 9};
    for (uint32_t r = 0; r < kTp; ++r) {
      fill(src[r], 2, r, src_blocks, 2);
      for (uint32_t l = 0; l < kLayers; ++l)
        poison(dst[r], l, dst_blocks, 2);
    }
    /* Without a device id per rank the half is refused at once. */
    CHECK(kvrelay_submit_cache_dest(prefill, "c-legacy", dst_blocks, 2, KVRELAY_IPC, decode_name,
                                    NULL, NULL, 0, NULL, 0, "", 5000) == KVRELAY_INVALID_ARGUMENT);
    CHECK(strstr(kvrelay_last_error(), "device_ids") != NULL);
    const uint32_t devices[kTp] = {0, 1};
    CHECK(kvrelay_submit_cache_dest(prefill, "c-legacy", dst_blocks, 2, KVRELAY_IPC, decode_name,
                                    NULL, NULL, 0, devices, kTp, "", 5000) == KVRELAY_OK);
    CHECK(kvrelay_submit_cache_task(prefill, "c-legacy", src_blocks, 2, 2 * kBlockTokens, -1, 100,
                                    0, 5000) == KVRELAY_OK);
    for (uint32_t r = 0; r < kTp; ++r)
      CHECK(kvrelay_push_legacy_layer_done(prefill, r, 100, kLayers - 1, 5000) == KVRELAY_OK);
    REQUIRE(wait_for(prefill, "c-legacy", &done));
    CHECK(done.status == KVRELAY_FINISHED);
    for (uint32_t r = 0; r < kTp; ++r)
      for (uint32_t l = 0; l < kLayers; ++l)
        CHECK(wrong_bytes(dst[r], 2, r, l, dst_blocks, 2) == 0);
  }

  /* ---- the decode side refused: the request fails with its text ---- */
  {
    const uint32_t blocks[1] = {2};
    const uint32_t devices[kTp] = {0, 1};
    CHECK(kvrelay_submit_cache_dest(prefill, "c-refused", blocks, 1, KVRELAY_IPC, decode_name, NULL,
                                    NULL, 0, devices, kTp, "decode ran out of blocks",
                                    5000) == KVRELAY_OK);
    REQUIRE(wait_for(prefill, "c-refused", &done));
    CHECK(done.status == KVRELAY_FAILED);
    CHECK(strstr(done.message, "decode ran out of blocks") != NULL);
  }

  /* ---- swap: evict, then load layer by layer ---- */
  {
    const uint32_t dev_blocks[3] = {10, 11, 25};
    const uint32_t host_blocks[3] = {15, 0, 4};
    for (uint32_t r = 0; r < kTp; ++r)
      fill(src[r], 3, r, dev_blocks, 3);
    CHECK(kvrelay_submit_swap(prefill, "c-evict", 0, dev_blocks, host_blocks, 3, 0, 0, 0, 5000) ==
          KVRELAY_OK);
    REQUIRE(wait_for(prefill, "c-evict", &done));
    CHECK(done.status == KVRELAY_FINISHED && done.kind == KVRELAY_KIND_SWAP);
    for (uint32_t r = 0; r < kTp; ++r)
      for (uint32_t l = 0; l < kLayers; ++l) {
        CHECK(wrong_bytes(host[r], 3, r, l, host_blocks, 3) == 0);
        poison(src[r], l, dev_blocks, 3);
      }
    CHECK(kvrelay_submit_swap(prefill, "c-load", 1, dev_blocks, host_blocks, 3, 0, 0, 0, 5000) ==
          KVRELAY_OK);
    for (uint32_t l = 0; l < kLayers; ++l) {
      CHECK(kvrelay_wait_layer(prefill, "c-load", l, -1, 10000) == KVRELAY_OK);
      for (uint32_t r = 0; r < kTp; ++r)
        CHECK(wrong_bytes(src[r], 3, r, l, dev_blocks, 3) == 0);
    }
    CHECK(kvrelay_wait_layer(prefill, "c-load", 0, 1, 1000) == KVRELAY_OK);
    CHECK(kvrelay_wait_layer(prefill, "c-load", kLayers + 3, -1, 1000) == KVRELAY_INVALID_ARGUMENT);
    REQUIRE(wait_for(prefill, "c-load", &done));
    CHECK(done.status == KVRELAY_FINISHED);
    /* A bad swap: more device ids than host ids is refused before submission. */
    CHECK(kvrelay_submit_swap(prefill, "c-bad-swap", 1, dev_blocks, NULL, 3, 0, 0, 0, 1000) !=
          KVRELAY_OK);
  }
  /* ---- the same, declared on the decode side by its sender and a nonce ---- */
  {
    const uint32_t src_blocks[2] = {4, 9};
    const uint32_t dst_blocks[2] = {31, 2};
    const uint64_t tokens = 2 * kBlockTokens;
    for (uint32_t r = 0; r < kTp; ++r) {
      fill(src[r], 2, r, src_blocks, 2);
      for (uint32_t l = 0; l < kLayers; ++l)
        poison(dst[r], l, dst_blocks, 2);
    }
    const uint64_t nonce = kvrelay_random_nonce();
    CHECK(nonce != 0 && nonce != kvrelay_random_nonce());
    CHECK(kvrelay_expect_arrival_from(decode, "c-req-2", dst_blocks, 2, 0, prefill_name, nonce,
                                      5000) == KVRELAY_OK);
    const uint32_t devices[kTp] = {0, 1};
    CHECK(kvrelay_submit_cache_dest_nonce(prefill, "c-req-2", dst_blocks, 2, KVRELAY_IPC,
                                          decode_name, NULL, NULL, 0, devices, kTp, NULL, nonce,
                                          5000) == KVRELAY_OK);
    CHECK(kvrelay_submit_cache_task(prefill, "c-req-2", src_blocks, 2, tokens, 1, 0, 0, 5000) ==
          KVRELAY_OK);
    const kvrelay_batch_slot slot = {1, 0, (uint32_t)tokens, kvrelay_request_tag("c-req-2")};
    for (uint32_t r = 0; r < kTp; ++r) {
      CHECK(kvrelay_push_batch(prefill, r, 1, &slot, 1, 5000) == KVRELAY_OK);
      for (uint32_t l = 0; l < kLayers; ++l)
        CHECK(kvrelay_push_layer_done(prefill, r, 1, l, 5000) == KVRELAY_OK);
    }
    REQUIRE(wait_for(prefill, "c-req-2", &done));
    CHECK(done.status == KVRELAY_FINISHED);
    REQUIRE(wait_for(decode, "c-req-2", &done));
    CHECK(done.kind == KVRELAY_KIND_ARRIVED);
    CHECK(done.status == KVRELAY_FINISHED);
    for (uint32_t r = 0; r < kTp; ++r)
      for (uint32_t l = 0; l < kLayers; ++l)
        CHECK(wrong_bytes(dst[r], 2, r, l, dst_blocks, 2) == 0);
  }

  /* ---- connect, cancel, register_pool ---- */
  CHECK(kvrelay_connect(prefill, 42, KVRELAY_IPC, decode_name, NULL, NULL, 0, 5000) == KVRELAY_OK);
  REQUIRE(wait_for(prefill, "connect-42", &done));
  CHECK(done.kind == KVRELAY_KIND_CONNECT && done.status == KVRELAY_FINISHED);

  CHECK(kvrelay_cancel(prefill, "c-never-submitted", 5000) == KVRELAY_OK);
  {
    /* Expected requests are declared to the decode instance only. */
    const uint32_t expected[2] = {1, 2};
    CHECK(kvrelay_expect_arrival(prefill, "c-expect", expected, 2, 0, 5000) ==
          KVRELAY_INVALID_ARGUMENT);
    CHECK(strstr(kvrelay_last_error(), "declare an expected request to the decode instance") !=
          NULL);
    CHECK(kvrelay_expect_arrival(decode, NULL, expected, 2, 0, 5000) == KVRELAY_INVALID_ARGUMENT);
  }
  REQUIRE(wait_for(prefill, "c-never-submitted", &done));
  CHECK(done.status == KVRELAY_REJECTED);
  CHECK(done.message[0] != '\0');

  CHECK(kvrelay_register_pool(prefill, 0, 0, "capi-no-such-segment", 5000) == KVRELAY_OK);
  REQUIRE(kvrelay_wait(prefill, 20000, &done) == KVRELAY_OK);
  CHECK(done.kind == KVRELAY_KIND_REGISTER_POOL);
  CHECK(done.status != KVRELAY_FINISHED);
  CHECK(strstr(done.message, "capi-no-such-segment") != NULL);

  /* ---- host memory the engine brings in memfds, registered by fd ---- */
  {
    /* Each rank's pool in one memfd, its tensors back to back, layer-major. */
    kvrelay_pool_geometry g;
    kvrelay_pool_get_geometry(src[0], &g);
    void* block0 = NULL;
    size_t block_bytes = 0;
    REQUIRE(kvrelay_pool_block(src[0], 0, KVRELAY_KEY, 0, &block0, &block_bytes) == KVRELAY_OK);
    const uint32_t n_tensors = (g.num_layers + g.extra_layers) * g.tensors_per_layer;
    REQUIRE(g.extra_layers == 0 && g.tensors_per_layer == 2);
    const uint64_t tensor_bytes = (uint64_t)g.num_blocks * block_bytes;
    const uint64_t pool_bytes = n_tensors * tensor_bytes;
    int fds[kTp] = {-1, -1};
    unsigned char* memfd_pools[kTp] = {NULL, NULL};
    kvrelay_tensor_placement placements[2 * kLayers];
    for (uint32_t t = 0; t < n_tensors; ++t) {
      placements[t].memory = 0;
      placements[t].reserved = 0;
      placements[t].offset = t * tensor_bytes;
    }
    for (uint32_t r = 0; r < kTp; ++r) {
      fds[r] = memfd_create("capi-kv", MFD_ALLOW_SEALING);
      REQUIRE(fds[r] >= 0 && ftruncate(fds[r], (off_t)pool_bytes) == 0);
      REQUIRE(fcntl(fds[r], F_ADD_SEALS, F_SEAL_SHRINK) == 0);
      memfd_pools[r] = mmap(NULL, pool_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[r], 0);
      REQUIRE(memfd_pools[r] != MAP_FAILED);
      const kvrelay_pool_memory memory = {fds[r], 0, pool_bytes};
      CHECK(kvrelay_register_host_fd_pool(prefill, r, 0, &memory, 1, placements, n_tensors,
                                          5000) == KVRELAY_OK);
      REQUIRE(kvrelay_wait(prefill, 20000, &done) == KVRELAY_OK);
      CHECK(done.kind == KVRELAY_KIND_REGISTER_POOL);
      REQUIRE(done.status == KVRELAY_FINISHED);
    }
    /* A load from the host tier (still holding "c-evict"'s blocks) lands in
     * the memfds, in the requested blocks only (a memfd starts zeroed). */
    const uint32_t dev_blocks[3] = {10, 11, 25};
    const uint32_t host_blocks[3] = {15, 0, 4};
    CHECK(kvrelay_submit_swap(prefill, "c-load-memfd", 1, dev_blocks, host_blocks, 3, 0, 0, 0,
                              5000) == KVRELAY_OK);
    REQUIRE(wait_for(prefill, "c-load-memfd", &done));
    CHECK(done.status == KVRELAY_FINISHED);
    for (uint32_t r = 0; r < kTp; ++r)
      for (uint32_t t = 0; t < n_tensors; ++t) {
        const unsigned char* tensor = memfd_pools[r] + placements[t].offset;
        for (uint32_t i = 0; i < 3; ++i) {
          void* expected = NULL;
          size_t bytes = 0;
          CHECK(kvrelay_pool_block(host[r], t / 2, (kvrelay_tensor)(t % 2), host_blocks[i],
                                   &expected, &bytes) == KVRELAY_OK);
          CHECK(bytes == block_bytes &&
                memcmp(tensor + dev_blocks[i] * block_bytes, expected, bytes) == 0);
        }
        const unsigned char* untouched = tensor + 12 * block_bytes;
        CHECK(untouched[0] == 0 && memcmp(untouched, untouched + 1, block_bytes - 1) == 0);
      }
    /* Wrong input is refused at once, saying what is wrong: a reserved field
     * set, no memories, a memfd too small for its tensors. */
    const kvrelay_pool_memory bad_reserved = {fds[0], 7, pool_bytes};
    CHECK(kvrelay_register_host_fd_pool(prefill, 0, 0, &bad_reserved, 1, placements, n_tensors,
                                        5000) == KVRELAY_INVALID_ARGUMENT);
    CHECK(strstr(kvrelay_last_error(), "reserved") != NULL);
    CHECK(kvrelay_register_host_fd_pool(prefill, 0, 0, NULL, 1, placements, n_tensors, 5000) ==
          KVRELAY_INVALID_ARGUMENT);
    const kvrelay_pool_memory too_small = {fds[0], 0, pool_bytes / 2};
    CHECK(kvrelay_register_host_fd_pool(prefill, 0, 0, &too_small, 1, placements, n_tensors,
                                        5000) == KVRELAY_INVALID_ARGUMENT);
    CHECK(strstr(kvrelay_last_error(), "tensors[4] (layer 2 K) needs bytes") != NULL);
    for (uint32_t r = 0; r < kTp; ++r) {
      munmap(memfd_pools[r], pool_bytes);
      close(fds[r]);
    }
  }

  /* ---- bad input gets an error at once; nothing is submitted ---- */
  CHECK(kvrelay_push_layer_done(prefill, kTp, 0, 0, 0) == KVRELAY_INVALID_ARGUMENT);
  CHECK(kvrelay_push_layer_done(prefill, 0, 0, 0, -5) == KVRELAY_INVALID_ARGUMENT);
  CHECK(kvrelay_push_batch(prefill, 0, 1, NULL, 3, 0) == KVRELAY_INVALID_ARGUMENT);
  CHECK(kvrelay_submit_cache_task(prefill, NULL, NULL, 0, 0, 0, 0, 0, 0) ==
        KVRELAY_INVALID_ARGUMENT);
  CHECK(kvrelay_submit_cache_task(NULL, "x", NULL, 0, 0, 0, 0, 0, 0) == KVRELAY_INVALID_ARGUMENT);
  CHECK(kvrelay_wait(prefill, 0, &done) == KVRELAY_TIMEOUT);
  {
    int has = 1;
    CHECK(kvrelay_poll(prefill, &done, &has) == KVRELAY_OK && has == 0);
  }

done:
  for (uint32_t r = 0; r < kTp; ++r) {
    kvrelay_close_pool(src[r]);
    kvrelay_close_pool(dst[r]);
    kvrelay_close_pool(host[r]);
  }
  kvrelay_detach(prefill);
  kvrelay_detach(decode);
  CHECK(stop_coordinator(prefill_pid) == 0);
  CHECK(stop_coordinator(decode_pid) == 0);
  if (g_failures == 0) printf("c_api_test: every check passed\n");
  return g_failures == 0 ? 0 : 1;
}
