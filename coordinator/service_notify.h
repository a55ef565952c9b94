// Tells a service manager (systemd, Type=notify) how the instance stands:
// READY=1 once every rank has lined up, STOPPING=1 when it starts to drain,
// each with a STATUS= line for `systemctl status`. Without $NOTIFY_SOCKET
// (not run by systemd) it does nothing. The protocol is one datagram on a
// Unix socket (sd_notify(3)); no library is needed for it.
#pragma once

#include <string>

namespace kvrelay::coordinator {

// Sends `state` (e.g. "READY=1\nSTATUS=...") to $NOTIFY_SOCKET; false if
// there is none or it could not be reached (logged once at debug level).
bool notify_service_manager(const std::string& state);

}  // namespace kvrelay::coordinator
