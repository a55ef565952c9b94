// The flags every network transport shares: where listeners bind, the
// pre-shared key, and how sessions are protected. Declared here once for
// both programs (transport_options.h): kvrelay-coordinator checks them and
// hands them on, kvrelay-worker reads them.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "instance/instance_config.h"
#include "shm/result.h"
#include "worker/net/protection.h"

namespace CLI {
class App;
}

namespace kvrelay::worker::net {

struct NetOptions {
  std::string listen_address = "127.0.0.1";
  std::string auth_key_file;  // empty: no network transport can run
  Protection protection = Protection::kAuthenticate;
};

void declare_options(CLI::App& app, NetOptions& options);
// Checks what the command line alone cannot: an address that parses, a key
// file that loads (its path made absolute, so a worker started elsewhere
// reads the same file).
Status settle_options(const InstanceConfig& config, NetOptions& options);
void hand_on(const NetOptions& options, std::vector<std::string>& args);

// For a transport's own settle_options: a rank that listens (one of `ports`
// set, not prefill-only) must authenticate its peers, so it needs the key.
// `ports_flag` names the transport's port flag in the refusal.
Status require_key_to_listen(const InstanceConfig& config, const NetOptions& options,
                             std::span<const uint16_t> ports, const char* ports_flag);

}  // namespace kvrelay::worker::net
