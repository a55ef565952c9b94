// The engine simulator: drives a prefill instance and a decode instance the
// way an inference engine would, and checks every byte that arrives.
//
// Per step it schedules up to `batch` requests into engine slots, each
// prefilling a chunk of its prompt; for every layer it "computes" (waits
// layer_compute_us and writes the layer's KV pattern into the source blocks
// the chunk touched) and then signals the layer. Source blocks start out
// poisoned, so a layer copied before its signal is caught by the
// verification. Some requests hit the decode side's prefix cache (their
// destination list is shorter), some send their decode half late (after
// their prefill has finished). Each completion is checked: every destination
// byte of every layer, tensor and rank, and the destination blocks must have
// been untouched (poisoned) when the request got them, which catches writes
// outside a request's destinations.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "kvrelay/client.h"
#include "shm/counters.h"

namespace kvrelay::sim {

struct SimOptions {
  uint32_t requests = 128;
  uint32_t batch = 8;           // slots prefilling per step
  uint32_t chunk_tokens = 512;  // chunked prefill: tokens per request per step; 0: whole prompt
  uint32_t min_tokens = 256;
  uint32_t max_tokens = 2048;
  uint32_t layer_compute_us = 300;
  double prefix_hit_rate = 0.25;
  double late_dest_rate = 0.1;
  uint32_t late_dest_steps = 3;
  bool legacy = false;  // the original's per-query mode: (step, layer) signals
  // The baseline of layer-wise transfer: every layer's signal is pushed only
  // after the step's last layer is computed (send after prefill).
  bool send_after_prefill = false;
  uint64_t seed = 1;
  bool progress = false;  // draw a progress bar on stderr
  bool trace = false;     // print each request's submit / prefilled / completion times on stderr
  std::chrono::seconds timeout{600};
  // Soak mode: SIGKILL a random worker (of either instance) this often; 0: never.
  uint32_t kill_every_ms = 0;
  // Soak mode: the run fails unless at least this many requests finish. A
  // soak whose kills fail every request proves nothing about the transfers
  // that survive them (every byte of a finished request is verified).
  uint32_t min_finished = 0;
  // How the blocks travel: ipc (same host), or tcp or rdma to the decode
  // instance's listeners (its --tcp-ports or --rdma-ports, read from its
  // configuration) at peer_address.
  bool tcp = false;
  bool rdma = false;
  std::string peer_address = "127.0.0.1";
  // The decode engine declares each request to its instance before the
  // prefill engine submits it (ExpectSpec), and must read exactly one
  // `arrived` completion per request; a request's destination blocks are
  // handed back only once both completions are in.
  bool expect_arrivals = false;
  // Tests the simulator's own verification: writes one wrong word where
  // kvrelay never writes, and the run must fail naming it.
  //   kStray:   into a free destination block, just before the second
  //             request takes it (the check before its first layer signal)
  //   kCorrupt: into the first finished request's first destination block
  //             on decode rank 0, before its bytes are checked
  enum class Fault { kNone, kStray, kCorrupt };
  Fault inject_fault = Fault::kNone;
};

struct SimReport {
  uint32_t requests = 0;
  uint32_t finished = 0;
  uint32_t failed = 0;  // error / timeout / cancelled completions
  uint32_t failed_naming_a_rank =
      0;  // errors that name the rank that failed (expected under kills)
  uint32_t timeouts = 0;
  uint32_t kills = 0;
  // Soak: ranks (either instance) whose worker was not ready again once the
  // kills stopped, each "rank R of 'instance'": the supervisor gave it up.
  std::vector<std::string> ranks_not_back;
  uint32_t missing_or_extra = 0;  // requests without exactly one completion (each side)
  uint32_t arrived = 0;           // expect_arrivals: `arrived` completions that finished
  uint64_t bytes = 0;
  double seconds = 0;
  uint64_t wrong_words = 0;            // bytes that differ from what was sent, in 8-byte words
  uint64_t stray_blocks = 0;           // destination blocks found written before they were used
  // Nanoseconds. From the workers' histograms (within 1.6%):
  Quantiles signal_to_copy;  // layer signal read -> that layer's copy done
  Quantiles layer_copy;      // one layer's copy of one request's chunk
  // The completion path's hops, over every signal and report of the run
  // (docs/latency.md): the engine's push of a layer signal -> its worker's
  // read, a report's write -> the coordinator's read, that read -> the
  // completion written. 0 where the prefill instance was not readable.
  Quantiles signal_wake;
  Quantiles report_hop;
  Quantiles publish_hop;
  // The tail of each request, the same way: the signal that let its last
  // layer go pushed -> each rank's finished report written, and the report
  // that finished it written -> the coordinator's read.
  Quantiles tail_to_report;
  Quantiles tail_report_hop;
  // expect_arrivals over ipc, the decode side's tail: a prefill worker's
  // landed record -> the decode rank's read (every record), the last landed
  // write of a request -> each decode rank's arrived report, the report that
  // completed it -> the decode coordinator's read, that read -> `arrived`
  // written. 0 where the decode instance was not readable, or over tcp.
  Quantiles landed_wake;
  Quantiles arrival_tail_to_report;
  Quantiles arrival_tail_report_hop;
  Quantiles arrival_publish_hop;
  // Exact, from the engine's side: last layer computed -> completion read
  // (decode half on time).
  Quantiles exposed;
  // expect_arrivals: last layer computed -> the decode side's `arrived`
  // completion (declared before the prefill ended).
  Quantiles exposed_arrival;
  std::string first_error;
  bool soak = false;
  uint32_t min_finished = 0;  // soak: fewer finished requests fail the run
  bool timed_out = false;  // the run itself hit its timeout: something hung
  bool aborted = false;    // the run stopped early: an instance is gone, a pool was truncated
  bool expect_arrivals = false;
  bool ok() const {
    const bool clean =
        missing_or_extra == 0 && wrong_words == 0 && stray_blocks == 0 && !timed_out && !aborted;
    // Under kills, requests in flight on a killed rank fail, naming it.
    if (soak)
      return clean && failed == failed_naming_a_rank && finished + failed == requests &&
             finished >= min_finished && ranks_not_back.empty();
    return clean && finished == requests && failed == 0 &&
           (!expect_arrivals || arrived == requests);
  }
  std::string summary() const;
};

// Runs the simulation against two attached instances (same geometry).
SimReport run_simulation(const SimOptions& options, Client& prefill, Client& decode,
                         const std::string& prefill_instance, const std::string& decode_instance);

}  // namespace kvrelay::sim
