// A coordinator run by systemd (Type=notify) tells it when the instance
// serves and when it drains, over $NOTIFY_SOCKET: a real coordinator process
// and a datagram socket standing in for systemd.
#include <gtest/gtest.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "support/instance.h"
#include "support/processes.h"

namespace kvrelay::testing {
namespace {

using namespace std::chrono_literals;

// The next datagram within `within`, or "" if none came.
std::string next_datagram(int fd, std::chrono::milliseconds within) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, static_cast<int>(within.count())) <= 0) return "";
  char buf[512];
  const ssize_t n = recv(fd, buf, sizeof(buf), 0);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

TEST(ServiceNotify, TheServiceManagerHearsReadyOnceTheInstanceServesAndStoppingWhenItDrains) {
  const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string name = "kvrelay-notify-test-" + std::to_string(getpid());
  std::memcpy(addr.sun_path + 1, name.data(), name.size());  // abstract, like systemd's
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr),
                 static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size())),
            0);
  ASSERT_EQ(setenv("NOTIFY_SOCKET", ("@" + name).c_str(), 1), 0);
  InstanceArgs a;
  a.instance = unique_instance("notify");
  a.tp = 2;
  auto inst = Instance::start(a);
  unsetenv("NOTIFY_SOCKET");
  const std::string ready = next_datagram(fd, 30s);
  EXPECT_EQ(ready.rfind("READY=1\n", 0), 0u) << ready;
  EXPECT_NE(ready.find("STATUS=instance '" + a.instance + "' serving, 2 ranks"), std::string::npos)
      << ready;
  EXPECT_EQ(inst->stop(), 0);
  const std::string stopping = next_datagram(fd, 5s);
  EXPECT_EQ(stopping.rfind("STOPPING=1\n", 0), 0u) << stopping;
  close(fd);
}

}  // namespace
}  // namespace kvrelay::testing
