#include "worker/net/net_options.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <boost/asio/ip/address.hpp>
#include <algorithm>
#include <filesystem>

#include "instance/auth_key.h"

namespace kvrelay::worker::net {

void declare_options(CLI::App& app, NetOptions& o) {
  app.add_option("--listen-address", o.listen_address,
                 "address the decode ranks' tcp and rdma listeners bind (with --tcp-ports or "
                 "--rdma-ports)")
      ->capture_default_str();
  app.add_option("--auth-key-file", o.auth_key_file,
                 "pre-shared key of the network transports, both roles: a 0600 file of 32 random "
                 "bytes (docs/transports.md: Cross-host transfer)");
  app.add_option_function<std::string>(
         "--net-protection",
         [&o](const std::string& name) {
           o.protection = name == "encrypt" ? Protection::kEncrypt : Protection::kAuthenticate;
         },
         "tcp and rdma sessions, once the key is proved: authenticate (every byte carries an "
         "AES-GCM tag; readable on the wire) or encrypt (and encrypted); both instances must "
         "agree (docs/transports.md: Cross-host transfer)")
      ->check(CLI::IsMember({"authenticate", "encrypt"}))
      ->default_str("authenticate");
}

Status settle_options(const InstanceConfig&, NetOptions& o) {
  boost::system::error_code ec;
  boost::asio::ip::make_address(o.listen_address, ec);
  if (ec)
    return make_error(Errc::kInvalidArgument,
                      fmt::format("--listen-address '{}' is not an IP address", o.listen_address));
  if (o.auth_key_file.empty()) return {};
  o.auth_key_file = std::filesystem::absolute(o.auth_key_file).string();
  Result<AuthKey> key = AuthKey::load(o.auth_key_file);
  if (!key) return make_error(key.code(), "--auth-key-file: " + key.error().message);
  return {};
}

Status require_key_to_listen(const InstanceConfig& config, const NetOptions& o,
                             std::span<const uint16_t> ports, const char* ports_flag) {
  const bool receives = config.role != static_cast<uint32_t>(Role::kPrefill);
  const bool listens = std::any_of(ports.begin(), ports.end(), [](uint16_t p) { return p != 0; });
  if (receives && listens && o.auth_key_file.empty())
    return make_error(Errc::kInvalidArgument,
                      fmt::format("{} needs --auth-key-file: a listener must authenticate its "
                                  "peers (docs/transports.md: Cross-host transfer)",
                                  ports_flag));
  return {};
}

void hand_on(const NetOptions& o, std::vector<std::string>& args) {
  args.insert(args.end(), {"--listen-address", o.listen_address, "--net-protection",
                           protection_name(o.protection)});
  if (!o.auth_key_file.empty()) args.insert(args.end(), {"--auth-key-file", o.auth_key_file});
}

}  // namespace kvrelay::worker::net
