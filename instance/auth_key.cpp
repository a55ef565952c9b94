#include "instance/auth_key.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace kvrelay {

Result<AuthKey> AuthKey::load(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0)
    return make_error(Errc::kInvalidArgument, fmt::format("cannot open the auth key file {}: {}",
                                                          path, std::strerror(errno)));
  struct stat st {};
  std::vector<uint8_t> bytes;
  Status status;
  if (::fstat(fd, &st) != 0) {
    status = make_error(Errc::kSystem, fmt::format("fstat {}: {}", path, std::strerror(errno)));
  } else if (!S_ISREG(st.st_mode)) {
    status = make_error(Errc::kInvalidArgument,
                        fmt::format("the auth key file {} is not a regular file", path));
  } else if (st.st_uid != ::geteuid()) {
    status = make_error(Errc::kPermissionDenied,
                        fmt::format("the auth key file {} belongs to uid {}, not to this user "
                                    "(uid {})",
                                    path, st.st_uid, ::geteuid()));
  } else if ((st.st_mode & 077) != 0) {
    status = make_error(Errc::kPermissionDenied,
                        fmt::format("the auth key file {} has mode {:03o}: group and others must "
                                    "not read it (chmod 600 {})",
                                    path, st.st_mode & 0777, path));
  } else if (st.st_size < static_cast<off_t>(kMinKeyBytes) ||
             st.st_size > static_cast<off_t>(kMaxKeyBytes)) {
    status = make_error(Errc::kInvalidArgument,
                        fmt::format("the auth key file {} has {} bytes; a key has {} to {} (make "
                                    "one with: head -c 32 /dev/urandom > {})",
                                    path, st.st_size, kMinKeyBytes, kMaxKeyBytes, path));
  } else {
    bytes.resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < bytes.size()) {
      const ssize_t n = ::read(fd, bytes.data() + got, bytes.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        status = make_error(Errc::kSystem, fmt::format("reading the auth key file {}: {}", path,
                                                       n < 0 ? std::strerror(errno) : "short"));
        break;
      }
      got += static_cast<size_t>(n);
    }
  }
  ::close(fd);
  if (!status) return status.error();
  return AuthKey(std::move(bytes));
}

Mac hmac_sha256(std::span<const uint8_t> key, std::string_view label,
                std::initializer_list<std::span<const uint8_t>> parts) {
  std::vector<uint8_t> input(label.begin(), label.end());
  for (std::span<const uint8_t> p : parts)
    input.insert(input.end(), p.begin(), p.end());
  Mac out{};
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), input.data(), input.size(),
           out.data(), &len) == nullptr ||
      len != out.size())
    throw std::runtime_error("HMAC-SHA256 failed");  // OpenSSL without SHA-256: unusable
  return out;
}

Mac AuthKey::mac(std::string_view label,
                 std::initializer_list<std::span<const uint8_t>> parts) const {
  return hmac_sha256(key_, label, parts);
}

bool AuthKey::verify(std::string_view label, std::initializer_list<std::span<const uint8_t>> parts,
                     std::span<const uint8_t> proof) const {
  if (proof.size() != kMacBytes) return false;
  const Mac expected = mac(label, parts);
  return CRYPTO_memcmp(expected.data(), proof.data(), kMacBytes) == 0;
}

Nonce random_nonce() {
  Nonce n{};
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1)
    throw std::runtime_error("RAND_bytes failed");
  return n;
}

}  // namespace kvrelay
