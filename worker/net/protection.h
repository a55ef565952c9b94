// How a network session is protected once both sides have proved the key
// (session_seal.h). Both sides must run the same; a header of its own so
// that the options (net_options.h) name it without the wire format.
#pragma once

#include <cstdint>

namespace kvrelay::worker::net {

enum class Protection : uint8_t {
  kAuthenticate = 1,  // every byte authenticated (AES-GCM tags over plaintext)
  kEncrypt = 2,       // every byte encrypted and authenticated (AES-GCM)
};

inline const char* protection_name(Protection p) {
  switch (p) {
    case Protection::kAuthenticate: return "authenticate";
    case Protection::kEncrypt: return "encrypt";
  }
  return "unknown";
}

}  // namespace kvrelay::worker::net
